"""
Reading back what a flow run showed the UI: task runs, logs, artifacts and events, through Prefect's client.

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


def task_run_list(flow_run_id, *, expect: int = 0, final: bool = False, timeout: float = 30.0) -> list[Any]:
    """
    Every task run of a flow run (mapped runs included, one entry each).

    Prefect 3.9's API records task runs from their events, a moment after they ran: with
    ``expect``, poll until that many are there; with ``final``, also until there is at
    least one and each is in a final state, so that its record holds what its last event
    said (its name included); or until ``timeout`` seconds pass.
    """
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(
                task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]))
            )
        settled = not final or (bool(runs) and all(run.state is not None and run.state.is_final() for run in runs))
        if (len(runs) >= expect and settled) or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def final_task_run(task_run_id, *, timeout: float = 30.0) -> Any:
    """One task run's record once it holds a final state (Prefect 3.9 records it from its events, a moment after
    the run), or as it is when ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            run = client.read_task_run(task_run_id)
        if (run.state is not None and run.state.is_final()) or time.monotonic() > deadline:
            return run
        time.sleep(0.5)


def task_runs_of(flow_run_id, *, expect: int = 0, final: bool = False, timeout: float = 30.0) -> dict[str, Any]:
    """The task runs of a flow run, by name (see :func:`task_run_list` for ``expect`` and ``final``)."""
    return {run.name: run for run in task_run_list(flow_run_id, expect=expect, final=final, timeout=timeout)}


def log_records(flow_run_id, *, expect: str | None = None, timeout: float = 20.0) -> list[Any]:
    """
    The log records (level, message, task run id) of a flow run and its task runs.

    Prefect's API log handler sends logs in batches, so this polls until ``expect`` shows up
    in a message (or ``timeout`` seconds pass).
    """
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            )
        if expect is None or any(expect in log.message for log in logs) or time.monotonic() > deadline:
            return logs
        time.sleep(0.25)


def artifacts_of(*, flow_run_id=None, task_run_id=None, key: str | None = None) -> list[Any]:
    """Artifacts attached to a flow run or a task run (optionally of one key); they are written synchronously."""
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
    return _poll_events(flt, expect=expect, timeout=timeout)


def related_ids(event: Any, role: str) -> list[str]:
    """Ids of an event's related resources of one role."""
    return [r.id for r in event.related if r.role == role]


def asset_events(asset_key: str, *, expect: dict[str, int], timeout: float = 30.0) -> list[Any]:
    """
    The ``prefect.asset.*`` events whose resource is the asset ``asset_key``.

    Polls until each event name in ``expect`` was seen at least that many times,
    or ``timeout`` seconds pass (then returns what arrived; the test's asserts fail).
    """
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    flt = EventFilter(
        event=EventNameFilter(prefix=["prefect.asset."]),
        resource=EventResourceFilter(id=[asset_key]),
    )
    return _poll_events(flt, expect=expect, timeout=timeout)


def _poll_events(flt: Any, *, expect: dict[str, int], timeout: float) -> list[Any]:
    """Read events matching ``flt`` until each name in ``expect`` came that many times (or ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            found = client.read_events(filter=flt, limit=50).events
        names = [e.event for e in found]
        if all(names.count(n) >= k for n, k in expect.items()) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def flow_runs_of_flow(flow_name: str) -> list[Any]:
    """The flow runs of the flow named ``flow_name``, oldest first (for a flow whose call raised)."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            sort=FlowRunSort.START_TIME_ASC,
        )
