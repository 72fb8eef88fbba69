"""
Reading back what a flow run showed the UI: artifacts and events, through Prefect's client.

Prefect sends events in the background and persists them asynchronously, so the
event reader polls until the expected events arrive (or a bound passes).
"""

from __future__ import annotations

import time
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    ArtifactFilterTaskRunId,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
)


def task_runs_of(flow_run_id, *, expect: int = 0, timeout: float = 30.0) -> dict[str, Any]:
    """
    The task runs of a flow run, by name.

    Prefect 3.9's API records task runs from their events, a moment after they ran: with
    ``expect``, poll until that many are there (or ``timeout`` seconds pass).
    """
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(
                task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]))
            )
        if len(runs) >= expect or time.monotonic() > deadline:
            return {run.name: run for run in runs}
        time.sleep(0.5)


def artifacts_of(*, flow_run_id=None, task_run_id=None, key: str | None = None) -> list[Any]:
    """Artifacts attached to a flow run or a task run (optionally of one key)."""
    flt = ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]) if flow_run_id else None,
        task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id]) if task_run_id else None,
        key=ArtifactFilterKey(any_=[key]) if key else None,
    )
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=flt)


def events_of(flow_run_id, *, expect: dict[str, int], timeout: float = 30.0) -> list[Any]:
    """
    The ``prefect_cudf_polars.*`` events related to a flow run.

    Polls until each event name in ``expect`` was seen at least that many times,
    or ``timeout`` seconds pass (then returns what arrived; the test's asserts fail).
    """
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    flt = EventFilter(
        event=EventNameFilter(prefix=["prefect_cudf_polars."]),
        related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
    )
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            found = client.read_events(filter=flt, limit=50).events
        names = [e.event for e in found]
        if all(names.count(n) >= k for n, k in expect.items()) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def related_ids(event: Any, role: str) -> list[str]:
    """Ids of an event's related resources of one role."""
    return [r.id for r in event.related if r.role == role]


def flow_runs_of_flow(flow_name: str) -> list[Any]:
    """The flow runs of the flow named ``flow_name``, oldest first (for a flow whose call raised)."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            sort=FlowRunSort.START_TIME_ASC,
        )
