"""
The Prefect events of an engine session and its results, for automations.

Event names
-----------
``prefect_cudf_polars.engine.started`` / ``prefect_cudf_polars.engine.stopped``
    An engine session started (first use inside its flow run) / shut down.
    Resource: ``prefect-cudf-polars.engine-session.<session id>``.
``prefect_cudf_polars.result.created`` / ``.consumed`` / ``.released``
    A :class:`~prefect_cudf_polars.tasks.GPUResult` was produced, claimed by its
    one reader, or released before anyone read it (explicitly or at the end of
    its session: the event to alert on). Resource:
    ``prefect-cudf-polars.result.<result id>``. ``created`` says whether the
    result is deferred (``deferred``) and which deferred steps ran fused into
    the engine call that produced it (``fused_steps``: name, producing task run
    and its id each); ``consumed`` says whether a deferred result was read.

Every event names the flow run (role ``flow-run``) and, where there is one, the
task run (role ``task-run``) as related resources, with explicit ids: the
session may end after Prefect's run context is gone (a task runner's exit), so
Prefect's own context lookup cannot be relied on.
"""

from __future__ import annotations

import contextvars
import datetime
import logging
from typing import Any

logger = logging.getLogger("prefect_cudf_polars.events")

ENGINE_STARTED = "prefect_cudf_polars.engine.started"
ENGINE_STOPPED = "prefect_cudf_polars.engine.stopped"
RESULT_CREATED = "prefect_cudf_polars.result.created"
RESULT_CONSUMED = "prefect_cudf_polars.result.consumed"
RESULT_RELEASED = "prefect_cudf_polars.result.released"

SESSION_RESOURCE = "prefect-cudf-polars.engine-session"
RESULT_RESOURCE = "prefect-cudf-polars.result"


def run_resources(
    flow_run_id: Any = None, task_run_id: Any = None, *, task_run_role: str = "task-run"
) -> list[dict[str, str]]:
    """
    Related resources for a flow run and a task run (either may be ``None``).

    Parameters
    ----------
    flow_run_id, task_run_id
        UUIDs (or their strings) of the runs.
    task_run_role
        Role of the task run (``"task-run"``; ``"consumer"`` for the reader of a result).

    Returns
    -------
    list of dict
        Prefect resource dicts (``prefect.resource.id``, ``prefect.resource.role``).
    """
    related = []
    if flow_run_id is not None:
        related.append(
            {"prefect.resource.id": f"prefect.flow-run.{flow_run_id}", "prefect.resource.role": "flow-run"}
        )
    if task_run_id is not None:
        related.append(
            {
                "prefect.resource.id": f"prefect.task-run.{task_run_id}",
                "prefect.resource.role": task_run_role,
            }
        )
    return related


def emit(
    event: str,
    resource: dict[str, str],
    *,
    related: list[dict[str, str]],
    payload: dict[str, Any],
    detached: bool = False,
    occurred: datetime.datetime | None = None,
) -> None:
    """
    Send one event with :func:`prefect.events.emit_event`; never raises.

    A monitoring failure (no API, a full queue) must not fail a query or the
    session's teardown, so errors are logged at WARNING and dropped.

    Parameters
    ----------
    detached
        Send it with no Prefect run context visible, so only ``related`` names
        runs. For events sent after the flow run's context is gone (a task
        runner's session end): Prefect's events worker otherwise attaches
        whatever run context its own thread last saw.
    occurred : datetime.datetime, optional
        When it happened (timezone-aware); default: now. The monitor's writer
        sends events after the fact, so it passes the time its hook ran.
    """
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.events import emit_event

    def send() -> None:
        if detached:
            FlowRunContext.__var__.set(None)
            TaskRunContext.__var__.set(None)
        emit_event(event=event, resource=resource, occurred=occurred, related=related, payload=payload)

    try:
        contextvars.copy_context().run(send)
    except Exception as exc:  # pragma: no cover - depends on the API being down
        logger.warning("Could not emit Prefect event %s: %s", event, exc)


def fused_payload(fused: Any) -> list[dict[str, Any]]:
    """The ``fused_steps`` of a ``result.created`` payload: one dict per :class:`FusedStep`."""
    return [
        {"name": step.name, "produced_by": step.produced_by, "task_run_id": step.task_run_id}
        for step in fused
    ]


def session_resource(session_id: str, backend: str | None) -> dict[str, str]:
    """The resource of an engine session event."""
    return {
        "prefect.resource.id": f"{SESSION_RESOURCE}.{session_id}",
        "prefect.resource.name": f"cudf-polars engine ({backend})",
        "backend": str(backend),
    }


def result_resource(result: Any) -> dict[str, str]:
    """The resource of a result event (``result`` is a GPUResult)."""
    return {
        "prefect.resource.id": f"{RESULT_RESOURCE}.{result.id}",
        "prefect.resource.name": result.name,
        "backend": result.backend,
        "session-id": result.session_id,
    }
