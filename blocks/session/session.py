"""
The engine session: one engine for one flow run, and every rule of its lifetime.

The rules, and where each is kept:

1. **One owner thread.** The engine is created, used and shut down on one
   thread (:class:`~prefect_cudf_polars.blocks.session.owner.OwnerThread`);
   every engine call (``execute``, ``collect``, releases, memory readings) is
   handed to it with :meth:`EngineSession.run`, one hand-off per call.
2. **A result belongs to its session.** Each
   :class:`~prefect_cudf_polars.blocks.results.result.GPUResult` records the
   session that produced it, and refuses a claim while another session is
   active (:class:`~prefect_cudf_polars.blocks.errors.WrongEngineError`).
3. **A result is read at most once.** The first claim names its consumer; the
   session's :class:`~prefect_cudf_polars.blocks.session.registry.ResultRegistry`
   records it (``result_claimed``), and later claims raise
   :class:`~prefect_cudf_polars.blocks.errors.ResultConsumedError`.
4. **Everything is released when the session ends**, however it ends: a normal
   return, an exception, or ``TerminationSignal`` (SIGTERM) all run
   :meth:`EngineSession.close`. A ``with block.session():`` first waits for the
   GPU task runs submitted inside it (:mod:`~prefect_cudf_polars.blocks.session.served`).
   ``close`` then closes the registry and, as the owner thread's last call,
   releases every result that still holds engine memory, reads the memory and
   shuts the engine down. It is idempotent, and it waits at most the block's
   ``teardown_timeout`` (seconds) for the engine, at most 3 s when the flow
   run is being stopped (a Prefect process worker checks every 3 s whether the
   run's processes are gone). Past the limit the live results are marked
   released without the engine (:meth:`GPUResult.mark_released`), the end
   line is logged with a warning, and the process may end; the queued
   teardown still runs if the engine answers.
5. **An ended session holds nothing of the engine.** After the shutdown the
   session drops its running engine, its results point at a small
   :class:`~prefect_cudf_polars.blocks.results.result.EndedSession` instead of
   the session, and the monitor never held the session: a session, its
   results and its engine are freed by reference counting alone, so device
   memory comes back without Python's garbage collector.
6. **The engine opens at the first GPU call.** A task runner's session opens
   when a task of its flow run first asks for it (under the runner's lock:
   tasks submitted at once start one engine); an engine that cannot start
   fails that task run, and so the flow run, and every later GPU call of the
   run gets the same error. Sessions of subflows: :mod:`~prefect_cudf_polars.blocks.session.nesting`.
7. **A result never leaves its process**: pickling a ``GPUResult`` raises.
8. **A session left open at interpreter exit** is closed by
   :mod:`~prefect_cudf_polars.blocks.session.exit_hook`, with one warning naming
   the results that were still live.
"""

from __future__ import annotations

import contextvars
import gc
import logging
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from prefect_cudf_polars.blocks.active import enter_provider, innermost_provider, leave_provider
from prefect_cudf_polars.blocks.backends.choice import resolve_backend, start_backend
from prefect_cudf_polars.blocks.backends.engine_errors import iter_exceptions, raise_engine_error
from prefect_cudf_polars.blocks.backends.environment import environment
from prefect_cudf_polars.blocks.errors import SessionError
from prefect_cudf_polars.blocks.monitoring.monitor import END_WAIT_S, SessionMonitor
from prefect_cudf_polars.blocks.monitoring.writer import WRITER
from prefect_cudf_polars.blocks.results.lineage import Lineage
from prefect_cudf_polars.blocks.results.result import EndedSession, FusedStep, GPUResult, HeldPlan
from prefect_cudf_polars.blocks.results.run_identity import RunIdentity, current_run
from prefect_cudf_polars.blocks.session import exit_hook, lines, nesting, resource_tracker
from prefect_cudf_polars.blocks.session.memory import MemoryTracker
from prefect_cudf_polars.blocks.session.owner import OwnerThread
from prefect_cudf_polars.blocks.session.registry import ResultRegistry
from prefect_cudf_polars.blocks.session.served import ServedRuns
from prefect_cudf_polars.blocks.session.warning_origin import user_stacklevel

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.backends.base import PersistedResult, RunningEngine
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine

T = TypeVar("T")

logger = logging.getLogger("prefect_cudf_polars.session")

#: Seconds the teardown waits for the engine at most when the flow run is being
#: stopped (SIGTERM): a Prefect process worker checks every 3 s whether the run's
#: process group is gone, so a teardown within that keeps cancellation quick.
TERMINATING_TEARDOWN_S = 3.0


