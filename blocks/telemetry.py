"""
What an engine session tells Prefect: events, log lines, and one summary artifact.

Events are sent with :func:`prefect.events.emit_event` where things happen,
mostly on the task's thread. Prefect's ``EventsWorker`` queues each one and
sends it from its own thread; it captures the caller's context when the event
is queued and attaches the flow run, task run, flow, deployment and tags from
it (``prefect/events/worker.py``, Prefect 3.9.1), so an event sent on a task's
thread needs no related resources of ours. Events sent after the flow run's
context is gone (a task runner's session end) name the flow run explicitly.

Event names (resource ``prefect-cudf-polars.engine-session.<id>`` or
``prefect-cudf-polars.result.<id>``):

``prefect_cudf_polars.engine.started`` / ``.engine.stopped``
    The session's engine started (first use inside its flow run) / the
    session ended (its summary in the payload).
``prefect_cudf_polars.result.created``
    A result was produced; the payload carries its facts: where it lives
    (backend, ranks, partitions), schema, rows, bytes, the engine call's
    seconds, the memory in use after it, the query's logical plan, and the
    deferred steps fused into that call.
``prefect_cudf_polars.result.moved``
    A result moved to host memory (``to: "host"``) to make room below the
    block's ``device_memory_limit``, or back to the engine when read
    (``to: "engine"``): its bytes and the move's seconds.
``prefect_cudf_polars.result.consumed`` / ``.result.released``
    Claimed by its one reader (the producing task run related as
    ``producer``; a deferred result lists the steps its plan holds, which its
    reader's engine call runs) / released before anyone read it (explicitly,
    or at the session's end: the event to alert on).

The flow run gets one markdown artifact at the session's end, keyed
``<flow-name>-cudf-polars-session``: the session's figures and every result
with its facts. A result's own artifact on its task run (a synchronous API
call each in Prefect 3.9.1) is written only when the block's
``result_artifacts`` is set. Nothing here raises into a query or a teardown:
failures are logged.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

from prefect.logging.loggers import flow_run_logger, get_logger

from prefect_cudf_polars.blocks.active import PROVIDER
from prefect_cudf_polars.blocks.backends.compat import without_prefect_run_context

#: Prefect's ``prefect.prefect_cudf_polars`` logger: lines that belong to no flow run (console only).
logger = get_logger("prefect_cudf_polars")

ENGINE_STARTED = "prefect_cudf_polars.engine.started"
ENGINE_STOPPED = "prefect_cudf_polars.engine.stopped"
RESULT_CREATED = "prefect_cudf_polars.result.created"
RESULT_CONSUMED = "prefect_cudf_polars.result.consumed"
RESULT_RELEASED = "prefect_cudf_polars.result.released"
RESULT_MOVED = "prefect_cudf_polars.result.moved"

#: Most characters of a plan in an event or an artifact.
PLAN_LIMIT = 8_000
#: Most results listed in the summary artifact (the first ones produced; each has its ``result.created`` event).
SUMMARY_RESULTS = 500

NOT_STARTED_LINE = (
    "cudf-polars engine not started: no GPU task ran in this flow run (the engine starts at the first GPU task)"
)
INTERRUPTED_LINE = (
    "cudf-polars engine not started: its start was interrupted (a task's timeout, Ctrl-C or a cancellation), "
    "while it waited for admission slots or while the engine started; nothing of it is held"
)
TEARDOWN_WARNING = (
    "cudf-polars engine session teardown %s: the engine did not answer. A Prefect process worker cancels a "
    "flow run with SIGTERM to its whole process group, an owned Dask or Ray cluster included, so the "
    "engine's processes may be gone; the CUDA driver frees the device memory of processes that end. If a "
    "normal teardown needs longer, raise teardown_timeout on the engine block."
)
UNREAD_WARNING = (
    "cudf-polars released %d result(s) no task read, at the engine session's end: %s. A result is "
    "for a later task to read (a gpu_task, execute, collect, tee or sink_parquet given the result); one "
    "returned from the flow, never passed on, or whose reader failed or never ran ends with its flow run: "
    "collect it to keep its rows, or do not produce it."
)
#: Most results the unread warning names.
UNREAD_NAMED = 20
SERVED_WARNING = (
    "cudf-polars engine session %s ended with %d task run(s) it serves still running after %g s "
    "(teardown_timeout); they fail at their next engine call with an error naming this session. Wait on "
    "their futures inside the `with block.session():` block, or raise teardown_timeout on the engine block."
)


def run_resources(flow_run_id: Any = None, task_run_id: Any = None, *, role: str = "task-run") -> list[dict[str, str]]:
    """Prefect related resources naming a flow run and a task run (either may be ``None``)."""
    runs = (("flow-run", flow_run_id, "flow-run"), ("task-run", task_run_id, role))
    return [{"prefect.resource.id": f"prefect.{kind}.{run_id}", "prefect.resource.role": run_role}
            for kind, run_id, run_role in runs if run_id is not None]


def emit(event: str, resource: dict[str, str], payload: dict[str, Any], related: list[dict[str, str]] = []) -> None:  # noqa: B006
    """
    Send one event with :func:`prefect.events.emit_event` (Prefect queues it); never raises.

    Outside any run context (a task runner's session end) the event carries
    only the runs it names itself (:func:`~prefect_cudf_polars.blocks.backends.compat.without_prefect_run_context`).
    Prefect keeps a copy of the sender's context with each queued event (and
    its worker thread keeps the first one): the copy is made without the
    innermost session provider, so it keeps no session alive.
    """
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.events import emit_event

    def send() -> None:
        PROVIDER.set(None)  # the copy of this context Prefect keeps with the event holds no session
        emit_event(event=event, resource=resource, related=related, payload=payload)

    try:
        outside_runs = FlowRunContext.get() is None and TaskRunContext.get() is None
        (without_prefect_run_context if outside_runs else contextvars.copy_context().run)(send)
    except Exception as exc:  # an API that is down must not fail a query
        logger.warning("Could not emit Prefect event %s: %s", event, exc)


def result_resource(result: Any) -> dict[str, str]:
    """The resource of a result event."""
    return {"prefect.resource.id": f"prefect-cudf-polars.result.{result.id}",
            "prefect.resource.name": result.name, "backend": result.backend, "session-id": result.session_id}


def format_bytes(value: int | None) -> str:
    """``1,234,567 bytes (1.2 MiB)``; ``"not available"`` for ``None``."""
    return "not available" if value is None else f"{value:,} bytes ({value / 2**20:,.1f} MiB)"


def summary_key(flow_name: str) -> str:
    """The summary artifact's key, ``<flow-name>-cudf-polars-session`` (Prefect keys: lowercase, digits, dashes)."""
    return f"{_slug(flow_name) or 'flow'}-cudf-polars-session"


