"""
The engine session: one flow run's scope, its results and every rule of its lifetime.

1. **One owner thread**: the :class:`~prefect_cudf_polars.blocks.engine.EngineHost` creates, uses
   and shuts down the engine, and holds what it owns in one exit stack.
2. **A result belongs to its session and is read by one query**: a task's engine call checks its
   inputs against the task's session first (``WrongEngineError``); a first claim is counted here
   (:meth:`EngineSession.claimed`), a second raises ``ResultConsumedError``.
3. **Everything is released when the session ends**, however it ends (return, exception,
   ``TerminationSignal``): :meth:`EngineSession.close` marks every live result released and shuts the
   engine down once on its owner thread, within the block's ``teardown_timeout`` (3 s while the flow
   run is being stopped: a Prefect process worker checks every 3 s whether its processes are gone);
   the engine and its memory resource are freed by the time ``close`` returns (on Ray the results are
   released first). The last session SIGTERM ends also reaps multiprocessing's resource tracker.
4. **The engine opens at the first GPU call**; one that cannot start fails that task run and every
   later GPU call of the run. **Subflows** share the parent's engine host when their blocks are equal
   (:mod:`~prefect_cudf_polars.blocks.nesting`). **A session left open at interpreter exit** is closed
   then, with one warning (:mod:`~prefect_cudf_polars.blocks.exits`).
"""

from __future__ import annotations

import contextvars
import enum
import gc
import threading
import uuid
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from prefect.exceptions import TerminationSignal

from prefect_cudf_polars.blocks import active, exits
from prefect_cudf_polars.blocks.backends.choice import resolve_backend
from prefect_cudf_polars.blocks.backends.compat import stop_resource_tracker
from prefect_cudf_polars.blocks.engine import EngineHost, ended_within
from prefect_cudf_polars.blocks.nesting import shared_host
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.active import get_engine_session  # noqa: F401 (also importable from here)
from prefect_cudf_polars.blocks.errors import ENDED_WITH_BLOCK, ENDED_WITH_RUN, SessionError
from prefect_cudf_polars.blocks.memory import MemoryLedger
from prefect_cudf_polars.blocks.result_book import ResultBook
from prefect_cudf_polars.blocks.result_owner import EndedSession
from prefect_cudf_polars.blocks.results import GPUResult
from prefect_cudf_polars.blocks.session_calls import EngineCalls
from prefect_cudf_polars.blocks.telemetry import SessionTelemetry, logger, user_stacklevel

T = TypeVar("T")

#: What a session whose engine never started reports of held memory: no limit, nothing held.
NO_LEDGER = MemoryLedger()
#: Seconds the teardown waits for the engine at most while the flow run is being stopped.
TERMINATING_TEARDOWN_S = 3.0
#: Seconds the last session SIGTERM ends waits at most for multiprocessing's resource tracker to end.
TRACKER_WAIT_S = 2.0


