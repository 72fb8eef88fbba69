"""
Find the engine session of the current flow run, from any task thread.

Two ways make a session active:

* ``with block.session():`` in a flow body sets a context variable; Prefect's
  thread-pool task runner copies the flow's context into each task thread.
* :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner` opens a session for
  the flow run and is reachable as ``FlowRunContext.task_runner``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_cudf_polars.tasks.errors import NoEngineSessionError

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.session import EngineSession


def active_session_or_none() -> EngineSession | None:
    """The active, open session here, or ``None``."""
    from prefect.context import FlowRunContext

    from prefect_cudf_polars.blocks.session import ACTIVE_SESSION
    from prefect_cudf_polars.blocks.task_runner import CudfPolarsTaskRunner

    session = ACTIVE_SESSION.get()
    if session is not None and not session.closed:
        return session
    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None) if ctx is not None else None
    if isinstance(runner, CudfPolarsTaskRunner) and runner.session is not None:
        if not runner.session.closed:
            return runner.session
    return None


def get_engine_session() -> EngineSession:
    """
    Return the engine session active for the current flow run.

    Works in a flow body and in its task threads (thread-pool task runner).
    The first call from inside a flow run writes the session's start line
    (backend, GPUs, versions) to that flow run's log.

    Returns
    -------
    EngineSession
        Open; its engine runs queries.

    Raises
    ------
    NoEngineSessionError
        If no session is active here: the flow neither uses
        ``CudfPolarsTaskRunner`` nor opens ``with block.session():``, or the
        flow run that had one has ended.
    """
    session = active_session_or_none()
    if session is None:
        raise NoEngineSessionError(
            "No cudf-polars engine session is active for this flow run. Give the flow "
            "one: `@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(...)))`, or "
            "open one in the flow body: `with CudfPolarsEngine.load('name').session():`. "
            "GPU tasks must run inside that flow run, on its thread-pool task runner."
        )
    session.announce()
    return session
