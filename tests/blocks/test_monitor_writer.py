"""
When the monitor's writer prints a result's plan: as soon as it takes the result's record,
on its own thread, ahead of the artifact's API write and while the session is still open
(real Prefect API, cpu backend).
"""

from __future__ import annotations

import threading
import time

import anyio
import polars as pl
from prefect import flow

from api_reads import artifacts_of, task_runs_of
from prefect_cudf_polars.blocks.monitoring import artifacts
from prefect_cudf_polars.blocks.monitoring.writer import WRITER
from prefect_cudf_polars.tasks import execute


def test_the_writer_prints_a_results_plan_when_it_takes_the_record_before_the_session_ends(
    cpu_block, orders, monkeypatch
):
    printed: list[tuple[str, str]] = []
    query_plan = artifacts.query_plan

    def recording_query_plan(lf):
        plan = query_plan(lf)
        printed.append((threading.current_thread().name, plan))
        return plan

    monkeypatch.setattr(artifacts, "query_plan", recording_query_plan)
    seen: dict = {}

    @flow
    def early() -> None:
        from prefect.context import get_run_context

        flow_run_id = get_run_context().flow_run.id
        with cpu_block.session():
            WRITER.hold_artifacts()  # no result artifact is written: only the record's taking prints the plan
            try:
                execute(pl.scan_parquet(orders).filter(pl.col("customer") == 3), name="threes")
                deadline = time.monotonic() + 30.0
                while not printed and time.monotonic() < deadline:
                    time.sleep(0.01)
                seen["while_open"] = list(printed)
                seen["written"] = [a for a in artifacts_of(flow_run_id=flow_run_id) if a.task_run_id is not None]
            finally:
                WRITER.release_artifacts()

    state = early(return_state=True)
    assert state.is_completed(), state
    plan = pl.scan_parquet(orders).filter(pl.col("customer") == 3).explain()
    assert seen["while_open"] == [("cudf-polars-monitor", plan)], "the plan was not printed by the writer while the session was open"
    assert seen["written"] == [], "the result artifact was written while artifacts were held"
    assert len(printed) == 1, "the session's end printed the plan again"
    runs = task_runs_of(state.state_details.flow_run_id, expect=1, final=True)
    [artifact] = artifacts_of(task_run_id=runs["threes"].id)
    assert f"```\n{plan}\n```" in artifact.data


def _artifact_records(count: int, sent: list[int]) -> list:
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.settings import PREFECT_API_URL

    from prefect_cudf_polars.blocks.monitoring.writer import Record

    return [
        Record(
            send=lambda i=i: sent.append(i),
            build=lambda i=i: ArtifactCreate(type="markdown", data=f"record {i}", description="pacing test"),
            api_url=PREFECT_API_URL.value(),
        )
        for i in range(count)
    ]


def test_a_busy_api_gets_one_write_at_a_time_and_a_quick_one_four(monkeypatch):
    """The writer paces itself on the API's answer times; events keep the order they were put in."""
    from prefect.client.orchestration import PrefectClient

    from prefect_cudf_polars.blocks.monitoring import writer as writer_module

    send = PrefectClient.request
    answer_s = {"value": 0.6}  # seconds the API takes per artifact write: busy first
    state = {"in_flight": 0, "most": 0}
    starts: list[float] = []

    async def timed(self, method, path, *args, **kwargs):
        if method != "POST" or path != "/artifacts/":
            return await send(self, method, path, *args, **kwargs)
        state["in_flight"] += 1
        state["most"] = max(state["most"], state["in_flight"])
        starts.append(time.monotonic())
        try:
            await anyio.sleep(answer_s["value"])
            return await send(self, method, path, *args, **kwargs)
        finally:
            state["in_flight"] -= 1

    monkeypatch.setattr(PrefectClient, "request", timed)
    writer = writer_module.MonitorWriter()
    sent: list[int] = []
    busy = _artifact_records(4, sent)
    for record in busy:
        writer.put(record)
    assert writer.drain(30.0)
    # The first writes went out together; each answered in 0.6 s > BUSY_S, so the API is busy.
    assert writer.api_busy(busy[0].api_url)
    state["most"] = 0
    starts.clear()
    more = _artifact_records(2, sent)
    for record in more:
        writer.put(record)
    assert writer.drain(30.0)
    assert state["most"] == 1, "more than one write in flight on a busy API"
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # Its write, then BUSY_WAIT_FACTOR times as long before the next.
    assert all(gap >= (1 + writer_module.BUSY_WAIT_FACTOR) * answer_s["value"] - 0.05 for gap in gaps), gaps
    # A quick answer: full speed again.
    answer_s["value"] = 0.01
    writer.put(_artifact_records(1, sent)[0])
    assert writer.drain(30.0)
    assert not writer.api_busy(busy[0].api_url)
    state["most"] = 0
    answer_s["value"] = 0.1
    for record in _artifact_records(12, sent):
        writer.put(record)
    assert writer.drain(30.0)
    assert state["most"] == writer_module.CONCURRENCY
    assert sent == list(range(4)) + list(range(2)) + [0] + list(range(12))