class State(enum.Enum):
    """Where a session is in its life: ``NEW`` -> ``OPEN`` -> ``CLOSED``."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class EngineSession(EngineCalls):
    """
    One engine for one flow run: its results, their counts, its end.

    Open it with :meth:`CudfPolarsEngine.session` (``with block.session():`` in a flow body) or let
    :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner` open it at the flow run's first GPU call.
    Tasks find it with :func:`get_engine_session`.

    Attributes
    ----------
    id : str
        Session id (32 hex characters).
    block : CudfPolarsEngine
    state : State
    backend : str or None
        ``"spmd"``, ``"dask"``, ``"ray"`` or ``"cpu"`` once open.
    description : dict
        Backend, GPU names, ranks and versions (once open).
    timings : dict of str to float
        ``engine_start_s``, ``admission_wait_s`` and ``engine_shutdown_s``, in seconds.
    fallback_warning : str or None
        Why ``cpu`` runs instead of the GPU backend asked for (said once, in the flow run's log).
    teardown : str
        ``"not started"``, ``"complete"``, or why the end stopped waiting for the engine.
    host : EngineHost or None
        The engine host it runs on once open (a subflow's session may share its parent's).
    held : MemoryLedger
        Its engine host's ledger of the results held on the engine, once open (shared with the sessions on the
        same host: a flow run and the subflows on its block).
    """

    def __init__(self, block: CudfPolarsEngine) -> None:
        self.id, self.block, self.state = uuid.uuid4().hex, block, State.NEW
        self.backend: str | None = None
        self.description: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self.fallback_warning: str | None = None
        self.teardown, self._opened_by = "not started", ""
        self.host: EngineHost | None = None
        self._owns_host = self._announced = False
        self._closing = False  # close() under way (past waiting for the runs it serves, its book is closed)
        self._token: contextvars.Token[Any] | None = None
        self._lock, self._book, self._engine_calls = threading.Lock(), ResultBook(), 0
        self.held = NO_LEDGER
        self._memory: dict[str, int | None] = {}
        self._shutdown_thread: str | None = None
        self._served, self._telemetry = active.ServedRuns(), SessionTelemetry(self.id, block.result_artifacts)

    # ---- opening -------------------------------------------------------------
    def __enter__(self) -> EngineSession:
        return self.open(activate=True)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(terminating=isinstance(exc, TerminationSignal))

    def open(self, *, activate: bool, parent: EngineSession | None = None) -> EngineSession:
        """
        Start the engine on a new engine host, or run on the enclosing flow run's host; returns ``self``.

        ``activate`` makes this the innermost session provider here (``with block.session():``), and the
        enclosing flow run's session is found here; a subflow's runner passes its ``parent`` session instead.

        Raises
        ------
        SessionError
            It was opened before; this flow run already has a session; or it
            would need a second GPU engine beside the enclosing flow run's.
        NoGPUError
            A GPU backend was asked for and no usable GPU or RAPIDS stack is here.
        Exception
            What the engine's start, or a later step of the opening, raised (what it started is shut down).
        """
        if self.state is not State.NEW or self._closing:
            raise SessionError("This engine session was already opened; open a new one with CudfPolarsEngine.session().")
        self._opened_by = "`with block.session():`" if activate else "CudfPolarsTaskRunner"
        self._record_run()
        shared = shared_host(self, active.innermost() if activate else None, parent, flow_run=active.flow_run_context())
        if shared is not None:
            self.host, self.backend, self.timings["engine_start_s"] = shared.host, shared.backend, 0.0
            note = f"{shared.description.get('note', '')}; on the engine of session {shared.id[:8]} ({shared.served_run})"
            self.description = {**shared.description, "note": note}
        else:  # a host of its own
            self.backend, self.fallback_warning = resolve_backend(self.block)
            if self.fallback_warning and self._telemetry.flow_run is None:
                warnings.warn(self.fallback_warning, RuntimeWarning, stacklevel=user_stacklevel())
            self.host = EngineHost.start(self.backend, self.block, name=f"cudf-polars-engine-owner-{self.id[:8]}",
                                         ended=self.ended_message, log=self._telemetry.log, flow_run_id=self.flow_run_id)
            self._owns_host, self.description = True, self.host.description
            self.timings.update(engine_start_s=self.host.start_seconds, admission_wait_s=self.host.admission.seconds)
        try:
            at_start = self.host.at_start if self._owns_host else self.host.read()  # type: ignore[union-attr]
            self._memory["at_start"] = self._telemetry.note(at_start).memory
            self.held = self.host.ledger  # type: ignore[union-attr]
            self._telemetry.backend, self.state = self.backend, State.OPEN
            exits.opened(self)
            if activate:
                self._token = active.enter(self)
        except BaseException:  # nothing has run: end what this opening started
            self.state, self._closing = State.CLOSED, True
            exits.closed(self)  # nothing to close at interpreter exit
            if self._owns_host:
                self.host.shutdown(self.block.teardown_timeout)  # type: ignore[union-attr]
            raise
        self.announce()
        return self

    def _record_run(self) -> None:
        if self._telemetry.flow_run is None and (ctx := active.flow_run_context()) is not None:
            self._telemetry.flow_run, self._telemetry.flow = ctx.flow_run, ctx.flow  # write to its log from now on

    def announce(self) -> None:
        """Write the start line and ``engine.started`` at the session's first use inside its flow run (once)."""
        if self._announced or active.flow_run_context() is None:
            return
        with self._lock:
            first, self._announced = not self._announced, True
        if first:
            self._record_run()
            self._telemetry.started(self.description, self.timings.get("engine_start_s", 0.0), self.fallback_warning)

    # ---- what it is ------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether the session has ended (or is ending: its book admits no more results): it runs no more queries."""
        return self.state is State.CLOSED or not self._book.open

    @property
    def served_run(self) -> str | None:
        """``"flow run 'name'"`` or ``"subflow run 'name'"``: the run the session serves, once known."""
        run = self._telemetry.flow_run
        return None if run is None else f"{'subflow' if self.subflow else 'flow'} run {run.name!r}"

    @property
    def subflow(self) -> bool:
        """Whether the run it serves is a subflow run."""
        return getattr(self._telemetry.flow_run, "parent_task_run_id", None) is not None

    @property
    def flow_run_id(self) -> Any:
        """The id of the flow run the session serves, once known."""
        return getattr(self._telemetry.flow_run, "id", None)

    @property
    def live_results(self) -> tuple[GPUResult, ...]:
        """Results produced here and not yet consumed or released."""
        return tuple(self._book.results()[1])

    @property
    def counts(self) -> dict[str, int]:
        """Results ``produced``, ``consumed`` and ``released_unconsumed`` so far."""
        return self._book.counts

    @property
    def memory(self) -> dict[str, int | None]:
        """Memory readings in bytes: ``at_start`` and, once ended, ``at_end`` (what the engine held then)."""
        return dict(self._memory)

    @property
    def running_engine(self) -> Any:
        """The backend's running engine while the session is open (for measuring the bare engine beside it)."""
        return None if self.closed or self.host is None else self.host.running

    def ended_message(self) -> str:
        """What a call into this session says once it has ended."""
        where = f" in {self.served_run}" if self.served_run else ""
        template = ENDED_WITH_BLOCK if self._opened_by.startswith("`with") else ENDED_WITH_RUN
        return template.format(id=self.id, by=self._opened_by or "not opened", where=where, limit=self.block.teardown_timeout)

    def summary(self) -> dict[str, Any]:
        """What the session did: ``session_id``, ``backend``, ``gpus``, ``counts``, ``memory`` (bytes ``at_start``
        and ``at_end``: rmm statistics, or the ``cpu`` host store), ``peak_memory`` and ``peak_memory_per_rank``
        (bytes), ``engine_calls``, ``timings`` (seconds), ``shutdown_thread``, ``teardown``, ``dashboard`` and
        ``held`` (:meth:`MemoryLedger.summary <prefect_cudf_polars.blocks.memory.MemoryLedger.summary>`, of the host)."""
        return {"session_id": self.id, "backend": self.backend, "gpus": list(self.description.get("gpus", [])),
                "counts": self.counts, "memory": self.memory, "peak_memory": self._telemetry.peak,
                "peak_memory_per_rank": dict(self._telemetry.peak_per_rank), "engine_calls": self._engine_calls,
                "timings": dict(self.timings), "shutdown_thread": self._shutdown_thread, "teardown": self.teardown,
                "dashboard": self.description.get("dashboard"), "held": self.held.summary()}

    def __repr__(self) -> str:
        return f"EngineSession(id={self.id[:8]}, backend={self.backend}, {self.state.value}, live={len(self.live_results)})"

    # ---- as a session provider (with block.session()) ----------------------------
    @property
    def provided_session(self) -> EngineSession | None:
        """This session while it is open."""
        return None if self.closed else self

    def provide_session(self) -> EngineSession:
        """This session, for the code inside its with block (announced there); ``SessionError`` once it has ended."""
        if self.closed:
            raise SessionError(self.ended_message())
        self.announce()
        return self

    def serve(self, future: Any) -> None:
        """Make the session's end wait for the task run of ``future`` (bounded by ``teardown_timeout``)."""
        self._served.add(future)

    # ---- engine calls ------------------------------------------------------------
    def _check_open(self) -> EngineHost:
        host = self.host
        if self.closed or host is None:
            raise SessionError(self.ended_message())
        return host

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine's owner thread; raises ``SessionError`` when the session is not open."""
        return self._check_open().run(fn, *args)

    def memory_in_use(self) -> int | None:
        """Bytes the engine holds now (rmm statistics on GPU backends, summed over ranks); ``SessionError`` once ended."""
        return self._telemetry.note(self._check_open().read()).memory

    # ---- what results ask of their session (ResultOwner) ---------------------------
    def reader_here(self) -> EngineSession | None:
        """The session active in this context, which a claim here would read for (``None``: none)."""
        return getattr(active.innermost(), "provided_session", None)

    def claimed(self, result: GPUResult) -> None:
        """Count ``result`` consumed (its first claim), know its frame by its cache id, and send ``result.consumed``."""
        if self._book.leave(result, "consumed"):
            self._telemetry.result_consumed(result)

    def released(self, result: GPUResult) -> None:
        """Count ``result`` released unread (once) and send ``result.released``."""
        if self._book.leave(result, "released_unconsumed"):
            self._telemetry.result_released(result, at_session_end=False)

    def free(self, persisted: Any) -> None:
        """Release ``persisted`` on the owner thread, without waiting for it; once the engine has shut down, let it go."""
        host = self.host  # read once: the session's end may set it to None meanwhile
        if host is None or not host.post(persisted.release):
            persisted.forget()  # the shutdown closed its store

    # ---- the end -----------------------------------------------------------------
    def close(self, *, terminating: bool = False) -> dict[str, Any]:
        """
        End the session (idempotent) and return its :meth:`summary`.

        A ``with block.session():`` first waits for the GPU task runs submitted inside it; then every live
        result is marked released and the engine shut down as the owner thread's last call; a session on a
        shared engine releases only its own results there. Each wait is at most the block's
        ``teardown_timeout`` (seconds), 3 s when ``terminating`` (SIGTERM, a cancellation); past it, the calls
        still queued for the engine fail with ``SessionError``. A failed teardown is in ``teardown``; one that
        is interrupted (``KeyboardInterrupt``, a cancellation) queues the engine's end on its owner thread
        without waiting, then raises what interrupted it.

        Parameters
        ----------
        terminating : bool
            The flow run is being stopped.
        """
        with self._lock:
            if self._closing or self.state is State.NEW:
                return self.summary()
            self._closing = True
        limit = min(self.block.teardown_timeout, TERMINATING_TEARDOWN_S) if terminating else self.block.teardown_timeout
        host: EngineHost = self.host  # type: ignore[assignment]  # set by the opening
        done, still, interrupted = True, 0, None
        try:
            still = self._served.wait(limit)
            for result in self._book.close():
                self._telemetry.result_released(result, at_session_end=True)
            done = self._end_engine(host, limit)
            if self._owns_host:
                self.timings["engine_shutdown_s"], self._shutdown_thread = host.shutdown_seconds, host.thread.name
            self.teardown = "complete" if done else f"stopped waiting after {limit:g} s for the engine"
        except BaseException as exc:  # a failure, or an interruption (KeyboardInterrupt, a cancellation)
            done, interrupted = False, (None if isinstance(exc, Exception) else exc)
            what = "interrupted" if interrupted else f"failed: {type(exc).__name__}: {exc}"
            self.teardown = f"{what}; the engine's end was queued without waiting for it"
            try:
                self._end_engine(host, 0)  # queued once: a shutdown queued before is found queued
            except Exception as also:  # what a failed close reports is its first error
                logger.debug("Engine session %s: queueing its end failed: %s", self.id, also)
        finally:
            tombstone = EndedSession(self.id, self.backend, self.served_run, self.subflow)
            for result in self._book.results()[0]:
                result.end(tombstone, drop=done)
            self.state, self.host = State.CLOSED, (None if done else host)
            last = exits.closed(self)
            if self._token is not None:
                active.leave(self._token, self)
                self._token = None
        if terminating and last and done and self._owns_host:  # the process is ending: leave nothing in its group
            gc.collect()  # what nothing holds unregisters from the resource tracker first
            if not stop_resource_tracker(TRACKER_WAIT_S):
                logger.warning("multiprocessing's resource tracker still ran %g s after engine session %s ended; "
                               "the flow run's process group ends only once it does.", TRACKER_WAIT_S, self.id)
        summary = self.summary()
        self._telemetry.ended(summary, still_served=still, limit=limit)
        if interrupted is not None:
            raise interrupted
        return summary

    def _end_engine(self, host: EngineHost, limit: float) -> bool:
        """
        Shut the engine down (this session started it) or, on a shared engine, free this session's partitions,
        after the calls already queued; whether that ended within ``limit`` seconds (0: queued, not waited for).
        """
        if self._owns_host:
            return host.shutdown(limit, before=self._last_call)
        holding = [r for r in self._book.results()[0] if r.holding]

        def drop() -> None:
            for result in holding:
                result.drop_partitions()

        return ended_within(host.submit(drop), limit)

    def close_at_exit(self) -> None:
        """Close at interpreter exit: Prefect's services may have stopped, so say nothing to Prefect."""
        self._telemetry.muted = True
        self.close()

    def _last_call(self) -> None:
        """On the owner thread, before the engine shuts down: what it holds at the end."""
        self._memory["at_end"] = self._telemetry.note(self.host.engine.read()).memory  # type: ignore[union-attr]


CudfPolarsEngine.session_type = EngineSession
