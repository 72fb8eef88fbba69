"""
Timed runs of variants, interleaved round by round: warm-ups, then timed runs, median; stop early when the time budget is spent.
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


#: What :func:`interleave` gives for each variant: its timings, or the error that stopped it.
Outcome = Timing | BaseException


def interleave(
    variants: dict[str, Callable[[], RunOutcome]],
    *,
    runs: int,
    warmups: int,
    budget: Budget,
) -> dict[str, Outcome]:
    """
    Run the variants round-robin: each round calls every variant once, in order.

    ``warmups`` untimed rounds come first, then ``runs`` timed rounds, so that a
    drift of the machine (clocks, Prefect's background work, other processes)
    touches every variant alike. A garbage collection runs before every call,
    outside the timing. A variant that raises is left out of the later rounds
    and the others go on. Once the budget is spent, no new round starts, but at
    least one timed round always runs (``cut_short`` is then set).

    Parameters
    ----------
    variants
        Name to a callable that runs the variant once and returns its
        :class:`RunOutcome` (each variant times itself, so that it can time on
        the thread it runs on, or inside a Prefect flow run).
    runs, warmups
        Timed rounds and untimed warm-up rounds.
    budget
        The command's budget.

    Returns
    -------
    dict
        Name to its :class:`Timing`, or to the exception that stopped it:
        :class:`BudgetSpentError` for every variant when the budget was spent
        before the first call.
    """
    if budget.spent():
        spent = BudgetSpentError("the command's time budget (--budget-s) was spent")
        return {name: spent for name in variants}
    timings = {name: Timing() for name in variants}
    failed: dict[str, BaseException] = {}

    def call(name: str, timed_run: bool) -> None:
        gc.collect()
        try:
            outcome = variants[name]()
        except Exception as exc:  # this variant stops; the others go on
            failed[name] = exc
            return
        timing = timings[name]
        if not timed_run:
            timing.warmup_s.append(outcome.seconds)
            return
        timing.runs_s.append(outcome.seconds)
        timing.result = outcome.result
        for step, seconds in outcome.steps_s.items():
            timing.steps_s.setdefault(step, []).append(seconds)

    def live() -> list[str]:
        return [name for name in variants if name not in failed]

    for _ in range(warmups):
        for name in live():
            call(name, timed_run=False)
        if budget.spent():
            break
    for round_index in range(runs):
        if round_index and budget.spent():
            for name in live():
                timings[name].cut_short = True
            break
        for name in live():
            call(name, timed_run=True)
    return {name: failed.get(name, timings[name]) for name in variants}


def outcome_value(outcome: Outcome) -> Timing:
    """The :class:`Timing` of an :func:`interleave` outcome; raises the error it holds instead."""
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, fn())`` with ``time.perf_counter``."""
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value
