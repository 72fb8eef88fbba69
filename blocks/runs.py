"""The run some code runs in (a task run and its attempt, a flow run, or neither), read from Prefect's context once."""

from __future__ import annotations

import threading
from typing import NamedTuple

from prefect_cudf_polars.blocks.errors import OUTSIDE_RUNS


class RunIdentity(NamedTuple):
    """
    The run some code runs in.

    Attributes
    ----------
    name : str
        ``"task run 'trips' (id ...)"``, ``"flow run 'brave-fox' (id ...)"``, or
        ``"code outside any Prefect run"``.
    run_id : str
        The task run's id (a retried task run keeps it), else the flow run's;
        outside any run, the thread's (each thread is a reader of its own).
    task_run_id : str or None
        The task run's id, ``None`` outside a task run.
    attempt : int
        The task run's attempt (Prefect's ``run_count``: 1, then 2 on its first retry); 0 outside a task run.
    """

    name: str
    run_id: str
    task_run_id: str | None
    attempt: int = 0


def current_run() -> RunIdentity:
    """The current task run or, in a flow body, flow run (Prefect's run context; not the engine session)."""
    from prefect.context import FlowRunContext, TaskRunContext

    if (run := getattr(TaskRunContext.get(), "task_run", None)) is not None:
        return RunIdentity(f"task run {run.name!r} (id {run.id})", str(run.id), str(run.id), run.run_count)
    if (run := getattr(FlowRunContext.get(), "flow_run", None)) is not None:
        return RunIdentity(f"flow run {run.name!r} (id {run.id})", str(run.id), None)
    return RunIdentity(OUTSIDE_RUNS, f"thread {threading.get_ident()}", None)
