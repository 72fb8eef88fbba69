"""
What an engine session tells Prefect: events, log lines, and one summary artifact.

Events and log lines are queued where things happen, mostly on the task's
thread, with a copy of the caller's context: the caller only queues. One
queue (:mod:`~prefect_cudf_polars.blocks.send_queue`, on a thread of its
own) makes each in order and hands it to
Prefect: :func:`prefect.events.emit_event` in the caller's context, so
Prefect's ``EventsWorker`` attaches the flow run, task run, flow, deployment
and tags from it (``prefect/events/worker.py``, Prefect 3.9.1) and an event
sent from a task needs no related resources of ours. Events sent after the
flow run's context is gone (a task runner's session end) name the flow run
explicitly. The session's end waits until the queue has handed everything on.

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

The run that made a result (its task run's Logs tab) gets an INFO line then
(rows, bytes, partitions, engine seconds) and each time it moves to host
memory or back (its route), for the API only: Prefect 3.9.1's API log worker
sends it in a batch; its console handler (Rich) is left out.

The flow run gets one markdown artifact at the session's end, keyed
``<flow-name>-cudf-polars-session``: the session's figures, two tables of its
results and a list of those moved to host memory
(:mod:`~prefect_cudf_polars.blocks.artifact_text`). A result's own artifact on
its task run (a synchronous API call each) is written only with the block's
``result_artifacts``. Nothing here raises into a query or a teardown: failures
are logged.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from prefect.context import FlowRunContext, TaskRunContext
from prefect.logging.loggers import flow_run_logger, get_logger

from prefect_cudf_polars.blocks.active import PROVIDER
from prefect_cudf_polars.blocks.artifact_text import format_bytes, limited, result_markdown, summary_markdown
from prefect_cudf_polars.blocks.backends.compat import send_run_log, without_prefect_run_context
from prefect_cudf_polars.blocks.errors import WAIT_FOR_SERVED
from prefect_cudf_polars.blocks.memory import on_engine, read_by
from prefect_cudf_polars.blocks.send_queue import send_later, wait_sent

#: Prefect's ``prefect.prefect_cudf_polars`` logger: lines that belong to no flow run (console only).
logger = get_logger("prefect_cudf_polars")

ENGINE_STARTED = "prefect_cudf_polars.engine.started"
ENGINE_STOPPED = "prefect_cudf_polars.engine.stopped"
RESULT_CREATED = "prefect_cudf_polars.result.created"
RESULT_CONSUMED = "prefect_cudf_polars.result.consumed"
RESULT_RELEASED = "prefect_cudf_polars.result.released"
RESULT_MOVED = "prefect_cudf_polars.result.moved"

#: Seconds a session's end waits for its queued events and log lines to be handed to Prefect.
SEND_WAIT_S = 60.0
#: Most results listed in the summary artifact (the first ones produced; each has its ``result.created`` event).
SUMMARY_RESULTS = 500

NOT_STARTED_LINE = ("cudf-polars engine not started: no GPU task ran in this flow run (the engine starts at the first "
                    "GPU task)")
INTERRUPTED_LINE = ("cudf-polars engine not started: its start was interrupted (the flow run's timeout, Ctrl-C or a "
                    "cancellation), while it waited for admission slots or while the engine started; nothing of it is "
                    "held")
TEARDOWN_WARNING = ("cudf-polars engine session teardown %s: the engine did not answer. A Prefect process worker "
                    "cancels a flow run with SIGTERM to its whole process group, an owned Dask or Ray cluster included, "
                    "so the engine's processes may be gone; the CUDA driver frees the device memory of processes that "
                    "end. If a normal teardown needs longer, raise teardown_timeout on the engine block.")
UNREAD_WARNING = ("cudf-polars released %d result(s) no task read, at the engine session's end: %s. A result is for a "
                  "later task to read (a gpu_task, execute, collect, tee or sink_parquet given the result); one "
                  "returned from the flow, never passed on, or whose reader failed or never ran ends with its flow "
                  "run: collect it to keep its rows, or do not produce it.")
#: Most results the unread warning names.
UNREAD_NAMED = 20
SERVED_WARNING = ("cudf-polars engine session %s ended with %d task run(s) it serves still running after %g s "
                  "(teardown_timeout); they fail at their next engine call with an error naming this session: "
                  f"{WAIT_FOR_SERVED}.")


def run_resources(flow_run_id: Any = None, task_run_id: Any = None, *, role: str = "task-run") -> list[dict[str, str]]:
    """Prefect related resources naming a flow run and a task run (either may be ``None``)."""
    runs = (("flow-run", flow_run_id, "flow-run"), ("task-run", task_run_id, role))
    return [{"prefect.resource.id": f"prefect.{kind}.{run_id}", "prefect.resource.role": run_role}
            for kind, run_id, run_role in runs if run_id is not None]


def run_line(log: tuple[Any, Any] | None, msg: str | Callable[[], str]) -> None:
    """One INFO line on a run's log in the Prefect UI (``log``: its flow run and task run ids), not on the console,
    sent off the caller's path (``msg`` may be a callable that makes it there); never raises."""
    at = datetime.datetime.now(datetime.timezone.utc)

    def send() -> None:
        text = msg if isinstance(msg, str) else msg()
        try:
            send_run_log(*log, text, at)
        except Exception as exc:
            logger.warning("Could not write %r to its run's log: %s", text, exc)

    if log is not None:
        send_later(send)


