"""
What an engine session shows in the Prefect UI: its events and artifacts.

Developer notes
---------------
:class:`SessionMonitor` is the session's one link to Prefect's UI. The session
calls it from small hooks (start, each result created / consumed / released,
close); the monitor turns them into the events of
:mod:`~prefect_cudf_polars.blocks.monitoring.events` and the artifacts of
:mod:`~prefect_cudf_polars.blocks.monitoring.artifacts`. It reads only the
session's public attributes (``id``, ``backend``, ``description``,
``timings``, ``fallback_warning``, ``closed``).

* The flow run is recorded on the session's first use inside it
  (``EngineSession.announce``); a task runner opens its session before the flow
  run's context exists and closes it after that context is gone, so the summary
  artifact and the ``engine.stopped`` event name the flow run by id.
* A result's producing task run is recorded when it is created, so its
  ``released`` event can name that task run even at session end.
* A result's artifact is written on the monitor's own thread
  (``cudf-polars-monitor``), so a GPU task does not wait for the API call or
  for polars to print the plan; the session waits for pending artifacts when
  it ends, before the summary.
* Nothing here raises into the session: monitoring failures are logged.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from prefect_cudf_polars.blocks.monitoring import artifacts, events
from prefect_cudf_polars.blocks.results.run_identity import current_task_run_id

if TYPE_CHECKING:
    import polars as pl

    from prefect_cudf_polars.blocks.results.result import GPUResult
    from prefect_cudf_polars.blocks.session.session import EngineSession

logger = logging.getLogger("prefect_cudf_polars.monitoring")


class SessionMonitor:
    """
    Events and artifacts of one :class:`~prefect_cudf_polars.blocks.EngineSession`.

    Parameters
    ----------
    session
        The session it reports on.

    Attributes
    ----------
    flow_run_id : uuid.UUID or None
        The flow run the session serves (set on first use inside it).
    flow_name : str or None
        That flow's name (for the summary artifact's key).
    """

    def __init__(self, session: EngineSession) -> None:
        self.session = session
        self.flow_run_id: Any = None
        self.flow_name: str | None = None

        self._producers: dict[str, Any] = {}
        self._started_sent = False
        self._writer: ThreadPoolExecutor | None = None

    # ---- session hooks ---------------------------------------------------------
    def started(self, flow_run: Any, flow: Any) -> None:
        """The session's first use inside ``flow_run``: emit ``engine.started``."""
        self.flow_run_id = flow_run.id
        self.flow_name = getattr(flow, "name", None) or flow_run.name
        if self._started_sent:
            return
        self._started_sent = True
        s = self.session
        events.emit(
            events.ENGINE_STARTED,
            events.session_resource(s.id, s.backend),
            related=events.run_resources(self.flow_run_id, current_task_run_id()),
            payload={
                "backend": s.backend,
                "gpus": s.description.get("gpus", []),
                "ranks": s.description.get("ranks", 1),
                "versions": s.description.get("versions", {}),
                "engine_start_s": s.timings.get("engine_start_s"),
                "fallback_warning": s.fallback_warning,
            },
        )

    def result_created(
        self, result: GPUResult, lf: pl.LazyFrame | None, *, memory_after: int | None
    ) -> None:
        """
        A result was produced: emit ``result.created``, queue its artifact.

        Parameters
        ----------
        result
            The new result.
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
        s = self.session
        task_run_id = current_task_run_id()
        self._producers[result.id] = task_run_id
        events.emit(
            events.RESULT_CREATED,
            events.result_resource(result),
            related=events.run_resources(self.flow_run_id, task_run_id),
            payload={
                "name": result.name,
                "backend": result.backend,
                "ranks": list(result.ranks),
                "partitions": result.partitions,
                "columns": len(result.schema),
                "engine_seconds": result.engine_seconds,
                "memory_in_use_bytes": memory_after,
            },
        )
        if task_run_id is None and self.flow_run_id is None:
            return  # outside any Prefect run: nothing to attach an artifact to
        gpus = list(s.description.get("gpus", []))
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cudf-polars-monitor")
        self._writer.submit(
            self._write_result_artifact, result, lf, memory_after, gpus, task_run_id
        )

    def _write_result_artifact(
        self, result: GPUResult, lf: pl.LazyFrame | None, memory_after: int | None, gpus: list[str], task_run_id: Any
    ) -> None:
        try:
            artifacts.create_artifact_for(
                artifacts.result_markdown(
                    result,
                    plan=artifacts.query_plan(lf) if lf is not None else "(a copy made by tee: same plan as its source)",
                    memory_after=memory_after,
                    gpus=gpus,
                ),
                description=f"cudf-polars result {result.name!r}: plan, schema, where it lives",
                flow_run_id=self.flow_run_id,
                task_run_id=task_run_id,
            )
        except Exception as exc:
            logger.warning("Could not write the artifact of GPU result %r: %s", result.name, exc)

    def flush(self) -> None:
        """Wait for the artifacts still being written (idempotent)."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def result_consumed(self, result: GPUResult) -> None:
        """A result was claimed by its reader: emit ``result.consumed``."""
        related = events.run_resources(self.flow_run_id, current_task_run_id())
        producer = self._producers.get(result.id)
        if producer is not None:
            related += events.run_resources(task_run_id=producer, task_run_role="producer")
        events.emit(
            events.RESULT_CONSUMED,
            events.result_resource(result),
            related=related,
            payload={"name": result.name, "consumed_by": result.consumed_by},
        )

    def result_released(self, result: GPUResult) -> None:
        """A result was released before anyone read it: emit ``result.released``."""
        producer = self._producers.get(result.id)
        events.emit(
            events.RESULT_RELEASED,
            events.result_resource(result),
            related=events.run_resources(self.flow_run_id, producer),
            payload={
                "name": result.name,
                "unconsumed": True,
                "at_session_end": self.session.closed,
            },
            detached=self.session.closed,
        )

    def ended(self, summary: dict[str, Any]) -> None:
        """The session closed: write the keyed summary artifact, emit ``engine.stopped``."""
        try:
            self._ended(summary)
        except Exception as exc:  # monitoring never fails the session's teardown
            logger.warning("Could not report the end of engine session %s: %s", self.session.id, exc)

    def _ended(self, summary: dict[str, Any]) -> None:
        self.flush()
        # The dask backend records its dashboard link when it starts.
        dashboard = self.session.description.get("dashboard")
        if self.flow_run_id is not None:
            artifacts.create_flow_run_artifact(
                self.flow_run_id,
                artifacts.summary_markdown(summary, dashboard=dashboard),
                key=artifacts.summary_key(self.flow_name or "flow"),
                description=artifacts.summary_description(summary),
            )
        events.emit(
            events.ENGINE_STOPPED,
            events.session_resource(self.session.id, self.session.backend),
            related=events.run_resources(self.flow_run_id),
            payload={**summary, "dashboard": dashboard},
            detached=True,
        )
