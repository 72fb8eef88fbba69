"""
Which engine session is active here: in a flow body or any of its task threads.

Two ways make a session active:

* ``with block.session():`` in a flow body sets :data:`ACTIVE_SESSION`, a
  context variable; Prefect's thread-pool task runner copies the flow's context
  into each task thread.
* :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner` holds a session for
  the flow run; Prefect keeps the runner as ``FlowRunContext.task_runner``, and
  the runner shows its session as ``engine_session``.

This module sits below everything that needs the answer (results check it
before a claim), so it names neither the session nor the task runner class.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from prefect_cudf_polars.blocks.errors import NoEngineSessionError

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.session.session import EngineSession

#: The session entered with ``with block.session():`` in this context.
ACTIVE_SESSION: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "prefect_cudf_polars_session", default=None
)

NO_SESSION_MESSAGE = (
    "No cudf-polars engine session is active for this flow run. Give the flow "
    "one: `@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(...)))`, or "
    "open one in the flow body: `with CudfPolarsEngine.load('name').session():`. "
    "GPU tasks must run inside that flow run, on its thread-pool task runner."
)


def active_session_or_none() -> EngineSession | None:
    """
    The active, open session here, or ``None``.

    Returns
    -------
    EngineSession or None
    """
    from prefect.context import FlowRunContext

    session = ACTIVE_SESSION.get()
    if session is not None and not session.closed:
        return session
    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None) if ctx is not None else None
    session = getattr(runner, "engine_session", None)
    if session is not None and not session.closed:
        return session
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
        raise NoEngineSessionError(NO_SESSION_MESSAGE)
    session.announce()
    return session