def summary_key(flow_name: str) -> str:
    """The summary artifact's key, ``<flow-name>-cudf-polars-session`` (Prefect keys: lowercase, digits, dashes)."""
    return _key(flow_name, "flow", "cudf-polars-session")


def result_key(name: str) -> str:
    """A per-result artifact's key, its title in the UI: ``<result-name>-gpu-result``, one version per result."""
    return _key(name, "query", "gpu-result")


def _key(text: str, default: str, suffix: str) -> str:
    return f"{re.sub(r'[^a-z0-9-]+', '-', text.lower()).strip('-') or default}-{suffix}"


#: Top-level modules whose frames :func:`user_stacklevel` steps past.
_PAST_FRAMES = ("prefect_cudf_polars", "prefect", "contextlib")


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn`` name the user's line, past this package's, Prefect's and contextlib's frames."""
    frame, level = getattr(inspect.currentframe(), "f_back", None), 1  # starting at the function that warns
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _PAST_FRAMES:
        frame, level = frame.f_back, level + 1
    return level


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
        self.session_id, self.result_artifacts, self.muted = session_id, result_artifacts, False
        self.flow_run: Any = None
        self.flow: Any = None
        self.backend: str | None = None
        self.peak: int | None = None
        self.gpus: list[str] = []
        self.peak_per_rank: dict[int, int] = {}
        self._results: dict[str, dict[str, Any]] = {}  # result id -> its row in the summary
        self._unlisted = 0  # results past SUMMARY_RESULTS
        self._unread: list[str] = []  # results released unread at the session's end
        self._unread_held: dict[str, int] = {}  # their bytes on the engine then, by result id (inputs they hold too)
        self._lock = threading.Lock()  # task threads note readings and add results at once

    def note(self, reading: Any) -> Any:
        """Keep the peaks of an engine reading (bytes, in total and per rank); returns the reading."""
        with self._lock:
            self.peak = max((value for value in (self.peak, reading.memory) if value is not None), default=None)
            self.peak_per_rank.update((rank, value) for rank, value in enumerate(reading.per_rank)
                                      if value is not None and value > self.peak_per_rank.get(rank, -1))
        return reading

    def log(self, level: int, msg: str, *args: Any) -> None:
        """One line in the flow run's log (Python logging before the flow run is known, or when muted)."""
        to_flow_run = self.flow_run is not None and not self.muted
        (flow_run_logger(self.flow_run, self.flow) if to_flow_run else logger).log(level, msg, *args)

    def _session_event(self, event: str, payload: dict[str, Any]) -> None:
        """Send ``event`` about the session (``engine.started``, ``engine.stopped``), naming its flow run."""
        resource = {"prefect.resource.id": f"prefect-cudf-polars.engine-session.{self.session_id}",
                    "prefect.resource.name": f"cudf-polars engine ({self.backend})", "backend": str(self.backend)}
        self._emit(event, resource, payload, run_resources(getattr(self.flow_run, "id", None)))

    def _emit(self, event: str, resource: dict[str, str], payload: dict[str, Any] | Callable[[], dict[str, Any]],
              related: list[dict[str, str]]) -> None:
        """
        Queue one event for :func:`prefect.events.emit_event` (``payload``: its payload, or a callable making it off
        the caller's path), unless muted; never raises.

        Outside any run context (a task runner's session end, the engine's owner
        thread) the event carries only the runs it names itself
        (:func:`~prefect_cudf_polars.blocks.backends.compat.without_prefect_run_context`).
        Prefect keeps a copy of the sender's context with each queued event (and
        its worker thread keeps the first one): the copy is made without the
        innermost session provider, so it keeps no session alive.
        """
        from prefect.events import emit_event

        occurred = datetime.datetime.now(datetime.timezone.utc)  # when it happened, not when it is sent

        def send() -> None:
            PROVIDER.set(None)  # the copy of this context Prefect keeps with the event holds no session
            try:
                emit_event(event=event, resource=resource, related=related, occurred=occurred,
                           payload=payload() if callable(payload) else payload)
            except Exception as exc:  # an API that is down must not fail a query
                logger.warning("Could not emit Prefect event %s: %s", event, exc)

        if not self.muted:
            outside_runs = FlowRunContext.get() is None and TaskRunContext.get() is None
            send_later(functools.partial(without_prefect_run_context, send) if outside_runs else send)

    def started(self, description: dict[str, Any], start_seconds: float, fallback_warning: str | None) -> None:
        """The session's first use inside its flow run: the start line, ``engine.started``."""
        ranks, versions = description.get("ranks", 1), description.get("versions", {})
        gpus = self.gpus = list(description.get("gpus") or [])
        if fallback_warning:  # why the backend below is cpu, first
            self.log(logging.WARNING, "%s", fallback_warning)
        self.log(logging.INFO, "cudf-polars engine session started: backend=%s (%s); %s; %s rank(s); %s; engine start "
                 "%.2f s", self.backend, description.get("note", ""), f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus
                 else "no GPU in use", ranks, ", ".join(f"{k} {v}" for k, v in versions.items()), start_seconds)
        if description.get("cluster") or description.get("dashboard"):
            self.log(logging.INFO, "cudf-polars cluster: %s; dashboard %s", description.get("cluster", "?"),
                     description.get("dashboard") or "none")
        self._session_event(ENGINE_STARTED, {"backend": self.backend, "gpus": gpus, "ranks": ranks, "versions": versions,
                                             "engine_start_s": start_seconds, "fallback_warning": fallback_warning})

    def result_created(self, result: Any, plan: str | Callable[[], str] | None, memory: int | None,
                       engine_plan: str | None = None, reads: list[dict[str, Any]] = []) -> None:  # noqa: B006
        """
        A result was produced: a line on its run's log, ``result.created`` with its facts; with
        ``result_artifacts``, its artifact too.

        ``plan`` is the query's logical plan (the event's; or a callable that makes it, off the caller's path); ``engine_plan``, the
        optimized plan the engine ran (the artifact's, when asked for); ``reads``,
        per input result the query read, its name, id, reads in the plan and bytes per read.
        """
        plan_text = plan if callable(plan) else lambda: plan
        task_run = getattr(TaskRunContext.get(), "task_run", None)
        flow_run_id = task_run.flow_run_id if task_run is not None else getattr(self.flow_run, "id", None)
        log = None if self.muted else (flow_run_id, getattr(task_run, "id", None))  # the producer's run log
        by = getattr(task_run, "name", result.produced_by)  # its task run's name, in the summary
        facts = {k: getattr(result, k) for k in ("name", "rows", "bytes", "partitions", "engine_seconds", "deferred")}
        with self._lock:
            self._unlisted += len(self._results) >= SUMMARY_RESULTS
            if len(self._results) < SUMMARY_RESULTS:
                self._results[result.id] = {**facts, "state": "live", "log": log, "by": by,
                                            "producer": result.produced_by_task_run_id}
        run_line(log, lambda: f"cudf-polars deferred step {result.name!r}: nothing ran; its plan runs fused into the "
                 "engine call of the task run that reads it" if result.deferred else f"cudf-polars result "
                 f"{result.name!r}: {result.rows} rows, {format_bytes(result.bytes)}, {result.partitions} partition(s) "
                 f"on the engine ({result.backend}); engine call {result.engine_seconds:.3f} s")
        self._result_event(RESULT_CREATED, result, None, None, lambda: {
            **facts, "backend": result.backend, "ranks": list(result.ranks), "memory_in_use_bytes": memory,
            "schema": {k: str(v) for k, v in result.schema.items()}, "inputs_read": reads,
            "plan": limited(plan_text() or "(the same plan as the result it was split from)"),
            "fused_steps": [step._asdict() for step in result.fused]})
        if self.result_artifacts and not self.muted and result.produced_by_task_run_id is not None:
            from prefect.artifacts import create_markdown_artifact

            try:
                create_markdown_artifact(key=result_key(result.name), description=f"cudf-polars result {result.name!r}: "
                                         "plan, schema, rows, bytes, where it lives", markdown=result_markdown(
                                             result, limited(engine_plan or plan_text() or ""), memory, self.gpus))
            except Exception as exc:
                logger.warning("Could not write the artifact of GPU result %r: %s", result.name, exc)

    def _result_event(self, event: str, result: Any, state: str | None, role: str | None,
                      make: Callable[[], dict[str, Any]] | None = None, **payload: Any) -> dict:
        """Send ``event`` about ``result``, relating its producer as ``role`` (``None``: the context's runs); its summary
        row. ``make`` adds payload fields, made off the caller's path."""
        row = self._results.get(result.id, {})
        row["state"] = state or row.get("state")
        flow_run_id = getattr(self.flow_run, "id", None) if role == "task-run" else None  # else the context names it
        self._emit(event, {"prefect.resource.id": f"prefect-cudf-polars.result.{result.id}", "prefect.resource.name":
                           result.name, "backend": result.backend, "session-id": result.session_id},
                   lambda: {"name": result.name, **payload, **(make() if make else {})},
                   run_resources(flow_run_id, row.get("producer"), role=role) if role else [])
        return row

    def result_consumed(self, result: Any) -> None:
        """A result was claimed by its reader: ``result.consumed``, naming the producer."""
        self._result_event(RESULT_CONSUMED, result, "consumed", "producer", consumed_by=result.consumed_by, deferred=
                           result.deferred, fused_steps=[step._asdict() for step in result.fused] if result.deferred else [])

    def result_released(self, result: Any, *, at_session_end: bool) -> None:
        """A result was released before anyone read it: ``result.released``, naming the producer."""
        self._result_event(RESULT_RELEASED, result, "released unread", "task-run", unconsumed=True, at_session_end=at_session_end)
        if at_session_end:  # still held: the engine's shutdown frees it, and what its plan holds
            self._unread.append(f"{result.name!r} ({'deferred, ' if result.deferred else ''}from {result.produced_by})")
            self._unread_held.update((r.id, on_engine(r)) for r in read_by((result,)).values())

    def result_moved(self, result: Any, way: str, seconds: float | None, route: str) -> None:
        """A result moved to host memory (``way="out"``) or back for the query that reads it (``"back"``), by ``route``
        (``"pinned"`` or ``"host frame"``; ``seconds`` where timed): ``result.moved``, and a line on the log of the run
        that produced it."""
        out = way == "out"
        row = self._result_event(RESULT_MOVED, result, None, "task-run", to="host" if out else "engine",
                                 bytes=result.bytes, seconds=seconds, route=route)
        took = "" if seconds is None else f" in {seconds:.3f} s"
        row["moved"] = "; ".join(filter(None, [row.get("moved"), f"out{took} ({route})" if out else "read back"]))
        run_line(row.get("log"), f"cudf-polars result {result.name!r} moved to host memory ({route}){took} "
                 f"({format_bytes(result.bytes)}) to make room within device_memory_limit" if out else
                 f"cudf-polars result {result.name!r} read back from host memory ({route}){took} by {result.consumed_by}")

    def late_result_released(self, name: str, task_run_id: Any) -> None:
        """A result arrived after its task run stopped waiting (a timeout) and was released at once."""
        resource = {"prefect.resource.id": f"prefect-cudf-polars.result.late.{task_run_id}", "prefect.resource.name": name}
        self._emit(RESULT_RELEASED, resource, {"name": name, "unconsumed": True, "timed_out": True},
                   run_resources(getattr(self.flow_run, "id", None), task_run_id))

    def ended(self, summary: dict[str, Any], *, still_served: int, limit: float) -> None:
        """The session closed: the end line and warnings, the summary artifact, ``engine.stopped``."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactCreate

        counts, memory, timings, held = summary["counts"], summary["memory"], summary["timings"], summary["held"]
        unread, spills = (len(self._unread), sum(self._unread_held.values())), held["spills"]
        tally = "results " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items())
        within = "" if held["limit"] is None else (
            f"device_memory_limit {held['limit']:,} bytes, peak held {held['peak_held']:,} bytes; spill_results="
            f"{held['spill_results']}: {spills['results']} result(s) moved to host memory ({spills['bytes']:,} bytes, "
            f"{spills['out_seconds']:.3f} s out, {spills['on_demand']} on a running query's demand), "
            f"{spills['back']} read back ({spills['back_bytes']:,} bytes); ")
        self.log(logging.INFO, "cudf-polars engine session ended: backend=%s, %s; %s at start %s, peak %s, at the end "
                 "%s (bytes; read before the engine's shutdown, which frees the %s held by %d unread result(s)); "
                 "%sengine start %.2f s, shutdown %.2f s on thread %s", summary["backend"], tally,
                 "host store" if summary["backend"] == "cpu" else "device memory (rmm statistics)",
                 memory.get("at_start"), summary["peak_memory"], memory.get("at_end"), unread[1], unread[0], within,
                 timings.get("engine_start_s", 0.0), timings.get("engine_shutdown_s", 0.0), summary["shutdown_thread"])
        if self._unread and not self.muted:  # muted: the interpreter-exit hook has warned
            more = f" and {unread[0] - UNREAD_NAMED} more" if unread[0] > UNREAD_NAMED else ""
            self.log(logging.WARNING, UNREAD_WARNING, unread[0], ", ".join(self._unread[:UNREAD_NAMED]) + more)
        if still_served:
            self.log(logging.WARNING, SERVED_WARNING, self.session_id, still_served, limit)
        if summary["teardown"].startswith("stopped waiting"):
            self.log(logging.WARNING, TEARDOWN_WARNING, summary["teardown"])
        elif summary["teardown"] != "complete":
            self.log(logging.WARNING, "cudf-polars engine session teardown %s; its results are released.", summary["teardown"])
        if (flow_run_id := getattr(self.flow_run, "id", None)) is not None and not self.muted:
            flow_name = getattr(self.flow, "name", None) or getattr(self.flow_run, "name", "flow")
            try:
                with get_client(sync_client=True) as client:
                    client.create_artifact(artifact=ArtifactCreate(
                        key=summary_key(flow_name), type="markdown", flow_run_id=flow_run_id,
                        data=summary_markdown(summary, list(self._results.values()), self._unlisted, unread),
                        description=f"cudf-polars engine session ({summary['backend']}): {tally}; peak memory "
                                    f"{format_bytes(summary['peak_memory'])}"))
            except Exception as exc:
                logger.warning("Could not write the summary artifact of engine session %s: %s", self.session_id, exc)
        self._session_event(ENGINE_STOPPED, {**summary, "unread_held_at_end": unread[1]})
        self._results = {}
        if not self.muted and not wait_sent(SEND_WAIT_S):
            logger.warning("cudf-polars engine session %s: its events and log lines were still queued after %g s; they "
                           "are sent in the background.", self.session_id, SEND_WAIT_S)
