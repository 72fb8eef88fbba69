"""
Repeat a measured call: warm-ups, then timed runs, median; stop early when the time budget is spent.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Budget:
    """
    Wall-clock budget of one benchmark command.

    Parameters
    ----------
    seconds
        Seconds from now until the budget is spent.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()

    def left(self) -> float:
        """Seconds left (negative once spent)."""
        return self.seconds - (time.monotonic() - self.started)

    def spent(self) -> bool:
        """Whether no time is left."""
        return self.left() <= 0


class BudgetSpentError(RuntimeError):
    """The command's time budget was spent before this measurement started."""


@dataclass
class RunOutcome:
    """What one timed call of a variant returns."""

    seconds: float
    result: Any = None
    steps_s: dict[str, float] = field(default_factory=dict)


@dataclass
class Timing:
    """
    Timings of one variant.

    Attributes
    ----------
    runs_s : list of float
        Seconds of each timed run, in order.
    warmup_s : list of float
        Seconds of each warm-up run (not in the median).
    steps_s : dict of str to list of float
        Per-step seconds of each timed run, where the variant times its steps.
    cut_short : bool
        Fewer runs than asked were done because the budget was spent.
    result : object
        The last run's result (for the correctness check).
    """

    runs_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    steps_s: dict[str, list[float]] = field(default_factory=dict)
    cut_short: bool = False
    result: Any = None

    @property
    def median_s(self) -> float | None:
        """Median of the timed runs (seconds), ``None`` with no run."""
        return statistics.median(self.runs_s) if self.runs_s else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the result itself is left out)."""
        return {
            "median_s": self.median_s,
            "min_s": min(self.runs_s) if self.runs_s else None,
            "runs_s": self.runs_s,
            "warmup_s": self.warmup_s,
            "steps_median_s": {k: statistics.median(v) for k, v in self.steps_s.items() if v},
            "cut_short": self.cut_short,
        }


def repeat(
    run_once: Callable[[], RunOutcome], *, runs: int, warmups: int, budget: Budget
) -> Timing:
    """
    Call ``run_once`` ``warmups`` times, then ``runs`` times, timing each.

    A garbage collection runs before every call, outside the timing. Once the
    budget is spent, no further call starts, but at least one timed run is
    always done (``cut_short`` is then set).

    Parameters
    ----------
    run_once
        Runs the variant once and returns its :class:`RunOutcome` (the variant
        times itself, so that a Prefect flow can time inside its own run).
    runs, warmups
        Timed runs and warm-up runs.
    budget
        The command's budget.

    Returns
    -------
    Timing

    Raises
    ------
    BudgetSpentError
        If the budget is spent before the first call.
    Exception
        Whatever ``run_once`` raises.
    """
    if budget.spent():
        raise BudgetSpentError("the command's time budget (--budget-s) was spent")
    timing = Timing()
    for _ in range(warmups):
        gc.collect()
        timing.warmup_s.append(run_once().seconds)
        if budget.spent():
            break
    for _ in range(runs):
        if timing.runs_s and budget.spent():
            timing.cut_short = True
            break
        gc.collect()
        outcome = run_once()
        timing.runs_s.append(outcome.seconds)
        timing.result = outcome.result
        for name, seconds in outcome.steps_s.items():
            timing.steps_s.setdefault(name, []).append(seconds)
    return timing


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, fn())`` with ``time.perf_counter``."""
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value
