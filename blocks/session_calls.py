"""
An engine session's engine calls: ``execute`` and ``collect`` (from a thread or a coroutine), ``defer``, ``adopt``.

Each engine call runs whole on the engine's owner thread (:meth:`EngineCalls._on_owner`):
its plan and the frames it reads are checked there, room is made below
``device_memory_limit``, the engine runs, the inputs it claimed are freed, and a
result it produces is admitted to the session there, so the next call sees it
held. The caller only waits for the call's future (:class:`~prefect_cudf_polars.blocks.engine_call.PendingCall`)
and then tells Prefect what the call made, from its own thread.
:class:`EngineCalls` is mixed into :class:`~prefect_cudf_polars.blocks.EngineSession`,
which holds the state it uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl

from prefect_cudf_polars.blocks.backends.engine_errors import raise_engine_error
from prefect_cudf_polars.blocks.backends.plans import input_reads, plans_later, prepare_result
from prefect_cudf_polars.blocks.deferred import FusedStep, HeldPlan
from prefect_cudf_polars.blocks.engine import EngineHost, call_environment
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.engine_call import PendingCall
from prefect_cudf_polars.blocks.errors import SessionError
from prefect_cudf_polars.blocks.lineage import Lineage
from prefect_cudf_polars.blocks.memory import read_by
from prefect_cudf_polars.blocks.result_book import ResultBook
from prefect_cudf_polars.blocks.results import GPUResult, claimed_by, fused_steps
from prefect_cudf_polars.blocks.runs import RunIdentity, current_run
from prefect_cudf_polars.blocks.telemetry import SessionTelemetry


class EngineCalls:
    """
    The engine calls of an :class:`~prefect_cudf_polars.blocks.EngineSession` (see the module notes).

    The session provides the state below and ``_check_open()`` (its engine host, or ``SessionError``),
    ``run(fn, *args)`` (on the owner thread) and ``ended_message()``.
    """

    block: CudfPolarsEngine
    _book: ResultBook
    _telemetry: SessionTelemetry
    _engine_calls: int
    _check_open: Callable[[], EngineHost]
    run: Callable[..., Any]
    ended_message: Callable[[], str]

    def execute(self, lf: pl.LazyFrame, *, name: str | None = None, lineage: Lineage | None = None,
                inputs: Sequence[GPUResult] = (), environment: Mapping[str, str | None] | None = None) -> GPUResult:
        """
        Run ``lf`` on the engine and return a live :class:`GPUResult`; the data stays on the engine.

        A caller that stops waiting (a task timeout) leaves the call running; its result is released at once.

        Parameters
        ----------
        lf : polars.LazyFrame
        name : str, optional
            The result's name (default ``"query"``).
        lineage : Lineage, optional
            How to produce the result again (default: ``lf``, with ``environment``).
        inputs : sequence of GPUResult
            The results ``lf`` was built from that this call may have claimed:
            what they still hold is freed in the same hand-off, success or
            failure; claimed deferred ones are listed as fused into the result.
        environment : mapping of str to (str or None), optional
            Set in this process and on every rank for the engine call alone, its planning included
            (object-store credentials; ``None`` unsets a variable).

        Returns
        -------
        GPUResult

        Raises
        ------
        polars.exceptions.PolarsError, FileNotFoundError
            Planning failed (a column or file that is not there); nothing has run.
        NotImplementedError
            The plan is refused before it runs (a zero-column read of a result), or cudf-polars cannot run it.
        ResultReleasedError, ResultConsumedError
            The query reads a result that was released, or a frame an earlier query read; nothing has run.
        DeviceMemoryError
            The engine ran out of device memory (the message names the block fields that help), or the results
            the call does not read leave no room below ``device_memory_limit`` (:mod:`~prefect_cudf_polars.blocks.memory`).
        SessionError
            The session has ended.
        """
        return self._call("execute", lf, inputs=inputs, environment=environment, name=name, lineage=lineage).wait()

    async def execute_async(self, lf: pl.LazyFrame, **options: Any) -> GPUResult:
        """:meth:`execute` for a coroutine: the engine call's future is awaited on the event loop (no thread); the
        same parameters (``options``: its keywords), result and errors. Cancelled while the call runs, its result is
        released when it ends."""
        return await self._call("execute", lf, **options).wait_async()

    def collect(self, query: pl.LazyFrame | GPUResult, *, inputs: Sequence[GPUResult] = (),
                environment: Mapping[str, str | None] | None = None) -> pl.DataFrame:
        """
        Run a query (a LazyFrame, or a GPUResult it claims) on the engine and return a host ``polars.DataFrame``.

        Parameters
        ----------
        query : polars.LazyFrame or GPUResult
        inputs, environment
            As for :meth:`execute`.

        Raises
        ------
        ResultReleasedError, ResultConsumedError, WrongEngineError
            ``query`` (or an input) is a GPUResult that cannot be read here; nothing has run.
        NotImplementedError, DeviceMemoryError, SessionError
            As for :meth:`execute`.
        """
        if isinstance(query, GPUResult):
            inputs, query = [*inputs, query], query.lazy()
        return self._call("collect", query, inputs=inputs, environment=environment).wait()

    async def collect_async(self, query: pl.LazyFrame, **options: Any) -> pl.DataFrame:
        """:meth:`collect` of a LazyFrame for a coroutine (the engine call awaited on the event loop); the same
        keywords (``options``: ``inputs``, ``environment``) and errors."""
        return await self._call("collect", query, **options).wait_async()

    def _call(self, kind: str, lf: pl.LazyFrame, *, inputs: Sequence[GPUResult] = (), name: str | None = None,
              environment: Mapping[str, str | None] | None = None, lineage: Lineage | None = None) -> PendingCall:
        """Queue one engine call on the owner thread: the whole of it runs there (:meth:`_on_owner`)."""
        host, run = self._check_open(), current_run()
        claimed = claimed_by(inputs, run)
        call = PendingCall(host, fused_steps(claimed), run, name or "query", self._finished, self._late)
        call.future = host.submit(self._on_owner, kind, lf, claimed, call, environment, lineage)
        return call

    def _on_owner(self, kind: str, lf: pl.LazyFrame, claimed: list[GPUResult], call: PendingCall,
                  environment: Mapping[str, str | None] | None, lineage: Lineage | None) -> tuple:
        """
        One engine call, on the owner thread: check the plan and the frames it reads, make room, run, free the inputs.

        A result it produces is registered here (a later call sees it held); what Prefect is told of it is sent
        from the caller's thread (:meth:`PendingCall.finish`).
        """
        scanned: list[GPUResult] = []
        try:
            host = self._check_open()
            running, ledger = host.engine, host.ledger
            with call_environment(running, environment):
                artifact, read = kind == "execute" and self.block.result_artifacts, read_by(claimed)
                looks = artifact or self._book.frames_out() or not all(r.deferred for r in read.values())
                if looks:  # the plan may read a frame: look
                    flags, plans = prepare_result(lf, optimized=artifact)
                    scanned = self._book.scanned(plans[0])
                else:  # it reads no frame of ours (what it claimed are plans): polars' defaults; the event's plan is
                    flags, plans = pl.QueryOptFlags(), plans_later(lf)  # made off this thread
                for result in {*claimed, *scanned}:  # a frame an earlier query read, or a released one, is refused
                    result.check_scan(call.run)
                call.planned = True
                frames = ledger.make_room(read, running)
                started = time.perf_counter()
                value = getattr(running, kind)(lf, flags)
                seconds = time.perf_counter() - started
        finally:
            for result in (*claimed, *scanned):
                result.free()
            self._engine_calls += call.planned  # only the owner thread counts
        try:
            ledger.read_back(frames)
            reading = self._telemetry.note(running.read(value if kind == "execute" else None))
            if kind == "execute":
                lineage = lineage or Lineage.of_query(lf, environment=environment)
                value = self._admit(GPUResult(value, owner=self, name=call.name, run=call.run, lineage=lineage,
                                              engine_seconds=seconds, rows=reading.rows, bytes=reading.bytes,
                                              rank_bytes=reading.bytes_per_rank, fused=call.fused))
        except BaseException:
            if kind == "execute" and not isinstance(value, GPUResult):  # made, but no handle holds it
                value.release()
            raise
        return value, plans, reading.memory, input_reads(claimed, plans[0]) if looks else []

    def _finished(self, out: tuple) -> Any:
        """On the caller's side of an engine call: tell Prefect of the result it produced; its value."""
        value, plans, memory, reads = out
        if isinstance(value, GPUResult):
            self._telemetry.result_created(value, plans[0], memory, plans[1], reads)
        return value

    def _late(self, out: tuple) -> None:
        """On the owner thread: a result that arrived after its caller stopped waiting (a timeout) is released at once."""
        if isinstance(result := out[0], GPUResult):
            self._book.leave(result, "released_unconsumed")
            self._telemetry.late_result_released(result.name, result.produced_by_task_run_id)
            result.release()

    def defer(self, lf: pl.LazyFrame, *, name: str | None = None, lineage: Lineage | None = None,
              inputs: Sequence[GPUResult] = (), step: FusedStep | None = None) -> GPUResult:
        """
        Keep ``lf`` as a live deferred :class:`GPUResult`, to run fused into its reader's engine call.

        Nothing runs: the schema is resolved and the plan checked as the engine
        would (on ``cpu``, the GPU-support check when ``raise_on_fail``).

        Parameters
        ----------
        lf : polars.LazyFrame
        name, lineage
            As for :meth:`execute`.
        inputs : sequence of GPUResult
            The claimed ones are held until the reader's call.
        step : FusedStep, optional
            The step's own record (a replay passes the original's, so it keeps
            naming the task run that deferred it).

        Returns
        -------
        GPUResult
            Live and deferred.

        Raises
        ------
        polars.exceptions.PolarsError
            The schema cannot be resolved (with a note naming the step).
        NotImplementedError
            The plan is refused (nothing has run).
        SessionError
            The session has ended.
        """
        host, name, run = self._check_open(), name or "query", current_run()
        try:
            schema = lf.collect_schema()
            host.engine.check_plan(lf)  # pure Python (the GPU-support check, on cpu): on this thread
            plans = prepare_result(lf, optimized=True)[1] if self.block.result_artifacts else plans_later(lf)
        except Exception as exc:
            exc.add_note(f"Raised by the deferred step {name!r}: a deferred step resolves its query's schema "
                         "and checks its plan before the task that reads it runs it.")
            raise
        held = tuple(claimed_by(inputs, run))
        own = step or FusedStep(name, run.name, run.task_run_id)
        result = GPUResult(HeldPlan(lf, schema, held, (*fused_steps(held), own)), owner=self, name=name, run=run,
                           lineage=lineage or Lineage.of_query(lf, deferred=True))
        self._telemetry.result_created(self._admit(result), plans[0], None, plans[1])
        return result

    def adopt(self, handed: Any, *, like: GPUResult) -> GPUResult:
        """A live result wrapping what ``like`` handed over (``tee``'s first copy); ``SessionError`` once ended."""
        result = self._like(handed, like, current_run())
        try:
            self.run(self._admit, result)
        except BaseException:  # not admitted (the session ended first): free what it was handed
            result.release()
            raise
        self._telemetry.result_created(result, None, None, None)
        return result

    def _like(self, payload: Any, like: GPUResult, run: RunIdentity) -> GPUResult:
        """A new result of ``run`` holding ``payload``, with ``like``'s name, lineage, size and fused steps."""
        return GPUResult(payload, owner=self, name=like.name, run=run, lineage=like.lineage, rows=like.rows,
                         bytes=like.bytes, rank_bytes=like.rank_bytes, fused=like.fused)

    def copies(self, result: GPUResult, n: int) -> list[GPUResult] | None:
        """
        ``n`` live results holding device copies of ``result``'s partitions (``tee``), which it keeps; ``None`` where
        none can be made so (a deferred result, one moved to host memory or no longer holding its partitions, or a
        backend that cannot copy them): then produce them again from the lineage.

        Each copy is a deep copy of every partition into a new slot of the engine's store, made on the owner
        thread (no partition is shared by two queries), and is held in the ledger like a result a query made.

        Raises
        ------
        SessionError
            The session has ended.
        """
        run = current_run()

        def on_owner() -> list[GPUResult] | None:
            made: list[GPUResult] = []
            try:
                for _ in range(n):
                    if (persisted := result.persisted) is None or persisted.moved_out:  # a deferred one holds none
                        return None
                    try:
                        copied = self._check_open().engine.copy(persisted)
                    except Exception as exc:  # out of device memory is said as DeviceMemoryError
                        raise_engine_error(exc)
                    if copied is None:
                        return None
                    made.append(self._admit(self._like(copied, result, run)))
            finally:
                if len(made) < n:  # none, or a failure part way: keep none of them
                    for copy in made:
                        copy.release()
            return made

        made = self.run(on_owner)
        for copy in made or ():
            self._telemetry.result_created(copy, None, None, None)
        return made

    def _admit(self, result: GPUResult) -> GPUResult:
        """Count ``result`` as produced and live here, and hold it in the host's ledger (on the owner thread for
        one that holds partitions)."""
        if not self._book.admit(result):
            result.release()
            raise SessionError(self.ended_message())
        host = self._check_open()
        host.ledger.add(result, self._telemetry.result_moved, host.engine)
        return result
