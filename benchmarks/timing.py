"""
Timed runs of variants, interleaved round by round, within the command's time budget.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.stats import median_ci


class Budget:
    """
    Wall-clock budget of one benchmark command.

    Parameters
    ----------
    seconds
        Seconds from now until the budget is spent.
    """

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def spent(self) -> bool:
        """Whether no time is left."""
        return time.monotonic() >= self.deadline


class BudgetSpentError(RuntimeError):
    """The command's time budget was spent before this measurement started."""


@dataclass
class RunOutcome:
    """One timed run of a variant: its ``seconds``, its final ``result`` and its seconds per step."""

    seconds: float
    result: Any = None
    steps_s: dict[str, float] = field(default_factory=dict)


@dataclass
class Timing:
    """
    The runs of one variant.

    Attributes
    ----------
    runs_s, warmup_s : list of float
        Seconds of each timed run and of each untimed warm-up run, in order.
    steps_s : dict of str to list of float
        Seconds of each step in each timed run, where the variant times its steps.
    cut_short : bool
        The budget was spent before every asked run was done.
    result : object
        The last run's final result (for the correctness check).
    """

    runs_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    steps_s: dict[str, list[float]] = field(default_factory=dict)
    cut_short: bool = False
    result: Any = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, in seconds: ``median_s``, ``ci_s`` (95 %, or ``None``), ``min_s``, the runs, step medians."""
        return {
            "median_s": statistics.median(self.runs_s) if self.runs_s else None,
            "ci_s": median_ci(self.runs_s),
            "min_s": min(self.runs_s, default=None),
            "runs_s": self.runs_s,
            "warmup_s": self.warmup_s,
            "steps_median_s": {k: statistics.median(v) for k, v in self.steps_s.items() if v},
            "cut_short": self.cut_short,
        }


def interleave(
    variants: dict[str, Callable[[], RunOutcome]], *, runs: int, warmups: int, budget: Budget
) -> dict[str, Timing | BaseException]:
    """
    Run the variants round-robin: ``warmups`` untimed rounds, then ``runs`` timed ones.

    Each round calls every variant once, in order, so that a drift of the
    machine touches every variant alike; a garbage collection runs before each
    call, outside the timing. A variant that raises leaves the later rounds.
    Once the budget is spent no new round starts, but one timed round always
    runs (``cut_short`` is then set).

    Parameters
    ----------
    variants
        Name to a callable that runs the variant once and times itself (on the
        thread it runs on).
    runs, warmups
        Timed and untimed rounds.
    budget
        The command's budget.

    Returns
    -------
    dict
        Name to its :class:`Timing`, or to the exception that stopped it
        (:class:`BudgetSpentError` for all when the budget was spent before the first call).
    """
    if budget.spent():
        spent = BudgetSpentError("the command's time budget (--budget-s) was spent")
        return {name: spent for name in variants}
    timings = {name: Timing() for name in variants}
    failed: dict[str, BaseException] = {}
    for round_index in range(warmups + runs):
        timed = round_index >= warmups
        if round_index != warmups and budget.spent():  # a spent budget skips all but one timed round
            if not timed:
                continue
            for timing in timings.values():
                timing.cut_short = True
            break
        for name in [n for n in variants if n not in failed]:
            gc.collect()
            try:
                outcome = variants[name]()
            except Exception as exc:  # this variant stops; the others go on
                failed[name] = exc
                continue
            timing = timings[name]
            if not timed:
                timing.warmup_s.append(outcome.seconds)
                continue
            timing.runs_s.append(outcome.seconds)
            timing.result = outcome.result
            for step, seconds in outcome.steps_s.items():
                timing.steps_s.setdefault(step, []).append(seconds)
    return {name: failed.get(name, timings[name]) for name in variants}
