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
   :meth:`EngineSession.close`. ``close`` closes the registry, then, as the
   owner thread's last call, releases every live result, reads the memory and
   shuts the engine down. It is idempotent, and it waits at most the block's
   ``teardown_timeout`` (seconds) for the engine: a Prefect process worker
   cancels a flow run by sending SIGTERM to its whole process group, so an
   owned Dask or Ray cluster is stopping at the same moment and may never
   answer. Past the limit the live results are marked released without the
   engine (:meth:`GPUResult.mark_released`), the end line is logged with a
   warning, and the process may end; the queued teardown still runs if the
   engine answers.
5. **A result never leaves its process**: pickling a ``GPUResult`` raises.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from prefect_cudf_polars.blocks.active import ACTIVE_SESSION
from prefect_cudf_polars.blocks.backends.choice import resolve_backend, start_backend
from prefect_cudf_polars.blocks.backends.engine_errors import raise_engine_error
from prefect_cudf_polars.blocks.backends.environment import environment
from prefect_cudf_polars.blocks.errors import SessionError
from prefect_cudf_polars.blocks.monitoring.monitor import SessionMonitor
from prefect_cudf_polars.blocks.results.lineage import Lineage
from prefect_cudf_polars.blocks.results.result import GPUResult
from prefect_cudf_polars.blocks.session import lines
from prefect_cudf_polars.blocks.session.memory import MemoryTracker
from prefect_cudf_polars.blocks.session.owner import ENDED_MESSAGE, OwnerThread
from prefect_cudf_polars.blocks.session.registry import ResultRegistry
from prefect_cudf_polars.blocks.session.warning_origin import user_stacklevel

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.backends.base import PersistedResult, RunningEngine
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine

T = TypeVar("T")


