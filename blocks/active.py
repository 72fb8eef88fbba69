"""
Which engine session is active here: in a flow body or any of its task threads.

The innermost **session provider** of the current context wins. There are two kinds:

* an :class:`~prefect_cudf_polars.blocks.EngineSession` entered with
  ``with block.session():`` in a flow body;
* a :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner`, which Prefect
  enters for each flow run (and each subflow run that has one) before the
  run's context exists; it opens its session at the first GPU call inside
  the run.

Entering a provider sets :data:`SESSION_PROVIDER`, a context variable, and
leaving it puts back the one that was there, so a subflow with its own runner
sees its own session and its parent sees the parent's again after it. Prefect
copies the context into every task thread at ``submit`` and runs each
``asyncio.gather``-ed subflow in a task of its own, so each task run sees the
provider of its own flow run.

This module sits below everything that needs the answer (results check it
before a claim), so it names neither the session nor the task runner class:
it knows providers through :class:`SessionProvider`.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any, Protocol

from prefect_cudf_polars.blocks.errors import NoEngineSessionError

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.session.session import EngineSession

NO_SESSION_MESSAGE = (
    "No cudf-polars engine session is active {where}. Give the flow "
    "one: `@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(...)))`, or "
    "open one in the flow body: `with CudfPolarsEngine.load('name').session():`. "
    "GPU tasks must run inside that flow run, on its thread-pool task runner."
)


def no_session_message() -> str:
    """:data:`NO_SESSION_MESSAGE` for where it is raised: in a flow run, or outside any."""
    from prefect.context import FlowRunContext

    in_flow_run = FlowRunContext.get() is not None
    return NO_SESSION_MESSAGE.format(
        where="for this flow run" if in_flow_run else "here, and no flow run is running"
    )


class SessionProvider(Protocol):
    """What a session provider offers: its session, opened on demand, and the futures it serves."""

    @property
    def provided_session(self) -> EngineSession | None:
        """The provider's session if it is open now (never opens one)."""
        ...

    def provide_session(self) -> EngineSession:
        """
        The provider's open session, opening it on first use.

        Raises
        ------
        SessionError
            When the session has ended, or cannot be opened here.
        Exception
            Whatever opening the engine raised (the same error on every call).
        """
        ...

    def serve(self, future: Any) -> None:
        """Keep the session open for a task run submitted under it (a Prefect future)."""
        ...


#: The innermost session provider of this context (``None``: none).
SESSION_PROVIDER: contextvars.ContextVar[SessionProvider | None] = contextvars.ContextVar(
    "prefect_cudf_polars_session_provider", default=None
)


def enter_provider(provider: SessionProvider) -> contextvars.Token[SessionProvider | None]:
    """Make ``provider`` the innermost one here; returns the token for :func:`leave_provider`."""
    return SESSION_PROVIDER.set(provider)


def leave_provider(token: contextvars.Token[SessionProvider | None], provider: SessionProvider) -> None:
    """Put back the provider that was innermost before ``provider`` was entered with ``token``."""
    try:
        SESSION_PROVIDER.reset(token)
    except ValueError:  # left from another context than the one it was entered in
        if SESSION_PROVIDER.get() is provider:
            SESSION_PROVIDER.set(token.old_value if token.old_value is not token.MISSING else None)


def innermost_provider() -> SessionProvider | None:
    """
    The innermost session provider here, or ``None``.

    When the context variable holds none, the current flow run's task runner
    is used if it is a provider (a context Prefect built without ours).
    """
    provider = SESSION_PROVIDER.get()
    if provider is not None:
        return provider
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None) if ctx is not None else None
    return runner if hasattr(runner, "provide_session") else None


def active_session_or_none() -> EngineSession | None:
    """
    The innermost provider's session if it is open now, or ``None`` (opens nothing).

    Returns
    -------
    EngineSession or None
    """
    provider = innermost_provider()
    return provider.provided_session if provider is not None else None


def serve_future(future: Any) -> None:
    """Tell the innermost provider that ``future`` (a Prefect future) is a GPU task run it serves."""
    provider = innermost_provider()
    if provider is not None:
        provider.serve(future)


def get_engine_session() -> EngineSession:
    """
    Return the engine session of the current flow run, opening its engine at first use.

    Works in a flow body and in its task threads (thread-pool task runner).
    With :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner` the first
    call in a flow run starts the engine; the first call from inside a flow
    run writes the session's start line (backend, GPUs, versions) to that
    flow run's log.

    Returns
    -------
    EngineSession
        Open; its engine runs queries.

    Raises
    ------
    NoEngineSessionError
        If no session is active here: the flow neither uses
        ``CudfPolarsTaskRunner`` nor opens ``with block.session():``.
    SessionError
        If the session here has ended (the error names it), or a subflow's
        session cannot share its parent's GPU (the error names both runs).
    LookupError
        If the task runner names a saved block that does not exist.
    NoGPUError
        If the block asks for a GPU backend and no usable GPU is here.
    Exception
        Whatever else the engine raised when it could not start; every later
        call in the flow run raises the same error.
    """
    provider = innermost_provider()
    if provider is None:
        raise NoEngineSessionError(no_session_message())
    session = provider.provide_session()
    session.announce()
    return session