def _in_flow_run() -> bool:
    """Whether this code runs in a flow run (its log is where the session's lines go)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return ctx is not None and ctx.flow_run is not None


class EngineSession:
    """
    One engine for one flow run: owner thread, result registry, teardown.

    Open it with :meth:`CudfPolarsEngine.session` (``with block.session():`` in
    a flow body) or let :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner`
    open it for the flow run, at its first GPU call. Tasks find it with
    :func:`~prefect_cudf_polars.blocks.get_engine_session`.

    Parameters
    ----------
    block : CudfPolarsEngine
        The engine configuration.

    Attributes
    ----------
    id : str
        Session id (32 hex characters).
    block : CudfPolarsEngine
        The configuration it was opened with.
    backend : str or None
        Resolved backend (``"spmd"``, ``"dask"``, ``"ray"`` or ``"cpu"``);
        ``None`` before entry.
    description : dict
        Backend, GPU names, ranks and versions (after entry).
    timings : dict of str to float
        ``engine_start_s`` and ``engine_shutdown_s``, in seconds.
    fallback_warning : str or None
        Why the ``cpu`` backend runs instead of the GPU one asked for, if it does.
        Said once: as a WARNING line in the flow run's log when the session opens
        in a flow run, else as a Python ``RuntimeWarning`` at the user's line.
    monitor : SessionMonitor
        The session's events and artifacts (see its ``options`` to switch parts off).
    shutdown_thread : str or None
        Name of the thread that shut the engine down (the owner thread), once it has.
    teardown : str
        ``"not started"``, ``"complete"``, or what the teardown was doing when
        it stopped waiting for the engine.
    flow_run_name : str or None
        The flow run the session serves (recorded at its open or first use inside it).
    """

    def __init__(self, block: CudfPolarsEngine) -> None:
        self.id = uuid.uuid4().hex
        self.block = block
        self.backend: str | None = None
        self.description: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self._engine_calls = 0  # counted on the owner thread only
        self.fallback_warning: str | None = None
        self.monitor = SessionMonitor(self.id)
        self.shutdown_thread: str | None = None
        self.teardown = "not started"
        self.flow_run_name: str | None = None
        self._flow_run_id: Any = None
        self._subflow = False
        self._opened_by = "new"
        self._running: RunningEngine | None = None
        self._owner: OwnerThread | None = None
        self._host: EngineSession | None = None  # the session whose engine this one runs on
        self._registry = ResultRegistry()
        self._memory = MemoryTracker()
        self._log = lines.SessionLog()
        self._served = ServedRuns()
        self._lock = threading.Lock()
        self._closing = False
        self._closed = False
        self._stopped = False  # the engine is shut down, or no longer answers
        self._token: contextvars.Token[Any] | None = None
        self._announced = False
        self._teardown_step = ""
        self._engine_ref: Callable[[], Any] | None = None
        #: How the engine's objects were freed at the end (see :meth:`summary`).
        self.engine_freed: str | None = None
        #: Seconds :meth:`close` took (waiting for served task runs, teardown, monitor), once closed.
        self.end_seconds: float | None = None

    # ---- lifecycle -------------------------------------------------------
    def __enter__(self) -> EngineSession:
        self.open(activate=True)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(terminating=exit_hook.is_termination(exc))

    def open(self, *, activate: bool, parent: EngineSession | None = None, opened_by: str = "") -> EngineSession:
        """
        Start the engine on a new owner thread, or join the enclosing session's engine.

        Parameters
        ----------
        activate : bool
            Make this the innermost session of the current context (the flow
            body's and, through Prefect's context copy, its task threads'):
            ``with block.session():``.
        parent : EngineSession, optional
            The open session of an enclosing flow run (a subflow's runner
            passes its parent's); with ``activate`` it is found here.
        opened_by : str, optional
            What opened it, for messages (default: ``with block.session()``
            with ``activate``, else ``CudfPolarsTaskRunner``).

        Returns
        -------
        EngineSession
            This session, open.

        Raises
        ------
        SessionError
            If this session was already opened; if another session of this
            flow run is open (sessions do not nest within one flow run); or
            if it needs a second GPU engine next to the enclosing flow run's
            (see :mod:`~prefect_cudf_polars.blocks.session.nesting`).
        NoGPUError
            A GPU backend was asked for and no usable GPU or RAPIDS stack is
            here (see :func:`~prefect_cudf_polars.blocks.backends.choice.resolve_backend`).
        Exception
            Whatever the backend raises when its engine cannot start (for example
            :class:`~prefect_cudf_polars.blocks.backends.dask.cluster.DaskClusterError`);
            what was started is shut down first.
        """
        if self._owner is not None or self._closing:
            raise SessionError(
                "This engine session was already opened; open a new one with "
                "CudfPolarsEngine.session()."
            )
        self._opened_by = opened_by or ("`with block.session():`" if activate else "CudfPolarsTaskRunner")
        self._record_run()
        if activate:
            parent = self._enclosing_session()
        self._host = nesting.engine_host(self.block, parent, run=self.served_run or "this session")
        if self._host is not None:
            self._join(self._host)
        else:
            self._start()
        exit_hook.opened(self)
        if activate:
            self._token = enter_provider(self)
        self.announce()
        return self

    def _enclosing_session(self) -> EngineSession | None:
        """The open session of an enclosing flow run; raises if this flow run has one."""
        from prefect.context import FlowRunContext

        outer = innermost_provider()
        if outer is None:
            return None
        ctx = FlowRunContext.get()
        if ctx is not None and ctx.task_runner is outer:
            nesting.refuse_nesting(outer, runner_here=True)
        session = outer.provided_session
        if isinstance(outer, EngineSession) and session is not None and outer.flow_run_id == self._flow_run_id:
            nesting.refuse_nesting(outer, runner_here=False)
        return session

    def _start(self) -> None:
        self.backend, self.fallback_warning = resolve_backend(self.block)
        if self.fallback_warning and not _in_flow_run():
            # Outside a flow run: a Python warning, at the user's line. In a flow run,
            # announce() writes it once to the flow run's log (console and UI) instead.
            warnings.warn(self.fallback_warning, RuntimeWarning, stacklevel=user_stacklevel())
        self._owner = OwnerThread(
            f"cudf-polars-engine-owner-{self.id[:8]}", self.ended_message, activity=WRITER.activity
        )
        try:
            self._owner.run(self._start_on_owner)
        except BaseException:
            self._closing = self._closed = True
            self._stop_engine()
            self._owner = None
            raise
        self.monitor.describe(self.backend, self.description)

    def _start_on_owner(self) -> None:
        started = time.perf_counter()
        self._running = running = start_backend(self.backend, self.block)  # type: ignore[arg-type]
        self.timings["engine_start_s"] = time.perf_counter() - started
        try:
            self._engine_ref = weakref.ref(running.engine)
        except TypeError:  # an engine object without weak references: not checked
            self._engine_ref = None
        self.description = running.describe()
        self._memory.record("at_start", running)

    def _join(self, host: EngineSession) -> None:
        """Run on ``host``'s engine (see :mod:`~prefect_cudf_polars.blocks.session.nesting`)."""
        self.backend, self.fallback_warning = host.backend, None
        self._owner = host.owner_thread
        self.timings["engine_start_s"] = 0.0
        self.description = {
            **host.description,
            "note": f"{host.description.get('note', '')}; on the engine of session {host.id[:8]}"
            + (f" ({host.served_run})" if host.served_run else ""),
        }
        running = self._check_open()
        self.run(self._memory.record, "at_start", running)
        self.monitor.describe(self.backend, self.description)

    @property
    def engine_owner(self) -> EngineSession:
        """The session that started the engine this one runs on (itself, unless it shares one)."""
        return self._host.engine_owner if self._host is not None else self

    @property
    def closed(self) -> bool:
        """Whether the session has ended (its engine is shut down, or it no longer runs queries)."""
        return self._closed

    @property
    def served_run(self) -> str | None:
        """``"flow run 'name'"`` or ``"subflow run 'name'"``: the run the session serves, once known."""
        if self.flow_run_name is None:
            return None
        return f"{'subflow' if self._subflow else 'flow'} run {self.flow_run_name!r}"

    @property
    def live_results(self) -> tuple[GPUResult, ...]:
        """Results produced in this session and not yet consumed or released."""
        return self._registry.live

    @property
    def counts(self) -> dict[str, int]:
        """Results ``produced``, ``consumed`` and ``released_unconsumed`` so far."""
        return dict(self._registry.counts)

    @property
    def memory(self) -> dict[str, int | None]:
        """Memory readings in bytes: ``at_start`` and, after the teardown, ``before_shutdown``."""
        return dict(self._memory.readings)

    @property
    def peak_memory(self) -> int | None:
        """The highest memory reading after an engine call, in bytes."""
        return self._memory.peak

    @property
    def running_engine(self) -> RunningEngine | None:
        """The backend's running engine while the session is open (for measuring the bare engine)."""
        return None if self._closed else self._engine()

    @property
    def backend_engine(self) -> RunningEngine | None:
        """
        The backend's running engine: this session's, or the one it shares.

        ``None`` before the engine started. Unlike :attr:`running_engine`, also
        while the session is closing (its teardown still calls it).
        """
        return self._engine()

    @property
    def owner_thread(self) -> OwnerThread | None:
        """The thread that owns the engine (shared by a session on another's engine); ``None`` before it started."""
        return self._owner

    @property
    def flow_run_id(self) -> Any:
        """The id of the flow run this session serves, once known (``None`` before)."""
        return self._flow_run_id

    @property
    def subflow(self) -> bool:
        """Whether the run this session serves is a subflow run."""
        return self._subflow

    def _engine(self) -> RunningEngine | None:
        return self._host.backend_engine if self._host is not None else self._running

    # ---- as a session provider (with block.session()) ----------------------
    @property
    def provided_session(self) -> EngineSession | None:
        """This session while it is open (see :class:`~prefect_cudf_polars.blocks.active.SessionProvider`)."""
        return None if self._closed else self

    def provide_session(self) -> EngineSession:
        """
        This session, for the code inside its with block.

        Raises
        ------
        SessionError
            When it has ended (the message names it).
        """
        if self._closed:
            raise SessionError(self.ended_message())
        return self

    def serve(self, future: Any) -> None:
        """Make the session's end wait for the task run of ``future`` (bounded by ``teardown_timeout``)."""
        if not self._closing:
            self._served.add(future)

    def ended_message(self) -> str:
        """What a call into this session says once it has ended."""
        where = f" in {self.served_run}" if self.served_run else ""
        if self._opened_by.startswith("`with"):
            return (
                f"The engine session {self.id} (`with block.session():`{where}) has ended, so it "
                "runs no more queries. Task runs submitted inside the with block must finish "
                "before it exits: the session waits for them at most the block's "
                f"teardown_timeout ({self.block.teardown_timeout:g} s). Wait on their futures "
                "inside the with block, or raise teardown_timeout."
            )
        return (
            f"The engine session {self.id} ({self._opened_by}{where}) has ended with its "
            "flow run, so it runs no more queries; open a new session (a new flow run) to "
            "run more."
        )

    # ---- the end ---------------------------------------------------------------
    def close(self, *, terminating: bool = False) -> dict[str, Any]:
        """
        End the session: wait for the task runs it serves, release every live result, shut the engine down.

        A ``with block.session():`` first waits for the GPU task runs submitted
        inside it, at most the block's ``teardown_timeout`` (seconds). Then the
        releases and the shutdown happen on the owner thread, and ``close``
        waits for them at most ``teardown_timeout`` (at most 3 s when
        ``terminating``). Past it, the results still live are marked released
        without the engine, ``summary()["teardown"]`` says what the teardown
        was doing, a warning is logged, and the teardown stays queued on the
        owner thread in case the engine answers later. A session that shares
        an enclosing session's engine releases only its own results and leaves
        the engine running. The process's last session, when ``terminating``
        and on an engine of its own, then stops multiprocessing's resource
        tracker, at most 2 s (:mod:`~prefect_cudf_polars.blocks.session.resource_tracker`).
        Idempotent: later calls return the summary and do nothing else.

        Parameters
        ----------
        terminating : bool
            The flow run is being stopped (SIGTERM, a cancellation).

        Returns
        -------
        dict
            The session summary (see :meth:`summary`).
        """
        with self._lock:
            if self._closing:
                return self.summary()
            self._closing = True
        limit = self.block.teardown_timeout
        if terminating:
            limit = min(limit, TERMINATING_TEARDOWN_S)
        started = time.monotonic()
        self.monitor.ending()
        try:
            try:
                still = self._served.wait(limit)
                live = self._registry.close()
                self._closed = True
                if self._owner is None or self._stopped or self._engine() is None:
                    for result in self._registry.holding():
                        result.release()
                    self.teardown = "complete"
                else:
                    self._teardown_with_limit(live, limit)
            finally:
                self._deactivate()
                exit_hook.closed(self, terminating=terminating)
            summary = self.summary()
            self._log.log(logging.INFO, *lines.end_line(summary))
            if still:
                self._log.log(logging.WARNING, lines.SERVED_WARNING, self.id, still, limit)
            if self.teardown != "complete":
                self._log.log(logging.WARNING, lines.TEARDOWN_WARNING, self.teardown)
        except BaseException:
            self.monitor.release()  # the writer must not stay held for the process's life
            raise
        # The whole end waits at most END_WAIT_S for the monitor (teardown included).
        wait = max(END_WAIT_S - (time.monotonic() - started), 0.1)
        self.monitor.ended(summary, dashboard=self.description.get("dashboard"), wait=wait)
        owns_engine = self._host is None
        self._forget(complete=self.teardown == "complete")
        if terminating and owns_engine and self.teardown == "complete" and not exit_hook.open_sessions():
            # The process is ending: leave nothing of it in the flow run's process group.
            gc.collect()
            if not resource_tracker.stop_tracker():
                logger.warning(
                    "multiprocessing's resource tracker was still running %g s after engine "
                    "session %s ended (a process started with multiprocessing still holds it); "
                    "the flow process's group ends only once it does.",
                    resource_tracker.STOP_WAIT_S, self.id,
                )
        self.end_seconds = time.monotonic() - started
        return summary

    def _teardown_with_limit(self, live: list[GPUResult], limit: float) -> None:
        assert self._owner is not None
        self._teardown_step = "waiting for the engine's current call to finish"
        if self._host is not None:
            done = self._owner.run_bounded(self._release_on_owner, timeout=limit)
        else:
            done = self._owner.finish(self._teardown_on_owner, timeout=limit)
            if done:
                self._owner.thread.join(1.0)
        if done:
            self.teardown = "complete"
            return
        with self._lock:
            self._stopped = True  # later releases must not queue behind the stuck call
        self._owner.disown_current_call()  # nor the monitor's writer wait for it
        self.teardown = f"stopped waiting after {limit:g} s while {self._teardown_step}"
        for result in live:
            result.mark_released()

    def _release_on_owner(self) -> None:
        self._teardown_step = "releasing results on the ranks"
        for result in self._registry.holding():
            result.release()
        running = self._engine()
        if running is not None:
            self._teardown_step = "reading device memory"
            self._memory.record("before_shutdown", running)
        self.monitor.settle()  # no pending plan keeps a result (or the engine) alive

    def _teardown_on_owner(self) -> None:
        try:
            self._release_on_owner()
        finally:
            self._teardown_step = "shutting the engine down"
            self._shutdown_on_owner()
            self._check_engine_freed()

    def _check_engine_freed(self) -> None:
        """
        After the shutdown, on the owner thread: is the engine object gone?

        The session drops every reference of its own, so reference counting
        frees the engine (and with it the memory resource that keeps freed
        device memory pooled). If something still holds it, a reference cycle
        does (or a user's reference): the fallback is one ``gc.collect()`` here,
        and ``summary()["engine_freed"]`` says which happened.
        """
        ref, self._engine_ref = self._engine_ref, None
        if ref is None:
            return
        if ref() is None:
            self.engine_freed = "by reference counting"
            return
        found = gc.collect()
        self.engine_freed = "by gc.collect()" if ref() is None else "still held after gc.collect()"
        logger.info(
            "cudf-polars engine of session %s not freed by reference counting; gc.collect() "
            "found %d unreachable objects, engine %s",
            self.id, found, self.engine_freed,
        )

    def _stop_engine(self) -> None:
        """Shut the engine down on the owner thread and end that thread (a failed open)."""
        if self._owner is None or self._stopped:
            return
        try:
            self._owner.run(self._shutdown_on_owner)
        finally:
            self._owner.stop()

    def _shutdown_on_owner(self) -> None:
        # Timed; the session counts as stopped even if the engine's shutdown raised.
        started = time.perf_counter()
        try:
            if self._running is not None:
                self.shutdown_thread = threading.current_thread().name
                self._running.shutdown()
        finally:
            self.timings["engine_shutdown_s"] = time.perf_counter() - started
            with self._lock:
                self._stopped = True
                self._running = None  # an ended session holds no engine

    def _forget(self, *, complete: bool) -> None:
        """Drop what an ended session holds: results point at a tombstone, the engine is let go."""
        tombstone = EndedSession(self.id, self.backend, self.served_run, subflow=self._subflow)
        for result in self._registry.forget():
            result.session_ended(tombstone, drop=complete)
        if complete:
            self._owner = None
        self._host = None

    def _deactivate(self) -> None:
        if self._token is None:
            return
        leave_provider(self._token, self)
        self._token = None

    def summary(self) -> dict[str, Any]:
        """
        What the session did, for logs and artifacts.

        Returns
        -------
        dict
            ``session_id``, ``backend``, ``gpus``, ``counts`` (results produced,
            consumed, released unconsumed), ``memory`` (bytes at start and before
            shutdown, rmm statistics on GPU backends), ``peak_memory`` (bytes, the
            highest reading after an engine call), ``peak_memory_per_rank``
            (bytes per rank, where ranks are read apart), ``timings`` (seconds),
            ``shutdown_thread``, ``teardown`` (``"complete"``, or what the
            teardown was doing when it stopped waiting for the engine) and
            ``engine_freed`` (``"by reference counting"``, ``"by gc.collect()"``
            when a reference cycle held the engine after its shutdown, or
            ``None`` when the session did not start it).
        """
        return {
            "session_id": self.id,
            "backend": self.backend,
            "gpus": self.description.get("gpus", []),
            "counts": self.counts,
            "memory": self.memory,
            "peak_memory": self._memory.peak,
            "peak_memory_per_rank": dict(self._memory.peak_per_rank),
            "engine_calls": self._engine_calls,
            "timings": dict(self.timings),
            "shutdown_thread": self.shutdown_thread,
            "teardown": self.teardown,
            "engine_freed": self.engine_freed,
        }

    # ---- the owner thread --------------------------------------------------
    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """
        Run ``fn(*args, **kwargs)`` on the owner thread (in place when called there).

        Raises
        ------
        SessionError
            If the session has not been opened, or has ended.
        Exception
            Whatever ``fn`` raises.
        """
        if self._owner is None:
            if self._closed:
                raise SessionError(self.ended_message())
            raise SessionError("The engine session is not open; enter it first.")
        return self._owner.run(fn, *args, **kwargs)

    def release_on_engine(self, release: Callable[[], None]) -> None:
        """
        Run ``release()`` on the owner thread while the engine runs, else in place.

        After shutdown the engine's store is gone and releasing is a no-op that
        any thread may do.
        """
        with self._lock:
            owner = self._owner
            on_owner = owner is not None and self._engine() is not None and not self._stopped
        if on_owner:
            try:
                owner.run(release)  # type: ignore[union-attr]
                return
            except SessionError:
                pass
        release()

    def run_with_environment(
        self, env: Mapping[str, str | None], fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        """
        Run ``fn(*args, **kwargs)`` on the owner thread with ``env`` set in this process and on every rank.

        The call runs in a copy of the caller's context (so results name the
        calling task run), as one item of the owner thread's queue: no other
        engine call runs while the variables are set, and the previous values
        are back afterwards, whatever happens.

        Parameters
        ----------
        env : mapping of str to (str or None)
            Environment variables; ``None`` unsets one for the call.
        fn : callable
            Usually :meth:`execute` or :meth:`collect` (which run in place on
            the owner thread).

        Returns
        -------
        Whatever ``fn`` returns.

        Raises
        ------
        SessionError
            If the session is not open.
        Exception
            Whatever ``fn`` raises (the variables are restored first).
        """
        context = contextvars.copy_context()

        def call() -> T:
            with environment(env):
                running = self._check_open()
                running.set_rank_environment(env)
                try:
                    return context.run(fn, *args, **kwargs)
                finally:
                    running.set_rank_environment({name: None for name in env})

        return self.run(call)

    def _check_open(self) -> RunningEngine:
        running = self._engine()
        if self._closed or running is None:
            raise SessionError(self.ended_message())
        return running

    # ---- engine calls ------------------------------------------------------
    def execute(
        self,
        lf: pl.LazyFrame,
        *,
        name: str | None = None,
        lineage: Lineage | None = None,
        inputs: Sequence[GPUResult] = (),
    ) -> GPUResult:
        """
        Run ``lf`` on the engine; the result stays where the engine keeps it.

        A caller that stops waiting (its task run timed out, a signal) leaves
        the engine call running on the owner thread; the result it produces
        then is released at once and counted produced and released unconsumed.

        Parameters
        ----------
        lf : polars.LazyFrame
            The query.
        name : str, optional
            Readable name for the result (default ``"query"``).
        lineage : Lineage, optional
            How to produce the result again (default: ``lf`` itself, see
            :mod:`~prefect_cudf_polars.blocks.results.lineage`).
        inputs : sequence of GPUResult, optional
            The results ``lf`` was built from that this call may claim (a task's
            arguments that were live when it started; one another run claimed
            is not this call's to free). Right after
            the engine call, success or failure, in the same hand-off to the
            owner thread, the claimed ones are freed: what a read left behind,
            and what a deferred one held. The deferred ones are listed as fused
            into the new result (:attr:`GPUResult.fused`).

        Returns
        -------
        GPUResult
            Live, registered in this session.

        Raises
        ------
        ResultConsumedError
            When the query reads a result a second time (cudf-polars' error,
            translated).
        DeviceMemoryError
            When the engine ran out of device memory (names the block fields
            that spill or lower the peak).
        SessionError
            When the session has ended.
        """
        running = self._check_open()
        name = name or "query"
        run = current_run()
        claimed = [r for r in inputs if r.state == "consumed"]
        late = self._late_result(name, run.task_run_id)
        try:
            if self._owner is None:
                raise SessionError(self.ended_message())
            persisted, seconds, memory_after = self._owner.run(
                self._execute_on_owner, running, lf, claimed, on_late=late
            )
        except Exception as exc:
            raise_engine_error(exc, note=_fused_note(exc, fused_steps(claimed)))
        return self._register(
            persisted,
            name=name,
            engine_seconds=seconds,
            lineage=lineage if lineage is not None else Lineage.of_query(lf),
            query=lf,
            memory_after=memory_after,
            run=run,
            fused=fused_steps(claimed),
        )

    def _execute_on_owner(
        self, running: RunningEngine, lf: pl.LazyFrame, claimed: list[GPUResult]
    ) -> tuple[PersistedResult, float, int | None]:
        self._engine_calls += 1
        try:
            started = time.perf_counter()
            persisted = running.execute(lf)
            seconds = time.perf_counter() - started
        finally:
            free_claimed(claimed)
        return persisted, seconds, self._memory.read(running)

    def _late_result(self, name: str, task_run_id: Any) -> Callable[[Any], None]:
        """What to do, on the owner thread, with a result whose caller stopped waiting."""

        def release_late(value: tuple[PersistedResult, float, int | None]) -> None:
            persisted = value[0]
            persisted.release()
            self._registry.late()
            self.monitor.result_released_late(name, task_run_id)

        return release_late

    def defer(
        self,
        lf: pl.LazyFrame,
        *,
        name: str | None = None,
        lineage: Lineage | None = None,
        inputs: Sequence[GPUResult] = (),
        step: FusedStep | None = None,
    ) -> GPUResult:
        """
        Check ``lf`` and keep it as a deferred result, to run fused into its reader's engine call.

        Nothing runs on the engine: the plan's schema is resolved (a column
        that does not exist fails here), and the engine refuses now what it
        would refuse later (on the ``cpu`` backend, the GPU-support check,
        when the block's ``raise_on_fail`` is True; everywhere, a zero-column
        read of a result's frame). The result's reader claims it as any
        result and gets the plan; after the reader's engine call the inputs
        the plan reads are freed. Released unread, it ran nothing and frees
        them too.

        Parameters
        ----------
        lf : polars.LazyFrame
            The step's query.
        name : str, optional
            Readable name for the result (default ``"query"``).
        lineage : Lineage, optional
            How to produce it again (default: ``lf`` itself); a replay defers again.
        inputs : sequence of GPUResult, optional
            The results ``lf`` was built from that this call may claim (as for
            :meth:`execute`); the claimed ones are held by the deferred result
            until its reader's engine call.
        step : FusedStep, optional
            The step's own record (default: ``name`` and the current task run). A
            replay passes the original's (:attr:`GPUResult.deferred_step`, a result
            of the same name), so the step still names the task run that deferred
            it, not the reader that replays it.

        Returns
        -------
        GPUResult
            Live and deferred (:attr:`GPUResult.deferred`), registered in this session.

        Raises
        ------
        polars.exceptions.PolarsError
            When the plan's schema cannot be resolved (polars' own error, with a note
            naming the step, such as ``ColumnNotFoundError`` for a column that does
            not exist).
        NotImplementedError
            When the engine would refuse the plan (nothing has run): on the ``cpu``
            backend, its GPU-support check; on ``spmd``, ``dask`` and ``ray`` that
            check is not run ahead, and a plan cudf-polars refuses fails in the reader.
        SessionError
            When the session has ended.
        """
        running = self._check_open()
        name = name or "query"
        try:
            schema = lf.collect_schema()
            running.check_plan(lf)
        except Exception as exc:
            exc.add_note(
                f"Raised by the deferred step {name!r}: a deferred step resolves its "
                "query's schema and checks its plan before the task that reads it runs it."
            )
            raise
        run = current_run()
        held = [r for r in inputs if r.state == "consumed"]
        own = step if step is not None else FusedStep(name, run.name, None if run.task_run_id is None else str(run.task_run_id))
        return self._register(
            None,
            name=name,
            engine_seconds=0.0,
            lineage=lineage if lineage is not None else Lineage.of_query(lf, deferred=True),
            query=lf,
            memory_after=None,
            run=run,
            fused=(*fused_steps(held), own),
            held=HeldPlan(lf, schema, tuple(held), ()),
        )

    def adopt(
        self, handed: PersistedResult | HeldPlan, *, name: str, lineage: Lineage | None
    ) -> GPUResult:
        """
        A new live result of this session that wraps what a result of it handed over.

        For ``tee``, whose first copy takes over the partitions (or, deferred,
        the plan and held inputs) of the result it splits
        (:meth:`GPUResult.hand_over`).

        Parameters
        ----------
        handed : PersistedResult or HeldPlan
            Handed over by a result of this session.
        name : str
            Readable name of the new result.
        lineage : Lineage or None
            How to produce it again.

        Returns
        -------
        GPUResult
            Deferred when ``handed`` is a :class:`HeldPlan`.

        Raises
        ------
        SessionError
            When the session has ended (what was handed over is released).
        """
        if isinstance(handed, HeldPlan):
            return self._register(
                None,
                name=name,
                engine_seconds=0.0,
                lineage=lineage,
                query=None,
                memory_after=None,
                run=current_run(),
                fused=handed.steps,
                held=handed,
            )
        return self._register(
            handed,
            name=name,
            engine_seconds=0.0,
            lineage=lineage,
            query=None,
            memory_after=self._note_memory(),
            run=current_run(),
        )

    def _register(
        self,
        persisted: PersistedResult | None,
        *,
        name: str,
        engine_seconds: float,
        lineage: Lineage | None,
        query: pl.LazyFrame | None,
        memory_after: int | None,
        run: RunIdentity,
        fused: Sequence[FusedStep] = (),
        held: HeldPlan | None = None,
    ) -> GPUResult:
        result = GPUResult(
            persisted,
            owner=self,
            name=name,
            engine_seconds=engine_seconds,
            lineage=lineage,
            run=run,
            fused=fused,
            plan=None if held is None else held.plan,
            schema=None if held is None else held.schema,
            held_inputs=() if held is None else held.held_inputs,
        )
        if not self._registry.add(result):
            result.session_ended(EndedSession(self.id, self.backend, self.served_run, subflow=self._subflow), drop=False)
            if persisted is not None:
                self.release_on_engine(persisted.release)
            free_claimed(result.held_inputs)
            raise SessionError(self.ended_message())
        self.monitor.result_created(result, query, memory_after=memory_after)
        return result

    def collect(
        self, query: pl.LazyFrame | GPUResult, *, inputs: Sequence[GPUResult] = ()
    ) -> pl.DataFrame:
        """
        Run a query on the engine and return the result on the host.

        When deferred steps ran in this engine call, an artifact on the current
        task run (or flow run) lists them, as a result's artifact does.

        Parameters
        ----------
        query : polars.LazyFrame or GPUResult
            The query; a GPUResult is claimed (read once) and run as it is (a
            deferred one runs its fused plan, in this one engine call).
        inputs : sequence of GPUResult, optional
            As for :meth:`execute`: the claimed ones are freed right after the
            engine call, success or failure, on the owner thread (a GPUResult
            ``query`` is one of them).

        Returns
        -------
        polars.DataFrame

        Raises
        ------
        ResultReleasedError, ResultConsumedError, WrongEngineError
            When ``query`` is a GPUResult that cannot be read (see
            :meth:`GPUResult.check_readable`); nothing has run.
        DeviceMemoryError, SessionError
            As for :meth:`execute`.
        """
        running = self._check_open()
        if isinstance(query, GPUResult):
            inputs = [*inputs, query]
            lf = query.lazy()
        else:
            lf = query
        claimed = [r for r in inputs if r.state == "consumed"]
        fused = fused_steps(claimed)
        try:
            df, seconds = self.run(self._collect_on_owner, running, lf, claimed)
        except Exception as exc:
            raise_engine_error(exc, note=_fused_note(exc, fused))
        self.monitor.collected(fused, engine_seconds=seconds, rows=df.height)
        return df

    def _collect_on_owner(
        self, running: RunningEngine, lf: pl.LazyFrame, claimed: list[GPUResult]
    ) -> tuple[pl.DataFrame, float]:
        self._engine_calls += 1
        try:
            started = time.perf_counter()
            df = running.collect(lf)
            seconds = time.perf_counter() - started
        finally:
            free_claimed(claimed)
        self._memory.read(running)
        return df, seconds

    def memory_in_use(self) -> int | None:
        """
        Bytes held by the engine now (rmm statistics on GPU backends), or ``None``.

        Raises
        ------
        SessionError
            When the session has ended.
        """
        running = self._check_open()
        return self.run(running.memory_in_use)

    def _note_memory(self) -> int | None:
        """Read the engine's memory now, keep the peaks, return the reading."""
        running = self._engine()
        if running is None or self._closed:
            return None
        return self.run(self._memory.read, running)

    # ---- what results ask of their session (ResultOwner) -----------------------
    def result_claimed(self, result: GPUResult) -> None:
        """Record that ``result`` was claimed by its reader (and emit ``result.consumed``)."""
        if self._registry.claimed(result):
            self.monitor.result_consumed(result)

    def result_released(self, result: GPUResult) -> None:
        """Record that ``result`` was released unread (and emit ``result.released``)."""
        self._registry.released(result)
        self.monitor.result_released(result, at_session_end=self._closed)

    # ---- logs ----------------------------------------------------------------
    def _record_run(self) -> None:
        """Record the flow run this session serves, from the current context (once)."""
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if self.flow_run_name is not None or ctx is None or ctx.flow_run is None:
            return
        self.flow_run_name = ctx.flow_run.name
        self._flow_run_id = ctx.flow_run.id
        self._subflow = ctx.flow_run.parent_task_run_id is not None

    def announce(self) -> None:
        """
        Log the session's start line to the current flow run's log (once).

        A session opened outside the flow run's context writes it on its first
        use from inside the flow run instead.
        """
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if self._announced or ctx is None or ctx.flow_run is None:
            return
        self._announced = True
        self._record_run()
        self._log.attach(ctx.flow_run, ctx.flow)
        self.monitor.started(
            ctx.flow_run,
            ctx.flow,
            engine_start_s=self.timings.get("engine_start_s"),
            fallback_warning=self.fallback_warning,
        )
        d = self.description
        self._log.log(
            logging.INFO,
            *lines.start_line(self.backend, d, self.timings.get("engine_start_s", 0.0)),
        )
        if d.get("cluster") or d.get("dashboard"):
            self._log.log(
                logging.INFO,
                "cudf-polars cluster: %s; dashboard %s",
                d.get("cluster", "?"),
                d.get("dashboard") or "none",
            )
        if self.fallback_warning:
            self._log.log(logging.WARNING, "%s", self.fallback_warning)

    def detach_log(self) -> None:
        """Write the remaining lines to Python logging only (at interpreter exit)."""
        self._log.attach(None, None)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._owner else "new")
        return (
            f"EngineSession(id={self.id[:8]}, backend={self.backend}, {state}, "
            f"live_results={len(self._registry.live)})"
        )


def _fused_note(exc: BaseException, steps: Sequence[FusedStep]) -> str | None:
    """
    The note a failed engine call's error gets when it ran deferred steps fused in.

    ``None`` when it ran none, or when the error is or holds a :class:`SessionError`
    (a group member, its cause or its context): the session ended, no step failed.
    """
    if not steps or any(isinstance(e, SessionError) for e in iter_exceptions(exc)):
        return None
    named = ", ".join(f"{step.name!r} ({step.produced_by})" for step in steps)
    return (
        f"This engine call ran the query with {len(steps)} deferred step(s) fused in, upstream "
        f"first: {named}. The error may come from the query or from any of those steps; run "
        "them without defer=True to see which one fails."
    )


def fused_steps(claimed: Sequence[GPUResult]) -> tuple[FusedStep, ...]:
    """The deferred steps that claimed deferred inputs bring into a query, upstream first."""
    return tuple(step for result in claimed if result.deferred for step in result.fused)


def free_claimed(claimed: Sequence[GPUResult]) -> None:
    """Free what claimed inputs still hold (a read's leftovers; a deferred input's held inputs)."""
    for result in claimed:
        if result.state == "consumed":
            result.release()
