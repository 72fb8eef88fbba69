"""Who is running: the current task run or flow run, as a readable name."""

from __future__ import annotations

from typing import Any, NamedTuple


class RunIdentity(NamedTuple):
    """
    The run some code runs in, read from Prefect's context once.

    Attributes
    ----------
    name : str
        As :func:`current_run_name` gives it.
    run_id : str or None
        As :func:`current_run_id` gives it.
    task_run_id : uuid.UUID or None
        As :func:`current_task_run_id` gives it.
    """

    name: str
    run_id: str | None
    task_run_id: Any


#: Outside any Prefect run.
NO_RUN = RunIdentity("code outside any Prefect run", None, None)


def current_run() -> RunIdentity:
    """
    The current task run or flow run: its readable name and ids, in one context lookup.

    Returns
    -------
    RunIdentity
        The task run's, inside a task run; else the flow run's (``task_run_id``
        ``None``); else :data:`NO_RUN`.
    """
    from prefect.context import FlowRunContext, TaskRunContext

    task_ctx = TaskRunContext.get()
    if task_ctx is not None and task_ctx.task_run is not None:
        run = task_ctx.task_run
        return RunIdentity(f"task run {run.name!r} (id {run.id})", str(run.id), run.id)
    flow_ctx = FlowRunContext.get()
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        run = flow_ctx.flow_run
        return RunIdentity(f"flow run {run.name!r} (id {run.id})", str(run.id), None)
    return NO_RUN


def current_run_name() -> str:
    """
    Name the task run or flow run this code runs in.

    Returns
    -------
    str
        ``"task run 'execute-3f1' (id ...)"``, ``"flow run 'brave-fox' (id ...)"``,
        or ``"code outside any Prefect run"``.
    """
    from prefect.context import FlowRunContext, TaskRunContext

    task_ctx = TaskRunContext.get()
    if task_ctx is not None and task_ctx.task_run is not None:
        return f"task run {task_ctx.task_run.name!r} (id {task_ctx.task_run.id})"
    flow_ctx = FlowRunContext.get()
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        return f"flow run {flow_ctx.flow_run.name!r} (id {flow_ctx.flow_run.id})"
    return "code outside any Prefect run"


def current_run_id() -> str | None:
    """
    Id of the task run or flow run this code runs in.

    Returns
    -------
    str or None
        The task run's id (a UUID as text) inside a task run, else the flow
        run's, else ``None``. A retried task run keeps its id across attempts,
        which is how a retry recognises the inputs its earlier attempt read.
    """
    from prefect.context import FlowRunContext, TaskRunContext

    task_ctx = TaskRunContext.get()
    if task_ctx is not None and task_ctx.task_run is not None:
        return str(task_ctx.task_run.id)
    flow_ctx = FlowRunContext.get()
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        return str(flow_ctx.flow_run.id)
    return None


def current_task_run_id() -> Any:
    """
    Id of the task run this code runs in.

    Returns
    -------
    uuid.UUID or None
        ``None`` outside a task run (a flow body, or no Prefect run at all).
    """
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    return ctx.task_run.id if ctx is not None and ctx.task_run is not None else None
