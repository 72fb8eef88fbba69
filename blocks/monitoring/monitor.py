"""
What an engine session shows in the Prefect UI: its events and artifacts.

Developer notes
---------------
:class:`SessionMonitor` is the session's one link to Prefect's UI. The session
calls it from small hooks (start, each result created / consumed / released,
close); each hook puts one record on the process-wide writer's queue
(:mod:`~prefect_cudf_polars.blocks.monitoring.writer`) and returns, so a GPU
task's critical path carries no API call, no event building and no plan
printing. The writer turns the records into the events of
:mod:`~prefect_cudf_polars.blocks.monitoring.events` and the artifacts of
:mod:`~prefect_cudf_polars.blocks.monitoring.artifacts`.

* The monitor holds no reference to its session (only the facts it reports:
  id, backend, GPUs, runs), so an ended session is freed by reference counting.
* The flow run is recorded on the session's first use inside it; a session may
  end after the flow run's context is gone, so every event and artifact names
  its runs by id.
* A result's producing task run is recorded when it is created, so its
  ``released`` event can name that task run even at session end.
* A result's artifact record keeps the query until the writer prints its plan,
  which it does once the engines are quiet, ahead of the API write; at the
  session's end, before the engine shuts down, :meth:`SessionMonitor.settle`
  prints the plans still pending, so no query (which may scan a result of the
  engine) outlives the engine.
* The session's end puts the summary artifact and ``engine.stopped`` on the
  queue (ahead of the result artifacts) and, when no more than
  :data:`SMALL_BACKLOG` other records are pending, waits at most
  :data:`END_WAIT_S` for all of them; otherwise it returns at once. What is
  left is written in the background, and at interpreter exit before Prefect's
  own services stop.
* :attr:`SessionMonitor.options` switches parts off (:class:`MonitorOptions`);
  :data:`DEFAULT_OPTIONS` is what new sessions start from.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import uuid
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prefect_cudf_polars.blocks.monitoring import artifacts, events
from prefect_cudf_polars.blocks.monitoring.writer import WRITER, Pending, Record, current_api_url
from prefect_cudf_polars.blocks.results.run_identity import current_task_run_id

if TYPE_CHECKING:
    import polars as pl

    from prefect_cudf_polars.blocks.results.result import FusedStep, GPUResult

logger = logging.getLogger("prefect_cudf_polars.monitoring")

#: Seconds a session's end waits at most for its events and artifacts to be sent.
END_WAIT_S = 1.0
#: Most result records still pending for which a session's end waits (within END_WAIT_S);
#: with more, it returns at once and everything is written in the background, the summary
#: artifact and ``engine.stopped`` first.
SMALL_BACKLOG = 16


@dataclasses.dataclass
class MonitorOptions:
    """
    Which parts of a session's monitoring run (all on by default).

    Attributes
    ----------
    result_artifacts : bool
        One markdown artifact per GPU result, on the task run that produced it.
    plans : bool
        polars' optimized query plan in each result artifact (``LazyFrame.explain()``).
    events : bool
        The ``prefect_cudf_polars.*`` events.
    summary_artifact : bool
        The keyed summary artifact of the session, on its flow run.
    """

    result_artifacts: bool = True
    plans: bool = True
    events: bool = True
    summary_artifact: bool = True


#: One plan is printed at a time, so a session's settle waits for a print under way on the writer's thread.
_PRINTING = threading.Lock()

#: What a new session's :attr:`SessionMonitor.options` start as; replace it to switch parts
#: off for every session the process opens from then on.
DEFAULT_OPTIONS = MonitorOptions()


class ResultFacts:
    """What a result's artifact shows, copied from the result (no reference to it is kept)."""

    __slots__ = (
        "backend", "deferred", "engine_seconds", "fused", "id", "name", "partitions", "ranks", "schema",
    )

    def __init__(self, result: GPUResult) -> None:
        self.id, self.name, self.backend = result.id, result.name, result.backend
        self.ranks, self.partitions = list(result.ranks), result.partitions
        self.schema, self.engine_seconds = result.schema, result.engine_seconds
        self.deferred, self.fused = result.deferred, result.fused


