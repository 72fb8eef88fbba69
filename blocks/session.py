"""
The engine session: one engine for one flow run, and every rule of its lifetime.

Developer notes
---------------
This module is the one place the lifecycle rules live:

1. **One owner thread.** The engine is created, used and shut down on one
   dedicated thread (``cudf-polars-engine-owner``): rapidsmpf aborts the
   process when an engine is shut down on another thread than the one that
   created it, and Prefect runs tasks, hooks and garbage collection on other
   threads. Every engine call (``execute``, ``collect``, ``release``, memory
   readings) is handed to that thread with :meth:`EngineSession.run`, so engine
   calls are serialized: a single-rank engine has one CUDA stream pool and one
   rank-local store, and cudf-polars does not promise they are thread-safe.
   Serializing costs little: one engine call already uses the whole GPU (its
   own thread pool drives the streaming network), so tasks submitted at once
   queue for the GPU rather than share it; 32 tasks submitted together finish
   with correct results (``tests/reliability/test_concurrency.py``).
2. **A result belongs to its session.** Each
   :class:`~prefect_cudf_polars.tasks.GPUResult` records the id of the session
   that produced it; another session refuses it
   (:class:`~prefect_cudf_polars.tasks.WrongEngineError`).
3. **A result is read at most once.** The first claim
   (:meth:`GPUResult.lazy`) names its consumer; later claims raise
   :class:`~prefect_cudf_polars.tasks.ResultConsumedError`.
4. **Everything is released when the session ends**, however it ends: a normal
   return, an exception, or ``TerminationSignal`` (SIGTERM) all run
   :meth:`EngineSession.close`, which releases every result on the owner
   thread and then shuts the engine down there. ``close`` is idempotent, and it
   waits at most the block's ``teardown_timeout`` for the engine: a Prefect
   process worker cancels a flow run by sending SIGTERM to its whole process
   group, so an owned Dask or Ray cluster is stopping at the same moment and
   may never answer. Past the limit the results are marked released without
   the engine, the end line is logged with a warning, and the process may end.
5. **A result never leaves its process** (see :mod:`prefect_cudf_polars.tasks.result`).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from prefect_cudf_polars.blocks import gpu_probe
from prefect_cudf_polars.blocks.backend import RunningEngine
from prefect_cudf_polars.blocks.engine_errors import raise_engine_error
from prefect_cudf_polars.blocks.monitoring import SessionMonitor
from prefect_cudf_polars.tasks.errors import NoGPUError, SessionError
from prefect_cudf_polars.tasks.lineage import Lineage
from prefect_cudf_polars.tasks.result import GPUResult

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine

T = TypeVar("T")

logger = logging.getLogger("prefect_cudf_polars.session")

#: The session active in this context (set on entry, copied into task threads).
ACTIVE_SESSION: contextvars.ContextVar[EngineSession | None] = contextvars.ContextVar(
    "prefect_cudf_polars_session", default=None
)


def resolve_backend(block: CudfPolarsEngine) -> tuple[str, str | None]:
    """
    Pick the backend to run, from the block and this machine.

    Returns
    -------
    (backend, warning)
        ``warning`` is the text to log when the CPU fallback was taken.

    Raises
    ------
    NoGPUError
        A GPU backend was asked for (explicitly or by ``"auto"``), no usable GPU
        or RAPIDS stack is here, and ``cpu_fallback`` is False.
    """
    if block.backend == "cpu":
        return "cpu", None
    found = gpu_probe.probe()
    if found.problem is None:
        if block.backend != "auto":
            return block.backend, None
        return ("spmd" if found.gpus == 1 else "dask"), None
    if block.cpu_fallback:
        return "cpu", (
            f"backend={block.backend!r} needs an NVIDIA GPU, but {found.problem}; "
            "cpu_fallback=True, so this flow run uses the cpu backend (polars on the "
            "CPU, results in host memory)."
        )
    raise NoGPUError(
        f"backend={block.backend!r} needs an NVIDIA GPU and the RAPIDS packages, but "
        f"{found.problem}. Run on a GPU machine, or set backend='cpu' (or "
        "cpu_fallback=True) on the CudfPolarsEngine block to develop on the CPU."
    )


def _start_backend(backend: str, block: CudfPolarsEngine) -> RunningEngine:
    if backend == "cpu":
        from prefect_cudf_polars.blocks import cpu as module
    elif backend == "spmd":
        from prefect_cudf_polars.blocks import spmd as module
    elif backend == "dask":
        from prefect_cudf_polars.blocks import dask as module
    else:
        from prefect_cudf_polars.blocks import ray as module
    return module.start(block)


class EngineSession:
    """
    One engine for one flow run: owner thread, result registry, teardown.

    Open it with :meth:`CudfPolarsEngine.session` (``with block.session():`` in
    a flow body) or let :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner`
    open it for the flow run. Tasks find it with
    :func:`~prefect_cudf_polars.blocks.get_engine_session`.

    Parameters
    ----------
    block
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
    """

    def __init__(self, block: CudfPolarsEngine) -> None:
        self.id = uuid.uuid4().hex
        self.block = block
        self.backend: str | None = None
        self.description: dict[str, Any] = {}
        self._running: RunningEngine | None = None
        self._owner: ThreadPoolExecutor | None = None
        self._owner_thread: threading.Thread | None = None
        self._lock = threading.RLock()
        self._live: dict[str, GPUResult] = {}
        self._closed = False
        self._stopped = False
        self._token: contextvars.Token[EngineSession | None] | None = None
        self._announced = False
        self._flow_run: Any = None
        self.counts = {"produced": 0, "consumed": 0, "released_unconsumed": 0}
        self.timings: dict[str, float] = {}
        self.memory: dict[str, int | None] = {}
        self.peak_memory: int | None = None
        self.fallback_warning: str | None = None
        # Events and artifacts for the Prefect UI (blocks/monitoring.py).
        self.monitor = SessionMonitor(self)
        #: Name of the thread that shut the engine down (the owner thread), once it has.
        self.shutdown_thread: str | None = None
        #: ``"complete"``, or what the teardown was doing when it stopped waiting.
        self.teardown = "not started"
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
        activate
            Make this the active session of the current context (the flow
            body's and, through Prefect's context copy, its task threads').

        Raises
        ------
        SessionError
            If this session was already opened, or another session is active
            in this context (sessions do not nest).
        NoGPUError
            See :func:`resolve_backend`.
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
            warnings.warn(self.fallback_warning, RuntimeWarning, stacklevel=3)
        self._owner = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"cudf-polars-engine-owner-{self.id[:8]}"
        )
        self._owner_thread = self._owner.submit(threading.current_thread).result()
        started = time.perf_counter()
        try:
            self._running = self.run(_start_backend, self.backend, self.block)
            self.timings["engine_start_s"] = time.perf_counter() - started
            self.description = self.run(self._running.describe)
            self.memory["at_start"] = self.run(self._running.memory_in_use)
        except BaseException:
            self._closed = True
            self._stop_engine()
            raise
        self.peak_memory = self.memory["at_start"]
        if activate:
            self._token = ACTIVE_SESSION.set(self)
        self.announce()
        return self

    @property
    def closed(self) -> bool:
        """Whether the session has ended (its engine is shut down)."""
        return self._closed

    @property
    def live_results(self) -> tuple[GPUResult, ...]:
        """Results produced in this session and not yet consumed or released."""
        with self._lock:
            return tuple(self._live.values())

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
        with self._lock:
            if self._closed:
                return self.summary()
            self._closed = True
            live = list(self._live.values())
        try:
            if self._owner is None or self._stopped:
                for result in live:
                    result._release_at_session_end()
                self.teardown = "complete"
            else:
                self._teardown_with_limit(live)
        finally:
            self._deactivate()
        summary = self.summary()
        self._log(
            logging.INFO,
            "cudf-polars engine session ended: backend=%s, results produced %d, "
            "consumed %d, released unconsumed %d; %s at start %s, before shutdown %s, "
            "peak %s (bytes); engine start %.2f s, shutdown %.2f s on thread %s",
            self.backend,
            self.counts["produced"],
            self.counts["consumed"],
            self.counts["released_unconsumed"],
            "host store" if self.backend == "cpu" else "device memory (rmm statistics)",
            self.memory.get("at_start"),
            self.memory.get("before_shutdown"),
            self.peak_memory,
            self.timings.get("engine_start_s", 0.0),
            self.timings.get("engine_shutdown_s", 0.0),
            self.shutdown_thread,
        )
        if self.teardown != "complete":
            self._log(
                logging.WARNING,
                "cudf-polars engine session teardown %s: the engine did not answer. A "
                "Prefect process worker cancels a flow run with SIGTERM to its whole "
                "process group, an owned Dask or Ray cluster included, so the engine's "
                "processes may be gone; the CUDA driver frees the device memory of "
                "processes that end. If a normal teardown needs longer, raise "
                "teardown_timeout on the engine block.",
                self.teardown,
            )
        self.monitor.ended(summary)
        return summary

    def _teardown_with_limit(self, live: list[GPUResult]) -> None:
        """Release ``live`` and shut down on the owner thread; wait at most ``teardown_timeout``."""
        assert self._owner is not None
        limit = self.block.teardown_timeout
        self._teardown_step = "waiting for the engine's current call to finish"
        done = self._owner.submit(self._teardown_on_owner, live)
        try:
            done.result(timeout=limit)
        except FutureTimeout:
            with self._lock:
                self._stopped = True  # later releases must not queue behind the stuck call
            self.teardown = f"stopped waiting after {limit:g} s while {self._teardown_step}"
            for result in live:
                result._abandon_at_session_end()
            # The teardown stays queued: if the engine answers later it still shuts down.
            self._owner.shutdown(wait=False)
            return
        self._owner.shutdown(wait=True)
        self.teardown = "complete"

    def _teardown_on_owner(self, live: list[GPUResult]) -> None:
        try:
            self._teardown_step = "releasing results on the ranks"
            for result in live:
                result._release_at_session_end()
            if self._running is not None:
                self._teardown_step = "reading device memory"
                self.memory["before_shutdown"] = self._running.memory_in_use()
        finally:
            self._teardown_step = "shutting the engine down"
            self._shutdown_on_owner()

    def _stop_engine(self) -> None:
        """Shut the engine down on the owner thread and end that thread (a failed open)."""
        if self._owner is None or self._stopped:
            return
        try:
            self._owner.submit(self._shutdown_on_owner).result()
        finally:
            self._owner.shutdown(wait=True)

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
            highest reading after an engine call), ``timings`` (seconds),
            ``shutdown_thread`` and ``teardown`` (``"complete"``, or what the
            teardown was doing when it stopped waiting for the engine).
        """
        return {
            "session_id": self.id,
            "backend": self.backend,
            "gpus": self.description.get("gpus", []),
            "counts": dict(self.counts),
            "memory": dict(self.memory),
            "peak_memory": self.peak_memory,
            "timings": dict(self.timings),
            "shutdown_thread": self.shutdown_thread,
            "teardown": self.teardown,
        }

    # ---- the owner thread --------------------------------------------------
    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """
        Run ``fn(*args, **kwargs)`` on the owner thread and return its result.

        Called from the owner thread itself, it runs ``fn`` in place.

        Raises
        ------
        SessionError
            If the session has not been opened or is shut down.
        Exception
            Whatever ``fn`` raises.
        """
        if threading.current_thread() is self._owner_thread:
            return fn(*args, **kwargs)
        if self._owner is None:
            raise SessionError("The engine session is not open; enter it first.")
        try:
            future = self._owner.submit(fn, *args, **kwargs)
        except RuntimeError:
            raise SessionError(
                "The engine session has ended (its flow run is over); open a new "
                "session to run more queries."
            ) from None
        return future.result()

    def run_if_open(self, fn: Callable[[], None]) -> None:
        """
        Run ``fn()`` on the owner thread while the engine runs, else in place.

        For releases: after shutdown the engine's store is gone and releasing
        is a no-op that any thread may do.
        """
        with self._lock:
            on_owner = self._owner is not None and self._running is not None and not self._stopped
        if on_owner:
            try:
                self.run(fn)
                return
            except SessionError:
                pass
        fn()

    def _check_open(self) -> RunningEngine:
        if self._closed or self._running is None:
            raise SessionError(
                "The engine session has ended (its flow run is over); open a new "
                "session to run more queries."
            )
        return self._running

    # ---- engine calls ------------------------------------------------------
    def execute(
        self, lf: pl.LazyFrame, *, name: str | None = None, lineage: Lineage | None = None
    ) -> GPUResult:
        """
        Run ``lf`` on the engine; the result stays where the engine keeps it.

        Parameters
        ----------
        lf
            The query.
        name
            Readable name for the result (default ``"query"``).
        lineage
            How to produce the result again (default: ``lf`` itself, see
            :mod:`~prefect_cudf_polars.tasks.lineage`).

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
        started = time.perf_counter()
        try:
            persisted = self.run(running.execute, lf)
        except BaseException as exc:
            raise_engine_error(exc)
        seconds = time.perf_counter() - started
        return self._register(
            persisted,
            name=name or "query",
            engine_seconds=seconds,
            lineage=lineage if lineage is not None else Lineage.of_query(lf),
            query=lf,
        )

    def _register(
        self,
        persisted: Any,
        *,
        name: str,
        engine_seconds: float,
        lineage: Lineage | None,
        query: pl.LazyFrame | None = None,
    ) -> GPUResult:
        """Wrap an engine's persisted result in a live GPUResult of this session (``query``: its plan, if any)."""
        result = GPUResult(
            persisted,
            session=self,
            name=name,
            ranks=list(getattr(persisted, "_ranks", [0])),
            engine_seconds=engine_seconds,
            lineage=lineage,
        )
        with self._lock:
            if self._closed:
                self.run(persisted.release)
                raise SessionError("The engine session ended while the query ran.")
            self._live[result.id] = result
            self.counts["produced"] += 1
        memory_after = self._note_memory()
        self.monitor.result_created(result, query, memory_after=memory_after)
        return result

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        """
        Run ``lf`` on the engine and return the result on the host.

        Raises
        ------
        ResultConsumedError, DeviceMemoryError, SessionError
            As for :meth:`execute`.
        """
        running = self._check_open()
        try:
            df = self.run(running.collect, lf)
        except BaseException as exc:
            raise_engine_error(exc)
        self._note_memory()
        return df

    def memory_in_use(self) -> int | None:
        """Bytes held by the engine now (rmm statistics on GPU backends), or ``None``."""
        running = self._check_open()
        return self.run(running.memory_in_use)

    def _note_memory(self) -> int | None:
        """Read the engine's memory after an engine call, keep the peak, return the reading."""
        if self._running is None or self._closed:
            return None
        value = self.run(self._running.memory_in_use)
        if value is not None and (self.peak_memory is None or value > self.peak_memory):
            self.peak_memory = value
        return value

    # ---- the registry (called by GPUResult) ------------------------------------
    def _claimed(self, result: GPUResult) -> None:
        with self._lock:
            if self._live.pop(result.id, None) is None:
                return
            self.counts["consumed"] += 1
        self.monitor.result_consumed(result)

    def _released(self, result: GPUResult, *, unconsumed: bool) -> None:
        with self._lock:
            self._live.pop(result.id, None)
            if unconsumed:
                self.counts["released_unconsumed"] += 1
        if unconsumed:
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
        self._flow_run = (ctx.flow_run, ctx.flow)
        self.monitor.started(ctx.flow_run, ctx.flow)
        d = self.description
        versions = ", ".join(f"{k} {v}" for k, v in d.get("versions", {}).items())
        gpus = d.get("gpus") or []
        self._log(
            logging.INFO,
            "cudf-polars engine session started: backend=%s (%s); %s; %s; %s; engine start %.2f s",
            self.backend,
            d.get("note", ""),
            f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "no GPU in use",
            f"{d.get('ranks', 1)} rank(s)",
            versions,
            self.timings.get("engine_start_s", 0.0),
        )
        if d.get("cluster") or d.get("dashboard"):
            self._log(
                logging.INFO,
                "cudf-polars cluster: %s; dashboard %s",
                d.get("cluster", "?"),
                d.get("dashboard") or "none",
            )
        if self.fallback_warning:
            self._log(logging.WARNING, "%s", self.fallback_warning)

    def _log(self, level: int, msg: str, *args: Any) -> None:
        if self._flow_run is not None:
            from prefect.logging.loggers import flow_run_logger

            flow_run, flow = self._flow_run
            flow_run_logger(flow_run=flow_run, flow=flow).log(level, msg, *args)
        else:
            logger.log(level, msg, *args)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._owner else "new")
        return (
            f"EngineSession(id={self.id[:8]}, backend={self.backend}, {state}, "
            f"live_results={len(self._live)})"
        )
