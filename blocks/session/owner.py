"""
The owner thread: the one thread that creates, uses and shuts down a session's engine.

rapidsmpf aborts the process when an engine is shut down on another thread
than the one that created it, and Prefect runs tasks, hooks and garbage
collection on threads of its own; so every engine call is handed to this one
thread. Engine calls are therefore serialized, which costs little: one engine
call already uses the whole GPU (its own thread pool drives the streaming
network), so tasks submitted at once queue for the GPU rather than share it.

Developer notes
---------------
* The thread is a daemon with its own queue (not a ``concurrent.futures``
  pool, whose threads the interpreter joins at exit): an engine call that
  never returns cannot hold the process past the session's teardown limit.
* A caller waits for its call in short slices (:data:`WAIT_SLICE_S`), so an
  exception Prefect injects into a task thread at its ``timeout_seconds``
  (``PyThreadState_SetAsyncExc``, which waits for the next bytecode) or a
  SIGALRM in the main thread ends the wait at once. The engine call itself
  cannot be interrupted: it runs to its end on the owner thread, and what it
  returns then goes to the caller's ``on_late`` (on the owner thread, before
  the next queued call), so nothing it produced is left unowned.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from prefect_cudf_polars.blocks.errors import SessionError

T = TypeVar("T")

#: Seconds a caller blocks at a time while it waits for the owner thread.
WAIT_SLICE_S = 0.05

ENDED_MESSAGE = (
    "The engine session has ended; open a new session (a new flow run, or a new "
    "`with block.session():`) to run more queries."
)

_STOP = object()


class OwnerThread:
    """
    A single daemon thread that runs every call handed to it, in order.

    Parameters
    ----------
    name : str
        The thread's name (``cudf-polars-engine-owner-<session id>``).
    ended_message : callable, optional
        Returns the text of the :class:`SessionError` raised for a call handed
        in after the thread stopped (default: :data:`ENDED_MESSAGE`).
    activity : object, optional
        Told when each call starts and ends (``started()``, ``ended()``) and
        when the thread ends (``stopped()``): the monitor's writer keeps its
        own work off the engine's calls.

    Attributes
    ----------
    thread : threading.Thread
        The owner thread itself.
    """

    def __init__(
        self, name: str, ended_message: Callable[[], str] | None = None, activity: Any = None
    ) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._activity = activity
        self._reported = False
        self._lock = threading.Lock()
        self._accepting = True
        self._ended_message = ended_message or (lambda: ENDED_MESSAGE)
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                if self._activity is not None:
                    self._activity.stopped()
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up before it started
            self._report_start()
            try:
                value = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(value)  # runs on_late here, before the next call
            finally:
                self.disown_current_call()
            del item, future, fn, args, kwargs

    def _report_start(self) -> None:
        if self._activity is not None:
            # Under the lock, with disown_current_call's ended(): the two never interleave,
            # so a call is counted once and uncounted once.
            with self._lock:
                self._reported = True
                self._activity.started()

    def disown_current_call(self) -> None:
        """
        Stop counting the call running now as engine activity (idempotent).

        Called when it ends, and by a session that stopped waiting for a call
        that does not end, so that the monitor's writer does not wait for it.
        """
        if self._activity is None:
            return
        with self._lock:
            reported, self._reported = self._reported, False
            if reported:
                self._activity.ended()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """
        Queue ``fn(*args, **kwargs)`` and return its future.

        Raises
        ------
        SessionError
            If the thread has stopped accepting calls (the session has ended).
        """
        future: Future[T] = Future()
        with self._lock:
            if not self._accepting:
                raise SessionError(self._ended_message())
            self._queue.put((future, fn, args, kwargs))
        return future

    def run(
        self,
        fn: Callable[..., T],
        *args: Any,
        on_late: Callable[[T], None] | None = None,
        **kwargs: Any,
    ) -> T:
        """
        Run ``fn(*args, **kwargs)`` on the owner thread and return its result.

        Called from the owner thread itself, it runs ``fn`` in place.

        Parameters
        ----------
        fn : callable
            The call.
        on_late : callable, optional
            If the caller stops waiting (an exception arrives in its thread: a
            task's timeout, a signal) after ``fn`` started, ``on_late(value)``
            runs on the owner thread with what ``fn`` returns; a call that had
            not started is dropped.

        Raises
        ------
        SessionError
            If the thread has been stopped (the session has ended).
        BaseException
            Whatever ``fn`` raises, or what interrupted the wait.
        """
        if threading.current_thread() is self.thread:
            return fn(*args, **kwargs)
        future = self.submit(fn, *args, **kwargs)
        try:
            return wait(future)
        except BaseException:
            if not future.done() and not future.cancel():
                if on_late is not None:
                    future.add_done_callback(_late(on_late))
            raise

    def run_bounded(self, fn: Callable[[], None], *, timeout: float) -> bool:
        """
        Run ``fn`` after the calls already queued, waiting at most ``timeout`` seconds.

        Returns
        -------
        bool
            True when ``fn`` ended in time; False when it did not (it stays
            queued and runs when the calls before it end).

        Raises
        ------
        SessionError
            If the thread has stopped.
        Exception
            Whatever ``fn`` raises.
        """
        return _ended_within(self.submit(fn), timeout)

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
            True when ``job`` ended in time; False when it did not: ``job`` stays
            queued and the thread ends once it has run. No new call is accepted
            either way.

        Raises
        ------
        Exception
            Whatever ``job`` raises.
        """
        future: Future[None] = Future()
        with self._lock:
            self._accepting = False
            self._queue.put((future, job, (), {}))
            self._queue.put(_STOP)
        return _ended_within(future, timeout)

    def stop(self) -> None:
        """Let the queued calls run, then end the thread (idempotent; no wait)."""
        with self._lock:
            if self._accepting:
                self._accepting = False
                self._queue.put(_STOP)


def wait(future: Future[T]) -> T:
    """``future.result()``, blocking at most :data:`WAIT_SLICE_S` at a time (see the module notes)."""
    while True:
        try:
            return future.result(timeout=WAIT_SLICE_S)
        except FutureTimeout:
            if future.done():  # the call itself raised TimeoutError
                return future.result()
        except FutureCancelled:
            raise SessionError(ENDED_MESSAGE) from None


def _ended_within(future: Future[Any], timeout: float) -> bool:
    """Whether ``future`` ended within ``timeout`` seconds (re-raising what it raised)."""
    try:
        future.result(timeout=timeout)
    except FutureTimeout:
        if not future.done():
            return False
        future.result()  # the call itself raised TimeoutError
    return True


def _late(on_late: Callable[[Any], None]) -> Callable[[Future[Any]], None]:
    def done(future: Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        on_late(future.result())

    return done
