"""
Which session provider is innermost here (one context variable), and :func:`get_engine_session`, its session.

A **session provider** is what opens a flow run's engine session on demand:
a :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner` (Prefect enters it
for each flow run that uses it, before the run's context exists) or an
:class:`~prefect_cudf_polars.blocks.EngineSession` entered with
``with block.session():`` in a flow body. Entering one sets :data:`PROVIDER`;
leaving it puts back the one that was there, so a subflow with its own runner
sees its own provider and its parent sees the parent's again after it. Prefect
copies the context into every task thread at ``submit``, so each task run sees
the provider of its own flow run.

This module sits below the session and the task runner and names neither: it
knows them through :class:`SessionProvider`. Results never look here.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Protocol

from prefect_cudf_polars.blocks.errors import NO_SESSION_MESSAGE, NoEngineSessionError


class SessionProvider(Protocol):
    """What a session provider offers: its session (opened on demand) and the task runs it serves."""

    @property
    def provided_session(self) -> Any:
        """The provider's session while it is open, else ``None`` (never opens one)."""

    def provide_session(self) -> Any:
        """The provider's open session, opening it at first use (see ``get_engine_session``)."""

    def serve(self, future: Any) -> None:
        """Keep the session open for the task run of ``future`` (a Prefect future)."""


#: The innermost session provider of this context (``None``: none).
PROVIDER: contextvars.ContextVar[SessionProvider | None] = contextvars.ContextVar(
    "prefect_cudf_polars_session_provider", default=None)


def enter(provider: SessionProvider) -> contextvars.Token[SessionProvider | None]:
    """Make ``provider`` the innermost one here; returns the token for :func:`leave`."""
    return PROVIDER.set(provider)


def leave(token: contextvars.Token[SessionProvider | None], provider: SessionProvider) -> None:
    """Put back the provider that was innermost before ``provider`` was entered with ``token``."""
    try:
        PROVIDER.reset(token)
    except ValueError:  # left from another context than the one it was entered in
        if PROVIDER.get() is provider:
            PROVIDER.set(None if token.old_value is token.MISSING else token.old_value)


def flow_run_context() -> Any:
    """Prefect's ``FlowRunContext`` here when it runs a flow run, else ``None``."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return ctx if ctx is not None and ctx.flow_run is not None else None


def innermost() -> SessionProvider | None:
    """
    The innermost session provider here, or ``None``.

    When the context variable holds none, the current flow run's task runner
    is used if it is a provider (a context Prefect built without ours).
    """
    if (provider := PROVIDER.get()) is not None:
        return provider
    runner = getattr(flow_run_context(), "task_runner", None)
    return runner if hasattr(runner, "provide_session") else None


class ServedRuns:
    """
    The task runs a ``with block.session():`` serves, which its end waits for (thread-safe).

    A GPU task submitted inside the with block runs on the flow's task runner,
    in a thread of its own; the block's exit must not end the session under
    it. Each future a GPU task's ``submit`` or ``map`` returns there is added
    here and leaves when its task run reaches a final state.
    """

    def __init__(self) -> None:
        self._pending: set[Any] = set()
        self._changed = threading.Condition()
        self._closed = False

    def add(self, future: Any) -> None:
        """Keep ``future`` until its task run ends (``PrefectFuture.add_done_callback``); none after :meth:`wait`."""
        with self._changed:
            if self._closed:
                return
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Any) -> None:
        with self._changed:
            self._pending.discard(future)
            self._changed.notify_all()

    def wait(self, timeout: float) -> int:
        """Wait until none is left, at most ``timeout`` seconds; returns how many were still running (0: none)."""
        with self._changed:
            self._closed = True
            self._changed.wait_for(lambda: not self._pending, timeout)
            still, self._pending = len(self._pending), set()
            return still


def get_engine_session() -> Any:
    """
    The open :class:`~prefect_cudf_polars.blocks.EngineSession` of the current flow run (flow body or task thread).

    The innermost session provider's session, its engine opened at first use.
    The first call inside a flow run writes the session's start line (backend,
    GPUs, versions) to its log.

    Returns
    -------
    EngineSession

    Raises
    ------
    NoEngineSessionError
        No session is active here (no ``CudfPolarsTaskRunner``, no ``with block.session():``).
    SessionError
        The session here has ended, or a subflow's session cannot share its parent's GPU.
    BlockNotFoundError
        The task runner names a saved block that does not exist.
    NoGPUError
        The block asks for a GPU backend and no usable GPU is here.
    Exception
        Whatever else stopped the engine from starting (every later call raises it again).
    """
    if (provider := innermost()) is not None:
        return provider.provide_session()
    where = "for this flow run" if flow_run_context() is not None else "here, and no flow run is running"
    raise NoEngineSessionError(NO_SESSION_MESSAGE.format(where=where))
