"""
The engine host: one owner thread, and the engine with everything it owns in one exit stack.

rapidsmpf requires an engine to be created, used and shut down on one thread,
and Prefect runs tasks, hooks and garbage collection on threads of its own; so
an :class:`EngineHost` starts the backend on a thread of its own and every
engine call is handed to that thread (:meth:`EngineHost.run`). What the backend
creates (the engine, a Dask cluster and its client, a scheduler lease, a Ray
head) goes into one :class:`contextlib.ExitStack`, as cudf-polars'
``StreamingEngine`` holds its ``exit_stack`` and prefect-dask enters what it
creates into one stack; :meth:`EngineHost.shutdown` closes it, once, as the
thread's last call, and drops the engine there, so the engine and its memory
resource are freed on the thread that created them. With the block's
``admission_limit``, the first thing in that stack is the session's GiB of
device memory in that Prefect global concurrency limit
(:func:`~prefect_cudf_polars.blocks.admission.admitted`): first in, last out,
given back once the engine is dropped, however the start or the session ends.
A subflow's session that
uses the same block runs on its parent's host, by reference; only the session
that started a host shuts it down.

Developer notes
---------------
* The thread is a daemon with its own queue (not a ``concurrent.futures``
  pool, whose threads the interpreter joins at exit): an engine call that
  never returns cannot hold the process past the session's teardown limit.
* A caller waits in short slices (:data:`WAIT_SLICE_S`), so an exception
  Prefect injects into a task thread at its ``timeout_seconds``
  (``PyThreadState_SetAsyncExc``, which waits for the next bytecode) or a
  SIGALRM in the main thread ends the wait at once. The engine call itself
  runs to its end on the owner thread, and what it returns then goes to the
  caller's ``on_late`` (on the owner thread, before the next queued call), so
  nothing it produced is left unowned.
* A coroutine awaits a call's future on its event loop (:meth:`EngineHost.wait_async`),
  with the same ``on_late`` when it is cancelled while the call runs.
* Engine calls are serialized, which costs little: one engine call already
  uses the whole GPU (its own thread pool drives the streaming network).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from prefect_cudf_polars.blocks.admission import Admission, Log, admitted
from prefect_cudf_polars.blocks.backends.base import Reading, RunningEngine
from prefect_cudf_polars.blocks.backends.choice import gpus_used, start_backend
from prefect_cudf_polars.blocks.backends.environment import environment
from prefect_cudf_polars.blocks.backends.probe import host_memory_per_gpu, memory_total
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import SessionError
from prefect_cudf_polars.blocks.memory import MemoryLedger

T = TypeVar("T")

#: Seconds a caller blocks at a time while it waits for the owner thread.
WAIT_SLICE_S = 0.05

_STOP = object()


class EngineHost:
    """
    The owner thread of one engine and the exit stack of what it owns.

    Build it with :meth:`start`.

    Parameters
    ----------
    name : str
        The owner thread's name (``cudf-polars-engine-owner-<session id>``).
    ended : callable
        Returns the text of the :class:`SessionError` for a call handed in after shutdown.

    Attributes
    ----------
    running : RunningEngine or None
        The started engine, until :meth:`shutdown` has closed the stack.
    description : dict
        Backend, GPUs, ranks and versions (``RunningEngine.describe``), read once started.
    at_start : Reading or None
        The engine's memory right after it started.
    ledger : MemoryLedger
        The results held on the engine, by rank, of every session on this host (:mod:`~prefect_cudf_polars.blocks.memory`).
    admission : Admission
        The slots of the block's ``admission_limit`` held while the engine runs
        (the limit's name, the slots in GiB, the seconds the start waited for them).
    start_seconds, shutdown_seconds : float
        Seconds the backend took to start and to shut down (0 until known).
    thread : threading.Thread
        The owner thread.
    """

    def __init__(self, name: str, ended: Callable[[], str]) -> None:
        self.running: RunningEngine | None = None
        self.description: dict[str, Any] = {}
        self.at_start: Reading | None = None
        self.ledger, self.admission, self.start_seconds, self.shutdown_seconds = MemoryLedger(), Admission(), 0.0, 0.0
        self._failed_call = False  # a call on the owner thread raised: collect garbage at the close
        self._closing_at, self._ended, self._accepting = 0.0, ended, True
        self._stack = contextlib.ExitStack()  # first in, last out: the admission slots, the engine's drop, the engine
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: set[Future[Any]] = set()  # queued calls that have not started
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, backend: str, block: CudfPolarsEngine, *, name: str, ended: Callable[[], str],
              log: Log, flow_run_id: Any) -> EngineHost:
        """
        Start ``backend`` on a new owner thread, after occupying the block's admission slots.

        Parameters
        ----------
        backend : str
            The resolved backend (``"spmd"``, ``"dask"``, ``"ray"`` or ``"cpu"``).
        block : CudfPolarsEngine
        name : str
            The owner thread's name.
        ended : callable
            Returns the text of the :class:`SessionError` for a call handed in after shutdown.
        log : callable
            ``log(level, msg, *args)``: where the admission's lines go (the flow
            run's log, once the session knows its flow run).
        flow_run_id : uuid.UUID or None
            The flow run the session serves (``None`` outside one): the holder of the admission slots.

        Raises
        ------
        AdmissionError
            With the block's ``admission_limit``: the limit does not exist, is too
            small, or its slots were not free within ``admission_timeout`` seconds.
        NoGPUError, DaskClusterError, RayClusterError, Exception
            What the backend raised (or its first reading); what it had started is shut
            down, waited for at most the block's ``teardown_timeout``, and the thread ends;
            the admission slots are given back after it.
        """
        host = cls(name, ended)
        try:
            host.run(host._start, backend, block, log, flow_run_id)
        except BaseException as exc:
            try:
                host.shutdown(deadline=block.teardown_timeout)  # what the backend had started
            except Exception as also:
                exc.add_note(f"Shutting down what had started also failed: {type(also).__name__}: {also}")
            raise
        return host

    def _start(self, backend: str, block: CudfPolarsEngine, log: Log, flow_run_id: Any) -> None:
        limit = block.memory_limit_bytes(memory_total(backend))
        # The slots are wanted while the caller waits for the start: until it stopped waiting and shut the host down.
        self.admission = self._stack.enter_context(admitted(
            block, limit, log, gpus=gpus_used(backend, block), flow_run_id=flow_run_id, wanted=lambda: self._accepting))
        if not self._accepting:
            raise SessionError(self._ended())
        self._stack.callback(self._drop_engine)  # after the engine's own exits, before the slots are given back
        started = time.perf_counter()
        self.running = start_backend(backend, block, self._stack, limit)
        self.start_seconds = time.perf_counter() - started
        self.description = self.running.describe()
        self.ledger.start(block.spill_results, limit, int(self.description.get("ranks") or 1),
                          block.host_spill_limit_bytes(host_memory_per_gpu(backend)))
        self.running.room_wanted = self.ledger.on_demand  # a query past the limit asks the ledger for room
        self.at_start = self.running.read()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            future, fn, args = item
            with self._lock:
                self._waiting.discard(future)
            if future.set_running_or_notify_cancel():  # else cancelled before it started
                try:
                    future.set_result(fn(*args))  # runs on_late here, before the next call
                except BaseException as exc:
                    self._failed_call = True
                    future.set_exception(exc)
            del item, future, fn, args

    def submit(self, fn: Callable[..., T], *args: Any, last: bool = False) -> Future[T]:
        """
        Queue ``fn(*args)`` on the owner thread; its future (wait for it with :meth:`wait` or :meth:`wait_async`).

        ``last`` makes it the thread's last call: no call is accepted after it.

        Raises
        ------
        SessionError
            If the host has shut down.
        """
        future: Future[T] = Future()
        with self._lock:
            if not self._accepting:
                raise SessionError(self._ended())
            self._queue.put((future, fn, args))
            self._waiting.add(future)
            if last:
                self._accepting = False
                self._queue.put(_STOP)
        return future

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """
        Run ``fn(*args)`` on the owner thread and return what it returns (in place when called there).

        Raises
        ------
        SessionError
            If the host has shut down.
        BaseException
            Whatever ``fn`` raises, or what interrupted the wait.
        """
        if threading.current_thread() is self.thread:
            return fn(*args)
        return self.wait(self.submit(fn, *args))

    def wait(self, future: Future[T], *, on_late: Callable[[T], None] | None = None) -> T:
        """
        Wait for a call :meth:`submit` queued, in short slices, and return its value.

        Parameters
        ----------
        future : concurrent.futures.Future
        on_late : callable, optional
            If the caller stops waiting (an exception arrives in its thread: a
            task's timeout, a signal) after the call started, ``on_late(value)``
            runs on the owner thread with what the call returns; a call that had
            not started is dropped.

        Raises
        ------
        SessionError
            If the host shut down before the call started.
        BaseException
            Whatever the call raises, or what interrupted the wait.
        """
        try:
            while not ended_within(future, WAIT_SLICE_S):
                pass
            return future.result()
        except CancelledError:
            raise SessionError(self._ended()) from None
        except BaseException:
            self._abandon(future, on_late)
            raise

    async def wait_async(self, future: Future[T], *, on_late: Callable[[T], None] | None = None) -> T:
        """:meth:`wait` for a coroutine: awaits the call's future on the event loop (no thread); the same errors and ``on_late``."""
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if future.cancelled() and (task is None or not task.cancelling()):
                raise SessionError(self._ended()) from None  # the host shut down before the call started
            self._abandon(future, on_late)
            raise

    def _abandon(self, future: Future[Any], on_late: Callable[[Any], None] | None) -> None:
        """The caller stopped waiting: drop the call if it has not started, else hand its value to ``on_late``."""
        if not future.cancel() and on_late is not None:
            future.add_done_callback(lambda done: self._late(done, on_late))

    def _late(self, future: Future[Any], on_late: Callable[[Any], None]) -> None:
        """Give a call's value to ``on_late`` on the owner thread, once the call ends, when its caller stopped waiting."""
        if future.exception() is None:  # it had started, so it was not cancelled
            self.post(on_late, future.result())  # in place on the owner thread; queued there when the call ended first

    def post(self, fn: Callable[..., Any], *args: Any) -> bool:
        """
        Run ``fn(*args)`` on the owner thread without waiting for it (in place when called there).

        Returns
        -------
        bool
            False when the host no longer takes calls (nothing was queued).
        """
        if threading.current_thread() is self.thread:
            fn(*args)
            return True
        with contextlib.suppress(SessionError):
            self.submit(fn, *args)
            return True
        return False

    @property
    def engine(self) -> RunningEngine:
        """The running engine (on the owner thread); ``SessionError`` once it has shut down."""
        if (running := self.running) is None:  # read once: the engine's end may set it to None meanwhile
            raise SessionError(self._ended())
        return running

    def read(self) -> Reading:
        """The engine's memory now, read on the owner thread."""
        return self.run(lambda: self.engine.read())

    def shutdown(self, deadline: float | None, *, before: Callable[[], None] | None = None) -> bool:
        """
        Close the exit stack as the owner thread's last call (once), waiting at most ``deadline`` seconds.

        The stack closes last created first (a Ray head after its engine, a Dask
        cluster after our client); the engine is then dropped on the owner
        thread, and the thread ends. No call is accepted after this.

        Parameters
        ----------
        deadline : float or None
            Seconds to wait (``None``: no limit).
        before : callable, optional
            Runs first, in the same call (a session's last releases, a reading).

        Returns
        -------
        bool
            True when the stack was closed in time; False when the wait ended
            first: the shutdown stays queued and runs if the engine answers.
            Also True when the host had already shut down. Calls still queued
            then are cancelled: their callers get ``SessionError``.

        Raises
        ------
        Exception
            What ``before`` or closing the stack raised (the engine is dropped either way).
        """
        try:
            future = self.submit(self._close, before, last=True)
        except SessionError:
            return True
        if ended_within(future, deadline):
            return True
        with self._lock:  # the calls queued behind the stuck one end now, with the session's error
            cancelled = [f for f in self._waiting if f is not future]
        for waiting in cancelled:
            waiting.cancel()
        return False

    def _close(self, before: Callable[[], None] | None) -> None:
        self._closing_at = time.perf_counter()
        if before is not None:
            self._stack.callback(before)  # the first to run; the stack closes whatever it raises
        self._stack.close()

    def _drop_engine(self) -> None:
        """In the exit stack, once the engine's own exits ran: drop it here, on the thread that created it."""
        self.running = None
        self.shutdown_seconds = time.perf_counter() - self._closing_at
        if self._failed_call:
            # Objects of the engine held only by reference cycles (an exception and the frames that caught
            # it, inside a failed query or move) would keep device memory, and the memory resource that owns
            # it, until the interpreter's next collection: collect them before the slots are given back.
            gc.collect()


@contextlib.contextmanager
def call_environment(running: RunningEngine, env: Mapping[str, str | None] | None) -> Iterator[None]:
    """Set ``env`` in this process and on every rank for one engine call (``None`` unsets a variable); put back after."""
    with contextlib.ExitStack() as stack:
        if env:
            stack.enter_context(environment(env))
            stack.callback(running.restore_rank_environment)
            running.set_rank_environment(env)
        yield


def ended_within(future: Future[Any], timeout: float | None) -> bool:
    """Whether ``future`` (an owner thread's call, :meth:`EngineHost.submit`) ended within ``timeout`` seconds
    (re-raising what it raised); one that did not stays queued."""
    try:
        future.result(timeout=timeout)
    except FutureTimeout:
        if not future.done():  # (a cancelled future is done: result() raises CancelledError)
            return False
        future.result()  # the call itself raised TimeoutError
    return True