class ResultArtifact:
    """A queued result artifact: the result's facts and, until its plan is printed, its query."""

    __slots__ = ("__weakref__", "facts", "flow_run_id", "gpus", "memory_after", "plan", "query", "task_run_id")

    def __init__(self, facts: ResultFacts, query: Any, memory_after: int | None, gpus: list[str], flow_run_id: Any, task_run_id: Any, *, plans: bool) -> None:
        self.facts, self.memory_after, self.gpus = facts, memory_after, gpus
        self.flow_run_id, self.task_run_id = flow_run_id, task_run_id
        if query is None:
            self.plan: str | None = "(a copy made by tee: same plan as its source)"
        elif not plans:
            self.plan, query = "(not printed: plans are switched off for this session)", None
        else:
            self.plan = None
        self.query = query

    def print_plan(self) -> None:
        """
        Print the query's plan now and let go of the query (idempotent, thread-safe).

        The writer's thread prints it once the engines are quiet; a session's
        :meth:`SessionMonitor.settle` prints the rest, waiting for a print under way.
        """
        with _PRINTING:
            query, self.query = self.query, None
            if query is not None:
                self.plan = artifacts.query_plan(query)
            del query  # let go while printing is still held

    def build(self) -> Any:
        """The ``ArtifactCreate`` of this result."""
        from prefect.client.schemas.actions import ArtifactCreate

        self.print_plan()
        if self.facts.deferred:
            data = artifacts.deferred_markdown(self.facts, plan=self.plan or "")
            description = (
                f"cudf-polars deferred step {self.facts.name!r}: runs fused into the task run that reads it"
            )
        else:
            data = artifacts.result_markdown(
                self.facts, plan=self.plan or "", memory_after=self.memory_after, gpus=self.gpus
            )
            description = f"cudf-polars result {self.facts.name!r}: plan, schema, where it lives"
            if self.facts.fused:
                description += f"; {len(self.facts.fused)} deferred step(s) fused in"
        return ArtifactCreate(
            type="markdown",
            data=data,
            description=description,
            flow_run_id=self.flow_run_id,
            task_run_id=self.task_run_id,
        )


