"""
The owner thread: the one thread that creates, uses and shuts down a session's engine.

rapidsmpf aborts the process when an engine is shut down on another thread
than the one that created it, and Prefect runs tasks, hooks and garbage
collection on threads of its own; so every engine call is handed to this one
thread. Engine calls are therefore serialized, which costs little: one engine
call already uses the whole GPU (its own thread pool drives the streaming
network), so tasks submitted at once queue for the GPU rather than share it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from prefect_cudf_polars.blocks.errors import SessionError

T = TypeVar("T")

ENDED_MESSAGE = (
    "The engine session has ended (its flow run is over); open a new session to run "
    "more queries."
)


class OwnerThread:
    """
    A single thread that runs every call handed to it, in order.

    Parameters
    ----------
    name : str
        Prefix of the thread's name (``cudf-polars-engine-owner-<session id>``).

    Attributes
    ----------
    thread : threading.Thread
        The owner thread itself.
    """

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.thread: threading.Thread = self._pool.submit(threading.current_thread).result()

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """
        Run ``fn(*args, **kwargs)`` on the owner thread and return its result.

        Called from the owner thread itself, it runs ``fn`` in place.

        Raises
        ------
        SessionError
            If the thread has been stopped (the session has ended).
        Exception
            Whatever ``fn`` raises.
        """
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        try:
            future = self._pool.submit(fn, *args, **kwargs)
        except RuntimeError:  # the pool was shut down
            raise SessionError(ENDED_MESSAGE) from None
        return future.result()

    def finish(self, job: Callable[[], None], *, timeout: float) -> bool:
        """
        Run ``job`` as the thread's last call, waiting at most ``timeout`` seconds.

        Parameters
        ----------
        job : callable
            The teardown: it runs after every call already queued.
        timeout : float
            Seconds to wait for ``job`` to end.

        Returns
        -------
        bool
            True when ``job`` ended in time (the thread is then stopped); False
            when it did not: ``job`` stays queued and the thread ends once it has
            run, and no new call is accepted either way.

        Raises
        ------
        Exception
            Whatever ``job`` raises (the thread is stopped first).
        """
        done = self._pool.submit(job)
        try:
            done.result(timeout=timeout)
        except FutureTimeout:
            self._pool.shutdown(wait=False)
            return False
        finally:
            if done.done():
                self._pool.shutdown(wait=True)
        return True

    def stop(self) -> None:
        """Let the queued calls run, then end the thread (idempotent)."""
        self._pool.shutdown(wait=True)