def result_key(name: str) -> str:
    """A per-result artifact's key, its title in the UI: ``<result-name>-gpu-result``, one version per result."""
    return f"{_slug(name) or 'query'}-gpu-result"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


#: Top-level modules whose frames :func:`user_stacklevel` steps past.
_PAST_FRAMES = ("prefect_cudf_polars", "prefect", "contextlib")


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn`` name the user's line, past this package's, Prefect's and contextlib's frames."""
    frame, level = getattr(inspect.currentframe(), "f_back", None), 1  # starting at the function that warns
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _PAST_FRAMES:
        frame, level = frame.f_back, level + 1
    return level


def _limited(plan: str) -> str:
    return plan if len(plan) <= PLAN_LIMIT else f"{plan[:PLAN_LIMIT]}\n... ({len(plan) - PLAN_LIMIT:,} more characters)"


def _row(cells: Iterable[Any]) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def _table(rows: Iterable[Iterable[Any]], head: tuple[str, ...] = ("figure", "value")) -> str:
    """A markdown table: its header, then one line a row."""
    return f"{_row(head)}\n{'|---' * len(head)}|\n" + "\n".join(map(_row, rows)) + "\n"


def result_markdown(result: Any, plan: str, memory: int | None, gpus: list[str]) -> str:
    """The markdown of one result's artifact (``result_artifacts``): where it lives, its size, schema, plan."""
    ranks = ", ".join(f"{r} ({gpus[r]})" if r < len(gpus) else str(r) for r in result.ranks) or "none"
    schema = [(f"`{name}`", f"`{dtype}`") for name, dtype in result.schema.items()]
    fused = "".join(f"* `{s.name}`, deferred by {s.produced_by}\n" for s in result.fused)
    kind = "deferred step (runs fused into the task run that reads it)" if result.deferred else "result"
    return (
        f"### cudf-polars {kind} `{result.name}`\n\n"
        + _table([
            ("backend", result.backend), ("ranks (GPUs)", ranks), ("partitions", result.partitions),
            ("rows", "deferred" if result.deferred else result.rows),
            ("bytes", "deferred" if result.deferred else format_bytes(result.bytes)),
            ("engine call", f"{result.engine_seconds:.3f} s"), ("memory in use after", format_bytes(memory)),
            ("result id", f"`{result.id}`"),
        ])
        + (f"\n#### Deferred steps fused in, upstream first\n\n{fused}" if fused else "")
        + f"\n#### Output schema ({len(schema)} columns)\n\n{_table(schema, ('column', 'dtype'))}"
        + f"\n#### Query plan (as the engine ran it)\n\n```\n{plan}\n```\n"
    )