class SessionMonitor:
    """
    Events and artifacts of one :class:`~prefect_cudf_polars.blocks.EngineSession`.

    Parameters
    ----------
    session_id : str
        The id of the session it reports on.

    Attributes
    ----------
    options : MonitorOptions
        Which parts run; a copy of :data:`DEFAULT_OPTIONS` at creation.
    flow_run_id : uuid.UUID or None
        The flow run the session serves (set on first use inside it).
    flow_name : str or None
        That flow's name (for the summary artifact's key).
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.options = dataclasses.replace(DEFAULT_OPTIONS)
        self.flow_run_id: Any = None
        self.flow_name: str | None = None
        self._backend: str | None = None
        self._description: dict[str, Any] = {}
        self._producers: dict[str, Any] = {}
        self._started_sent = False
        self._pending = Pending()
        self._urgent = Pending()
        self._api_url = current_api_url()
        self._holding = False
        self._unprinted: weakref.WeakSet[ResultArtifact] = weakref.WeakSet()

    # ---- the queue ---------------------------------------------------------------
    def _put(self, *, send: Any = None, build: Any = None, prepare: Any = None, urgent: bool = False) -> None:
        if send is None and build is None:
            return
        self._pending.add()
        if urgent:
            self._urgent.add()
        on_done = self._urgent_done if urgent else self._pending.done
        WRITER.put(Record(send=send, build=build, prepare=prepare, urgent=urgent, on_done=on_done, api_url=self._api_url))

    def _urgent_done(self) -> None:
        self._urgent.done()
        self._pending.done()

    def _sender(self, name: str, resource: dict[str, str], related: list[dict[str, str]], payload: dict[str, Any]) -> Any:
        """What emits one event on the writer's thread (``None`` with events switched off)."""
        if not self.options.events:
            return None
        # Detached: Prefect's events worker would otherwise add the run context its
        # own thread saw last; every record names its runs explicitly. Sent later by
        # the writer, the event keeps the time of the hook.
        occurred = datetime.datetime.now(datetime.timezone.utc)
        return lambda: events.emit(
            name, resource, related=related, payload=payload, detached=True, occurred=occurred
        )

    def _event(self, name: str, resource: dict[str, str], related: list[dict[str, str]], payload: dict[str, Any]) -> None:
        self._put(send=self._sender(name, resource, related, payload))

    def flush(self, timeout: float = END_WAIT_S) -> bool:
        """
        Wait until this session's events and artifacts are sent, at most ``timeout`` seconds.

        Returns
        -------
        bool
            True when none is pending.
        """
        return self._pending.wait(timeout)

    # ---- session hooks ---------------------------------------------------------
    def describe(self, backend: str | None, description: dict[str, Any]) -> None:
        """Record the session's backend and description (GPUs, ranks, versions) once it runs."""
        self._backend, self._description = backend, dict(description)

    def started(self, flow_run: Any, flow: Any, *, engine_start_s: float | None, fallback_warning: str | None) -> None:
        """The session's first use inside ``flow_run``: queue ``engine.started``."""
        self.flow_run_id = flow_run.id
        self.flow_name = getattr(flow, "name", None) or flow_run.name
        if self._started_sent:
            return
        self._started_sent = True
        d = self._description
        self._event(
            events.ENGINE_STARTED,
            events.session_resource(self.session_id, self._backend),
            events.run_resources(self.flow_run_id, current_task_run_id()),
            {
                "backend": self._backend,
                "gpus": d.get("gpus", []),
                "ranks": d.get("ranks", 1),
                "versions": d.get("versions", {}),
                "engine_start_s": engine_start_s,
                "fallback_warning": fallback_warning,
            },
        )

    def result_created(self, result: GPUResult, lf: pl.LazyFrame | None, *, memory_after: int | None) -> None:
        """
        A result was produced: queue ``result.created`` and its artifact.

        A deferred result's event carries ``deferred: true`` and its artifact
        says that it runs fused into the task run that reads it; a result whose
        engine call ran deferred steps lists them (``fused_steps``: names and
        task run ids), in the event and in its artifact.

        Parameters
        ----------
        result
            The new result (its facts are copied; it is not kept).
        lf
            The query that produced it (its plan goes in the artifact); ``None``
            for a copy made by ``tee``.
        memory_after
            Bytes the engine held right after the call (the session's reading).
        """
        try:
            self._result_created(result, lf, memory_after)
        except Exception as exc:  # monitoring never fails a query
            logger.warning("Could not report GPU result %r: %s", result.name, exc)

    def _result_created(self, result: GPUResult, lf: pl.LazyFrame | None, memory_after: int | None) -> None:
        task_run_id = result.produced_by_task_run_id
        self._producers[result.id] = task_run_id
        send = self._sender(
            events.RESULT_CREATED,
            events.result_resource(result),
            events.run_resources(self.flow_run_id, task_run_id),
            {
                "name": result.name,
                "backend": result.backend,
                "ranks": list(result.ranks),
                "partitions": result.partitions,
                "columns": len(result.schema),
                "engine_seconds": result.engine_seconds,
                "memory_in_use_bytes": memory_after,
                "deferred": result.deferred,
                "fused_steps": events.fused_payload(result.fused),
            },
        )
        if not self.options.result_artifacts or (task_run_id is None and self.flow_run_id is None):
            # Switched off, or outside any Prefect run: nothing to attach an artifact to.
            self._put(send=send)
            return
        record = ResultArtifact(
            ResultFacts(result), lf, memory_after, list(self._description.get("gpus", [])),
            self.flow_run_id, task_run_id, plans=self.options.plans,
        )
        if record.query is not None:
            self._unprinted.add(record)
        # One record: the plan (once the engines are quiet), then the event, then the artifact.
        self._put(send=send, build=record.build, prepare=record.print_plan if record.query is not None else None)

    def collected(self, fused: Sequence[FusedStep], *, engine_seconds: float, rows: int) -> None:
        """
        A collect ran deferred steps in its engine call: queue an artifact that lists them.

        On the current task run (or the flow run, in a flow body); nothing when
        ``fused`` is empty, result artifacts are switched off, or outside any run.

        Parameters
        ----------
        fused
            The deferred steps the collect's engine call ran, upstream first.
        engine_seconds
            Seconds the engine call took.
        rows
            Rows returned to the host.
        """
        try:
            self._collected(tuple(fused), engine_seconds, rows)
        except Exception as exc:  # monitoring never fails a query
            logger.warning("Could not report the deferred steps of a collect: %s", exc)

    def _collected(self, steps: tuple[FusedStep, ...], engine_seconds: float, rows: int) -> None:
        task_run_id = current_task_run_id()
        if not steps or not self.options.result_artifacts or (task_run_id is None and self.flow_run_id is None):
            return
        flow_run_id = self.flow_run_id

        def build() -> Any:
            from prefect.client.schemas.actions import ArtifactCreate

            return ArtifactCreate(
                type="markdown",
                data=artifacts.collect_markdown(steps, engine_seconds=engine_seconds, rows=rows),
                description=f"cudf-polars collect: {len(steps)} deferred step(s) fused in",
                flow_run_id=flow_run_id,
                task_run_id=task_run_id,
            )

        self._put(build=build)

    def result_consumed(self, result: GPUResult) -> None:
        """A result was claimed by its reader: queue ``result.consumed``."""
        related = events.run_resources(self.flow_run_id, current_task_run_id())
        producer = self._producers.get(result.id)
        if producer is not None:
            related += events.run_resources(task_run_id=producer, task_run_role="producer")
        self._event(
            events.RESULT_CONSUMED,
            events.result_resource(result),
            related,
            {"name": result.name, "consumed_by": result.consumed_by, "deferred": result.deferred},
        )

    def result_released(self, result: GPUResult, *, at_session_end: bool) -> None:
        """A result was released before anyone read it: queue ``result.released``."""
        self._event(
            events.RESULT_RELEASED,
            events.result_resource(result),
            events.run_resources(self.flow_run_id, self._producers.get(result.id)),
            {"name": result.name, "unconsumed": True, "at_session_end": at_session_end},
        )

    def result_released_late(self, name: str, task_run_id: Any) -> None:
        """
        A result arrived after its task run stopped waiting (a timeout) and was released at once.

        Queues ``result.released`` naming that task run, with ``timed_out: true``.
        """
        self._event(
            events.RESULT_RELEASED,
            {
                "prefect.resource.id": f"{events.RESULT_RESOURCE}.{uuid.uuid4().hex}",
                "prefect.resource.name": name,
                "backend": str(self._backend),
                "session-id": self.session_id,
            },
            events.run_resources(self.flow_run_id, task_run_id),
            {"name": name, "unconsumed": True, "at_session_end": False, "timed_out": True},
        )

    def settle(self) -> None:
        """Print the plans still pending and let go of their queries (before the engine shuts down)."""
        for record in list(self._unprinted):
            record.print_plan()
        self._unprinted = weakref.WeakSet()

    def ending(self) -> None:
        """The session's teardown starts: hold the writer's records (all but the urgent ones) until :meth:`release`."""
        if not self._holding:
            self._holding = True
            WRITER.hold()

    def release(self) -> None:
        """Undo :meth:`ending` (idempotent; :meth:`ended` calls it, and so does a teardown that raised)."""
        if self._holding:
            self._holding = False
            WRITER.release()

    def ended(self, summary: dict[str, Any], *, dashboard: str | None, wait: float = END_WAIT_S) -> None:
        """
        The session closed: queue the keyed summary artifact and ``engine.stopped``.

        Then waits at most ``wait`` seconds for the session's records to be sent.
        """
        self.release()
        try:
            self._ended(summary, dashboard)
            # With a long backlog (many results still being written, on an API that is busy
            # with them), waiting would only add its whole bound to the flow run's end: the
            # summary and engine.stopped go ahead of the backlog in the background instead.
            if self._pending.count - self._urgent.count <= SMALL_BACKLOG:
                self._pending.wait(wait)
        except Exception as exc:  # monitoring never fails the session's teardown
            logger.warning("Could not report the end of engine session %s: %s", self.session_id, exc)

    def _ended(self, summary: dict[str, Any], dashboard: str | None) -> None:
        self.settle()
        self._producers = {}
        if self.flow_run_id is not None and self.options.summary_artifact:
            from prefect.client.schemas.actions import ArtifactCreate

            artifact = ArtifactCreate(
                key=artifacts.summary_key(self.flow_name or "flow"),
                type="markdown",
                data=artifacts.summary_markdown(summary, dashboard=dashboard),
                description=artifacts.summary_description(summary),
                flow_run_id=self.flow_run_id,
            )
            self._put(build=lambda: artifact, urgent=True)
        stopped = self._sender(
            events.ENGINE_STOPPED,
            events.session_resource(self.session_id, self._backend),
            events.run_resources(self.flow_run_id),
            {**summary, "dashboard": dashboard},
        )
        self._put(send=stopped, urgent=True)
