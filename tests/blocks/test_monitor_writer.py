"""
When the monitor's writer prints a result's plan: as soon as it takes the result's record,
on its own thread, ahead of the artifact's API write and while the session is still open
(real Prefect API, cpu backend).
"""

from __future__ import annotations

import threading
import time

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