class EngineSession:
    """
    One engine for one flow run: owner thread, result registry, teardown.

    Open it with :meth:`CudfPolarsEngine.session` (``with block.session():`` in
    a flow body) or let :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner`
    open it for the flow run. Tasks find it with
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
    monitor : SessionMonitor
        The session's events and artifacts.
    shutdown_thread : str or None
        Name of the thread that shut the engine down (the owner thread), once it has.
    teardown : str
        ``"not started"``, ``"complete"``, or what the teardown was doing when
        it stopped waiting for the engine.
    """

    def __init__(self, block: CudfPolarsEngine) -> None:
        self.id = uuid.uuid4().hex
        self.block = block
        self.backend: str | None = None
        self.description: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self.fallback_warning: str | None = None
        self.monitor = SessionMonitor(self)
        self.shutdown_thread: str | None = None
        self.teardown = "not started"
        self._running: RunningEngine | None = None
        self._owner: OwnerThread | None = None
        self._registry = ResultRegistry()
        self._memory = MemoryTracker()
        self._log = lines.SessionLog()
        self._lock = threading.Lock()
        self._closed = False
        self._stopped = False  # the engine is shut down, or no longer answers
        self._token: contextvars.Token[Any] | None = None
        self._announced = False
        self._teardown_step = ""

    # ---- lifecycle -------------------------------------------------------
    def __enter__(self) -> EngineSession:
        self.open(activate=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, *, activate: bool) -> EngineSession:
        """
        Start the engine on a new owner thread.

        Parameters
        ----------
        activate : bool
            Make this the active session of the current context (the flow
            body's and, through Prefect's context copy, its task threads').

        Returns
        -------
        EngineSession
            This session, open.

        Raises
        ------
        SessionError
            If this session was already opened, or another session is active
            in this context (sessions do not nest).
        NoGPUError
            A GPU backend was asked for and no usable GPU or RAPIDS stack is
            here (see :func:`~prefect_cudf_polars.blocks.backends.choice.resolve_backend`).
        Exception
            Whatever the backend raises when its engine cannot start (for example
            :class:`~prefect_cudf_polars.blocks.backends.dask.cluster.DaskClusterError`);
            what was started is shut down first.
        """
        if self._owner is not None or self._closed:
            raise SessionError(
                "This engine session was already opened; open a new one with "
                "CudfPolarsEngine.session()."
            )
        if activate and (outer := ACTIVE_SESSION.get()) is not None and not outer.closed:
            raise SessionError(
                f"An engine session ({outer.backend}, id {outer.id}) is already active "
                "here; sessions do not nest. Use the active one "
                "(prefect_cudf_polars.blocks.get_engine_session()), or do not combine "
                "CudfPolarsTaskRunner with `with block.session():` in one flow."
            )
        self.backend, self.fallback_warning = resolve_backend(self.block)
        if self.fallback_warning:
            # Once as a Python warning here; announce() logs it once to the flow run.
            warnings.warn(self.fallback_warning, RuntimeWarning, stacklevel=user_stacklevel())
        self._owner = OwnerThread(f"cudf-polars-engine-owner-{self.id[:8]}")
        try:
            self._owner.run(self._start_on_owner)
        except BaseException:
            self._closed = True
            self._stop_engine()
            raise
        if activate:
            self._token = ACTIVE_SESSION.set(self)
        self.announce()
        return self

    def _start_on_owner(self) -> None:
        started = time.perf_counter()
        self._running = running = start_backend(self.backend, self.block)  # type: ignore[arg-type]
        self.timings["engine_start_s"] = time.perf_counter() - started
        self.description = running.describe()
        self._memory.record("at_start", running)

    @property
    def closed(self) -> bool:
        """Whether the session has ended (its engine is shut down)."""
        return self._closed

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
        return self._running

    def close(self) -> dict[str, Any]:
        """
        End the session: release every live result, then shut the engine down.

        Both happen on the owner thread, and ``close`` waits for them at most the
        block's ``teardown_timeout`` (seconds). Past it, the results still live are
        marked released without the engine, ``summary()["teardown"]`` says what
        the teardown was doing, a warning is logged, and the teardown stays
        queued on the owner thread in case the engine answers later. Idempotent:
        later calls return the same summary and do nothing else.

        Returns
        -------
        dict
            The session summary (see :meth:`summary`).
        """
        live = self._registry.close()
        if live is None:
            return self.summary()
        self._closed = True
        try:
            if self._owner is None or self._stopped:
                for result in live:
                    result.release()
                self.teardown = "complete"
            else:
                self._teardown_with_limit(live)
        finally:
            self._deactivate()
        summary = self.summary()
        self._log.log(logging.INFO, *lines.end_line(summary))
        if self.teardown != "complete":
            self._log.log(logging.WARNING, lines.TEARDOWN_WARNING, self.teardown)
        self.monitor.ended(summary)
        return summary

    def _teardown_with_limit(self, live: list[GPUResult]) -> None:
        assert self._owner is not None
        limit = self.block.teardown_timeout
        self._teardown_step = "waiting for the engine's current call to finish"
        if self._owner.finish(lambda: self._teardown_on_owner(live), timeout=limit):
            self.teardown = "complete"
            return
        with self._lock:
            self._stopped = True  # later releases must not queue behind the stuck call
        self.teardown = f"stopped waiting after {limit:g} s while {self._teardown_step}"
        for result in live:
            result.mark_released()

    def _teardown_on_owner(self, live: list[GPUResult]) -> None:
        try:
            self._teardown_step = "releasing results on the ranks"
            for result in live:
                result.release()
            if self._running is not None:
                self._teardown_step = "reading device memory"
                self._memory.record("before_shutdown", self._running)
        finally:
            self._teardown_step = "shutting the engine down"
            self._shutdown_on_owner()

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

    def _deactivate(self) -> None:
        if self._token is None:
            return
        try:
            ACTIVE_SESSION.reset(self._token)
        except ValueError:  # closed from another context (a task runner's exit)
            if ACTIVE_SESSION.get() is self:
                ACTIVE_SESSION.set(None)
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
            ``shutdown_thread`` and ``teardown`` (``"complete"``, or what the
            teardown was doing when it stopped waiting for the engine).
        """
        return {
            "session_id": self.id,
            "backend": self.backend,
            "gpus": self.description.get("gpus", []),
            "counts": self.counts,
            "memory": self.memory,
            "peak_memory": self._memory.peak,
            "peak_memory_per_rank": dict(self._memory.peak_per_rank),
            "timings": dict(self.timings),
            "shutdown_thread": self.shutdown_thread,
            "teardown": self.teardown,
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
            raise SessionError("The engine session is not open; enter it first.")
        return self._owner.run(fn, *args, **kwargs)

    def release_on_engine(self, release: Callable[[], None]) -> None:
        """
        Run ``release()`` on the owner thread while the engine runs, else in place.

        After shutdown the engine's store is gone and releasing is a no-op that
        any thread may do.
        """
        with self._lock:
            on_owner = self._owner is not None and self._running is not None and not self._stopped
        if on_owner:
            try:
                self.run(release)
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
        if self._closed or self._running is None:
            raise SessionError(ENDED_MESSAGE)
        return self._running

    # ---- engine calls ------------------------------------------------------
    def execute(
        self, lf: pl.LazyFrame, *, name: str | None = None, lineage: Lineage | None = None
    ) -> GPUResult:
        """
        Run ``lf`` on the engine; the result stays where the engine keeps it.

        Parameters
        ----------
        lf : polars.LazyFrame
            The query.
        name : str, optional
            Readable name for the result (default ``"query"``).
        lineage : Lineage, optional
            How to produce the result again (default: ``lf`` itself, see
            :mod:`~prefect_cudf_polars.blocks.results.lineage`).

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
        try:
            persisted, seconds, memory_after = self.run(self._execute_on_owner, running, lf)
        except BaseException as exc:
            raise_engine_error(exc)
        return self._register(
            persisted,
            name=name or "query",
            engine_seconds=seconds,
            lineage=lineage if lineage is not None else Lineage.of_query(lf),
            query=lf,
            memory_after=memory_after,
        )

    def _execute_on_owner(
        self, running: RunningEngine, lf: pl.LazyFrame
    ) -> tuple[PersistedResult, float, int | None]:
        started = time.perf_counter()
        persisted = running.execute(lf)
        seconds = time.perf_counter() - started
        return persisted, seconds, self._memory.read(running)

    def adopt(
        self, persisted: PersistedResult, *, name: str, lineage: Lineage | None
    ) -> GPUResult:
        """
        A new live result of this session that wraps an existing persisted result.

        For ``tee``, whose first copy takes over the partitions of the result it
        splits (:meth:`GPUResult.hand_over`).

        Parameters
        ----------
        persisted : PersistedResult
            Handed over by a result of this session.
        name : str
            Readable name of the new result.
        lineage : Lineage or None
            How to produce it again.

        Returns
        -------
        GPUResult

        Raises
        ------
        SessionError
            When the session has ended (``persisted`` is released).
        """
        return self._register(
            persisted,
            name=name,
            engine_seconds=0.0,
            lineage=lineage,
            query=None,
            memory_after=self._note_memory(),
        )

    def _register(
        self,
        persisted: PersistedResult,
        *,
        name: str,
        engine_seconds: float,
        lineage: Lineage | None,
        query: pl.LazyFrame | None,
        memory_after: int | None,
    ) -> GPUResult:
        result = GPUResult(
            persisted, owner=self, name=name, engine_seconds=engine_seconds, lineage=lineage
        )
        if not self._registry.add(result):
            self.release_on_engine(persisted.release)
            raise SessionError("The engine session ended while the query ran.")
        self.monitor.result_created(result, query, memory_after=memory_after)
        return result

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        """
        Run ``lf`` on the engine and return the result on the host.

        Parameters
        ----------
        lf : polars.LazyFrame
            The query.

        Returns
        -------
        polars.DataFrame

        Raises
        ------
        ResultConsumedError, DeviceMemoryError, SessionError
            As for :meth:`execute`.
        """
        running = self._check_open()
        try:
            return self.run(self._collect_on_owner, running, lf)
        except BaseException as exc:
            raise_engine_error(exc)

    def _collect_on_owner(self, running: RunningEngine, lf: pl.LazyFrame) -> pl.DataFrame:
        df = running.collect(lf)
        self._memory.read(running)
        return df

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
        if self._running is None or self._closed:
            return None
        return self.run(self._memory.read, self._running)

    # ---- what results ask of their session (ResultOwner) -----------------------
    def result_claimed(self, result: GPUResult) -> None:
        """Record that ``result`` was claimed by its reader (and emit ``result.consumed``)."""
        if self._registry.claimed(result):
            self.monitor.result_consumed(result)

    def result_released(self, result: GPUResult) -> None:
        """Record that ``result`` was released unread (and emit ``result.released``)."""
        self._registry.released(result)
        self.monitor.result_released(result)

    # ---- logs ----------------------------------------------------------------
    def announce(self) -> None:
        """
        Log the session's start line to the current flow run's log (once).

        A task runner opens its session before the flow run's context exists,
        so the line is written on first use from inside the flow run instead.
        """
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if self._announced or ctx is None or ctx.flow_run is None:
            return
        self._announced = True
        self._log.attach(ctx.flow_run, ctx.flow)
        self.monitor.started(ctx.flow_run, ctx.flow)
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

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._owner else "new")
        return (
            f"EngineSession(id={self.id[:8]}, backend={self.backend}, {state}, "
            f"live_results={len(self._registry.live)})"
        )

