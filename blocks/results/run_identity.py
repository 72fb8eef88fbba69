"""Who is running: the current task run or flow run, as a readable name."""

from __future__ import annotations

from typing import Any


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