class SessionTelemetry:
    """
    The events, log lines and summary of one session (it holds facts, never the session or its results).

    Parameters
    ----------
    session_id : str
    result_artifacts : bool
        Write one artifact per result on its task run (the block's ``result_artifacts``).

    Attributes
    ----------
    flow_run, flow
        The flow run the session serves and its flow, once known (its log gets the lines).
    muted : bool
        Send nothing to Prefect and log to Python logging only (a session closed at interpreter exit).
    """

    def __init__(self, session_id: str, result_artifacts: bool) -> None:
        self.session_id, self.result_artifacts = session_id, result_artifacts
        self.flow_run: Any = None
        self.flow: Any = None
        self.muted = False
        self.backend: str | None = None
        self.gpus: list[str] = []
        self.peak: int | None = None
        self.peak_per_rank: dict[int, int] = {}
        self._results: dict[str, dict[str, Any]] = {}  # result id -> its row in the summary
        self._unlisted = 0  # results past SUMMARY_RESULTS
        self._unread: list[str] = []  # results released unread at the session's end
        self._lock = threading.Lock()  # task threads note readings and add results at once

    def note(self, reading: Any) -> Any:
        """Keep the peaks of an engine reading (bytes, in total and per rank); returns the reading."""
        with self._lock:
            self.peak = max((value for value in (self.peak, reading.memory) if value is not None), default=None)
            for rank, value in enumerate(reading.per_rank):
                if value is not None and value > self.peak_per_rank.get(rank, -1):
                    self.peak_per_rank[rank] = value
        return reading

    def attach(self, flow_run: Any, flow: Any) -> None:
        """Write to ``flow_run``'s log from now on."""
        self.flow_run, self.flow = flow_run, flow

    def log(self, level: int, msg: str, *args: Any) -> None:
        """One line in the flow run's log (Python logging before the flow run is known, or when muted)."""
        to_flow_run = self.flow_run is not None and not self.muted
        (flow_run_logger(self.flow_run, self.flow) if to_flow_run else logger).log(level, msg, *args)

    def _session_resource(self) -> dict[str, str]:
        return {"prefect.resource.id": f"prefect-cudf-polars.engine-session.{self.session_id}",
                "prefect.resource.name": f"cudf-polars engine ({self.backend})", "backend": str(self.backend)}

    def _emit(self, event: str, resource: dict[str, str], payload: dict[str, Any], related: list[dict[str, str]]) -> None:
        if not self.muted:
            emit(event, resource, payload, related)

    def started(self, description: dict[str, Any], start_seconds: float, fallback_warning: str | None) -> None:
        """The session's first use inside its flow run: the start line, ``engine.started``."""
        ranks, versions = description.get("ranks", 1), description.get("versions", {})
        gpus = self.gpus = list(description.get("gpus") or [])
        if fallback_warning:  # why the backend below is cpu, first
            self.log(logging.WARNING, "%s", fallback_warning)
        self.log(
            logging.INFO,
            "cudf-polars engine session started: backend=%s (%s); %s; %s rank(s); %s; engine start %.2f s",
            self.backend, description.get("note", ""), f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "no GPU in use",
            ranks, ", ".join(f"{k} {v}" for k, v in versions.items()), start_seconds,
        )
        if description.get("cluster") or description.get("dashboard"):
            self.log(logging.INFO, "cudf-polars cluster: %s; dashboard %s", description.get("cluster", "?"),
                     description.get("dashboard") or "none")
        self._emit(ENGINE_STARTED, self._session_resource(), {
            "backend": self.backend, "gpus": gpus, "ranks": ranks, "versions": versions,
            "engine_start_s": start_seconds, "fallback_warning": fallback_warning,
        }, run_resources(getattr(self.flow_run, "id", None)))

    def result_created(self, result: Any, plan: str | None, memory: int | None, engine_plan: str | None = None,
                       reads: list[dict[str, Any]] = []) -> None:  # noqa: B006
        """
        A result was produced: ``result.created`` with its facts; with ``result_artifacts``, its artifact too.

        ``plan`` is the query's logical plan (the event's); ``engine_plan``, the
        optimized plan the engine ran (the artifact's, when asked for); ``reads``,
        per input result the query read, its name, id, reads in the plan and bytes per read.
        """
        plan = _limited(plan or "(the same plan as the result it was split from)")
        with self._lock:
            self._unlisted += len(self._results) >= SUMMARY_RESULTS
            if len(self._results) < SUMMARY_RESULTS:
                self._results[result.id] = {
                    "name": result.name, "produced_by": result.produced_by, "state": "live", "rows": result.rows,
                    "bytes": result.bytes, "partitions": result.partitions, "engine_seconds": result.engine_seconds,
                    "deferred": result.deferred, "producer": result.produced_by_task_run_id,
                }
        self._emit(RESULT_CREATED, result_resource(result), {
            "name": result.name, "backend": result.backend, "ranks": list(result.ranks),
            "partitions": result.partitions, "schema": {k: str(v) for k, v in result.schema.items()},
            "rows": result.rows, "bytes": result.bytes, "engine_seconds": result.engine_seconds,
            "memory_in_use_bytes": memory, "plan": plan, "deferred": result.deferred,
            "fused_steps": [step._asdict() for step in result.fused], "inputs_read": reads,
        }, [])
        if self.result_artifacts and not self.muted and result.produced_by_task_run_id is not None:
            from prefect.artifacts import create_markdown_artifact

            try:
                create_markdown_artifact(
                    key=result_key(result.name),
                    markdown=result_markdown(result, _limited(engine_plan or plan), memory, self.gpus),
                    description=f"cudf-polars result {result.name!r}: plan, schema, rows, bytes, where it lives",
                )
            except Exception as exc:
                logger.warning("Could not write the artifact of GPU result %r: %s", result.name, exc)

    def result_consumed(self, result: Any) -> None:
        """A result was claimed by its reader: ``result.consumed``, naming the producer."""
        row = self._results.get(result.id, {})
        row["state"] = "consumed"
        self._emit(RESULT_CONSUMED, result_resource(result), {
            "name": result.name, "consumed_by": result.consumed_by, "deferred": result.deferred,
            "fused_steps": [step._asdict() for step in result.fused] if result.deferred else [],
        }, run_resources(task_run_id=row.get("producer"), role="producer"))

    def result_released(self, result: Any, *, at_session_end: bool) -> None:
        """A result was released before anyone read it: ``result.released``, naming the producer."""
        row = self._results.get(result.id, {})
        row["state"] = "released unread"
        if at_session_end:
            self._unread.append(f"{result.name!r} ({'deferred, ' if result.deferred else ''}from {result.produced_by})")
        self._emit(RESULT_RELEASED, result_resource(result), {
            "name": result.name, "unconsumed": True, "at_session_end": at_session_end,
        }, run_resources(getattr(self.flow_run, "id", None), row.get("producer")))

    def result_moved(self, result: Any, way: str, seconds: float | None) -> None:
        """A result moved to host memory (``way="out"``, its seconds) or read back by a query (``"back"``): ``result.moved``."""
        row = self._results.get(result.id, {})
        row["moved"] = "; ".join(filter(None, [row.get("moved"), f"out {seconds:.3f} s" if way == "out" else "read back"]))
        self._emit(RESULT_MOVED, result_resource(result), {
            "name": result.name, "to": "host" if way == "out" else "engine", "bytes": result.bytes, "seconds": seconds,
        }, run_resources(getattr(self.flow_run, "id", None), row.get("producer")))

    def late_result_released(self, name: str, task_run_id: Any) -> None:
        """A result arrived after its task run stopped waiting (a timeout) and was released at once."""
        resource = {"prefect.resource.id": f"prefect-cudf-polars.result.late.{task_run_id}", "prefect.resource.name": name}
        self._emit(RESULT_RELEASED, resource, {"name": name, "unconsumed": True, "timed_out": True},
                   run_resources(getattr(self.flow_run, "id", None), task_run_id))

    def ended(self, summary: dict[str, Any], *, still_served: int, limit: float) -> None:
        """The session closed: the end line and warnings, the summary artifact, ``engine.stopped``."""
        counts, memory, timings = summary["counts"], summary["memory"], summary["timings"]
        self.log(
            logging.INFO, "cudf-polars engine session ended: backend=%s, results produced %d, consumed %d, "
            "released unconsumed %d; %s at start %s, peak %s, held at the end %s (bytes); engine start "
            "%.2f s, shutdown %.2f s on thread %s",
            summary["backend"], counts["produced"], counts["consumed"], counts["released_unconsumed"],
            "host store" if summary["backend"] == "cpu" else "device memory (rmm statistics)",
            memory.get("at_start"), summary["peak_memory"], memory.get("at_end"),
            timings.get("engine_start_s", 0.0), timings.get("engine_shutdown_s", 0.0), summary["shutdown_thread"],
        )
        if (held := summary["held"])["limit"] is not None:
            spills = held["spills"]
            self.log(logging.INFO, "cudf-polars held memory: device_memory_limit %s bytes, peak held %s bytes; "
                     "spill_results=%s: %d result(s) moved to host memory (%s bytes, %.3f s out), %d read back "
                     "(%s bytes)", f"{held['limit']:,}", f"{held['peak_held']:,}", held["spill_results"],
                     spills["results"], f"{spills['bytes']:,}", spills["out_seconds"], spills["back"],
                     f"{spills['back_bytes']:,}")
        if (unread := self._unread) and not self.muted:  # muted: the interpreter-exit hook has warned
            more = f" and {len(unread) - UNREAD_NAMED} more" if len(unread) > UNREAD_NAMED else ""
            self.log(logging.WARNING, UNREAD_WARNING, len(unread), ", ".join(unread[:UNREAD_NAMED]) + more)
        if still_served:
            self.log(logging.WARNING, SERVED_WARNING, self.session_id, still_served, limit)
        if summary["teardown"].startswith("stopped waiting"):
            self.log(logging.WARNING, TEARDOWN_WARNING, summary["teardown"])
        elif summary["teardown"] != "complete":
            self.log(logging.WARNING, "cudf-polars engine session teardown %s; its results are released.", summary["teardown"])
        flow_run_id = getattr(self.flow_run, "id", None)
        if flow_run_id is not None and not self.muted:
            self._write_summary(summary, flow_run_id)
        self._emit(ENGINE_STOPPED, self._session_resource(), summary, run_resources(flow_run_id))
        self._results = {}

    def _write_summary(self, summary: dict[str, Any], flow_run_id: Any) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactCreate

        counts, gpus = summary["counts"], summary["gpus"]
        rows = [
            ("backend", summary["backend"]), ("GPUs", ", ".join(gpus) if gpus else "none (cpu backend)"),
            ("results produced", counts["produced"]), ("results consumed", counts["consumed"]),
            ("results released unconsumed", counts["released_unconsumed"]),
            ("peak memory", format_bytes(summary["peak_memory"])),
            *((f"peak memory rank {r}", format_bytes(v)) for r, v in sorted(summary["peak_memory_per_rank"].items())),
            ("memory at start", format_bytes(summary["memory"].get("at_start"))),
            ("memory held at the end", format_bytes(summary["memory"].get("at_end"))),
            ("memory measured as", "host store of the cpu backend" if summary["backend"] == "cpu"
             else "device memory rmm has allocated (rmm statistics)"),
            ("engine start", f"{summary['timings'].get('engine_start_s', 0.0):.2f} s"),
            ("engine shutdown", f"{summary['timings'].get('engine_shutdown_s', 0.0):.2f} s"),
            ("device memory limit", format_bytes(held["limit"]) if (held := summary["held"])["limit"] else "none"),
            ("peak held by results", format_bytes(held["peak_held"])), ("spill_results", held["spill_results"]),
            ("moved to host memory", f"{held['spills']['results']} result(s), {format_bytes(held['spills']['bytes'])}, "
             f"{held['spills']['out_seconds']:.3f} s out; {held['spills']['back']} read back, "
             f"{format_bytes(held['spills']['back_bytes'])}"),
            ("admission wait", f"{summary['timings'].get('admission_wait_s', 0.0):.2f} s"),
            ("teardown", summary["teardown"]), ("Dask dashboard", summary.get("dashboard") or "none (no Dask cluster)"),
            ("session id", f"`{summary['session_id']}`"),
        ]
        results = [
            (f"`{r['name']}`", r["produced_by"], r["state"], "deferred" if r["deferred"] else r["rows"],
             format_bytes(r["bytes"]) if r["bytes"] is not None else "", r["partitions"],
             f"{r['engine_seconds']:.3f}", r.get("moved", "")) for r in self._results.values()
        ]
        markdown = (
            f"### cudf-polars engine session summary\n\n{_table(rows)}\n#### Results ({len(results) + self._unlisted})\n\n"
            + _table(results, ("result", "produced by", "at the end", "rows", "bytes", "partitions", "engine s",
                                "host memory"))
            + (f"\n... and {self._unlisted} more (each in its `result.created` event)\n" if self._unlisted else "")
        )
        description = (f"cudf-polars engine session ({summary['backend']}): results produced {counts['produced']}, "
                       f"consumed {counts['consumed']}, released unconsumed {counts['released_unconsumed']}; "
                       f"peak memory {format_bytes(summary['peak_memory'])}")
        flow_name = getattr(self.flow, "name", None) or getattr(self.flow_run, "name", "flow")
        try:
            artifact = ArtifactCreate(key=summary_key(flow_name), type="markdown", data=markdown,
                                      description=description, flow_run_id=flow_run_id)
            with get_client(sync_client=True) as client:
                client.create_artifact(artifact=artifact)
        except Exception as exc:
            logger.warning("Could not write the summary artifact of engine session %s: %s", self.session_id, exc)
