"""
Deferred steps: what a deferred result holds, and how a failed engine call names the steps it ran.

A deferred step (``gpu_task(defer=True)``, ``execute(lf, defer=True)``) runs
nothing: its result holds the step's plan and the inputs that plan reads
(:class:`HeldPlan`), and its reader's one engine call runs the plans of every
deferred step before it, fused (:class:`FusedStep` names each, upstream first).
See docs/deferred-steps.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import polars as pl

from prefect_cudf_polars.blocks.backends.engine_errors import iter_exceptions
from prefect_cudf_polars.blocks.errors import SessionError


class FusedStep(NamedTuple):
    """
    A deferred step whose plan ran inside another task run's engine call.

    Attributes
    ----------
    name : str
        The deferred result's name (the step's task name).
    produced_by : str
        The task run (or flow run) that deferred it, as a readable name.
    task_run_id : str or None
        That task run's id (``None`` when deferred outside a task run).
    """

    name: str
    produced_by: str
    task_run_id: str | None


class HeldPlan(NamedTuple):
    """What a deferred result holds: its plan, its schema, the inputs the plan reads, its steps (its own last)."""

    plan: pl.LazyFrame
    schema: pl.Schema
    held_inputs: tuple[Any, ...]  # the GPUResults the plan reads
    steps: tuple[FusedStep, ...]


def fused_note(exc: BaseException, steps: Sequence[FusedStep]) -> str | None:
    """The note a failed engine call's error gets when it ran deferred steps (none when its session ended)."""
    if not steps or any(isinstance(e, SessionError) for e in iter_exceptions(exc)):
        return None
    named = ", ".join(f"{step.name!r} ({step.produced_by})" for step in steps)
    return (f"This engine call ran the query with {len(steps)} deferred step(s) fused in, upstream first: "
            f"{named}. The error may come from the query or from any of those steps; run them without "
            "defer=True to see which one fails.")


