"""
The thread that owns the engine, and the calls the harness hands to it.

cudf-polars' ``SPMDEngine`` must be created, used and shut down on one thread.
The harness uses one engine per flow run: the one the engine session starts on
its owner thread (:func:`~prefect_cudf_polars.blocks.backends.choice.start_backend`
with the block's fields). Every variant that calls that engine directly (the bare
engine calls, the plain Prefect tasks of (h)) runs on that thread, handed over
with the session's public :meth:`~prefect_cudf_polars.blocks.EngineSession.run`:
one hand-off per measured run, outside the timing, since each variant times
itself on the thread it runs on.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WrongThreadError(RuntimeError):
    """A direct engine call was about to run on another thread than the engine's."""


class EngineThread:
    """
    The engine session's owner thread, seen from the harness.

    Parameters
    ----------
    session
        An open :class:`~prefect_cudf_polars.blocks.EngineSession`.

    Attributes
    ----------
    thread : threading.Thread
        The thread that created the session's engine.
    """

    def __init__(self, session: Any) -> None:
        self._session = session
        self.thread: threading.Thread = session.run(threading.current_thread)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """
        ``fn(*args)`` on the engine's thread, in a copy of the calling thread's context.

        The copy carries Prefect's flow run context and the active engine
        session, so Prefect tasks called by ``fn`` run as tasks of this flow run.

        Raises
        ------
        SessionError
            If the session has ended.
        Exception
            Whatever ``fn`` raises.
        """
        context = contextvars.copy_context()
        return self._session.run(context.run, fn, *args)

    def check(self, what: str) -> None:
        """
        Raise unless called on the engine's thread.

        Raises
        ------
        WrongThreadError
            Naming ``what`` and both threads.
        """
        here = threading.current_thread()
        if here is not self.thread:
            raise WrongThreadError(
                f"{what} ran on thread {here.name!r}, not on the engine's thread "
                f"{self.thread.name!r}: cudf-polars' SPMDEngine must be used on the thread "
                "that created it. Hand the call over with EngineThread.call."
            )
