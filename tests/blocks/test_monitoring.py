"""
What an engine session shows in the UI: its keyed summary artifact and its Prefect events,
read back through Prefect's client API (cpu backend, real local API).
"""

from __future__ import annotations

import logging
import re

import polars as pl
import pytest
from prefect import flow
from prefect.logging.handlers import APILogWorker

from api_reads import artifacts_of, events_of, log_records, related_ids, task_runs_of
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task
from prefect_cudf_polars.blocks.telemetry import summary_key
from prefect_cudf_polars.blocks import telemetry as ev


@gpu_task(name="customer-totals")
def customer_totals(orders_result: GPUResult) -> pl.LazyFrame:
    return orders_result.lazy().group_by("customer").agg(pl.col("amount").sum())


def _three_results(orders):
    """Produce 3 results: 2 consumed (by customer-totals and collect), 1 left live."""
    totals = customer_totals(execute(pl.scan_parquet(orders), name="orders"))
    execute(pl.scan_parquet(orders).head(10), name="left-over")
    return collect(totals)


@pytest.mark.parametrize("opened_by", ["task-runner", "with-block"])
def test_session_summary_is_a_keyed_artifact_of_the_flow_run(orders, opened_by):
    if opened_by == "task-runner":
        # The runner closes the session after the flow run's context is gone.
        @flow(name=f"summary-{opened_by}", task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
        def pipeline():
            return _three_results(orders)
    else:
        @flow(name=f"summary-{opened_by}")
        def pipeline():
            with CudfPolarsEngine(backend="cpu").session():
                return _three_results(orders)

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    key = summary_key(f"summary-{opened_by}")
    assert key == f"summary-{opened_by}-cudf-polars-session"
    [artifact] = artifacts_of(flow_run_id=flow_run_id, key=key)
    text = artifact.data
    assert artifact.type == "markdown" and artifact.task_run_id is None
    assert "| backend | cpu |" in text
    assert "| results produced | 3 |" in text
    assert "| results consumed | 2 |" in text
    assert "| results released unconsumed | 1 |" in text
    assert "| GPUs | none (cpu backend) |" in text
    assert "| Dask dashboard | none (no Dask cluster) |" in text
    for row in ("peak memory", "engine start", "engine shutdown", "memory at the end", "held then by unread results"):
        assert f"| {row} |" in text
    # Every result with its facts, and what became of it.
    assert "#### Results (3)" in text
    assert "| `orders` |" in text and "| `customer-totals` |" in text
    assert "| `left-over` | left-over | released unread | 10 | 240 |" in text
    # A second flow run adds a version under the same key.
    assert pipeline(return_state=True).is_completed()
    assert len(artifacts_of(key=key)) == 2


@gpu_task(name="big-orders", defer=True)
def big_orders(path: str) -> pl.LazyFrame:
    return pl.scan_parquet(path).filter(pl.col("amount") > 50)


def test_the_sessions_end_warns_naming_every_result_no_task_read(orders):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        collect(customer_totals(execute(pl.scan_parquet(orders), name="orders")))
        execute(pl.scan_parquet(orders).head(10), name="left-over")
        big_orders(orders)  # a deferred step whose reader never runs
        return execute(pl.scan_parquet(orders), name="returned")

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    warning = "result(s) no task read, at the engine session's end"
    [record] = [r for r in log_records(state.state_details.flow_run_id, expect=warning) if warning in r.message]
    assert record.level == logging.WARNING
    assert record.message.startswith("cudf-polars released 3 result(s) no task read, at the engine session's end")
    assert "session ended" not in record.message  # the end line is the one line that says so
    named = re.findall(r"'([\w-]+)' \((deferred, )?from task run '([\w-]+)'", record.message)
    assert sorted(named) == [("big-orders", "deferred, ", "big-orders"), ("left-over", "", "left-over"),
                             ("returned", "", "returned")]
    assert "collect it to keep its rows" in record.message


def test_with_every_result_read_the_sessions_end_has_no_unread_warning(orders):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        return collect(customer_totals(execute(pl.scan_parquet(orders), name="orders"))).height

    state = pipeline(return_state=True)
    APILogWorker.drain_all()  # every line of the run is in the API: a warning would be there too
    messages = [r.message for r in log_records(state.state_details.flow_run_id, expect="engine session ended")]
    assert any("released unconsumed 0" in m for m in messages)
    assert not any("no task read" in m for m in messages)


def test_the_end_line_says_memory_at_the_end_is_what_the_unread_results_hold_until_the_shutdown(orders):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        return _three_results(orders)

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    [line] = [r.message for r in log_records(state.state_details.flow_run_id, expect="engine session ended")
              if "engine session ended" in r.message]
    # 'left-over' (10 rows, 240 bytes) was not read: the engine's shutdown frees it after the reading.
    assert ("; host store at start 0, peak 24000, at the end 240 (bytes; read before the engine's shutdown, which "
            "frees the 240 held by 1 unread result(s)); engine start ") in line, line
    [stopped] = [e for e in events_of(state.state_details.flow_run_id, expect={ev.ENGINE_STOPPED: 1})
                 if e.event == ev.ENGINE_STOPPED]
    assert stopped.payload["memory"] == {"at_start": 0, "at_end": 240} and stopped.payload["unread_held_at_end"] == 240


def test_lifecycle_events_name_the_flow_run_and_task_runs(orders):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        return _three_results(orders)

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    expect = {ev.ENGINE_STARTED: 1, ev.ENGINE_STOPPED: 1, ev.RESULT_CREATED: 3,
              ev.RESULT_CONSUMED: 2, ev.RESULT_RELEASED: 1}
    found = events_of(flow_run_id, expect=expect)
    by_name = {}
    for event in found:
        by_name.setdefault(event.event, []).append(event)
    assert {name: len(by_name.get(name, [])) for name in expect} == expect

    runs = task_runs_of(flow_run_id, expect=4, final=True)
    flow_ref = [f"prefect.flow-run.{flow_run_id}"]
    task_ref = lambda name: [f"prefect.task-run.{runs[name].id}"]  # noqa: E731
    for event in found:
        assert related_ids(event, "flow-run") == flow_ref, (event.event, [(r.id, r.role) for r in event.related])

    created = {e.payload["name"]: e for e in by_name[ev.RESULT_CREATED]}
    assert set(created) == {"orders", "customer-totals", "left-over"}
    for name, event in created.items():
        assert related_ids(event, "task-run") == task_ref(name)
        assert event.resource.id.startswith("prefect-cudf-polars.result.")
        assert event.payload["backend"] == "cpu" and event.payload["partitions"] == 1
        assert event.payload["memory_in_use_bytes"] > 0
        # Sent from the task's thread: it happened inside its task run, and carries the result's facts.
        assert runs[name].start_time <= event.occurred <= runs[name].end_time, (name, event.occurred)
        assert event.payload["rows"] > 0 and event.payload["bytes"] > 0
        assert event.payload["plan"].strip()
    assert created["orders"].payload["schema"] == {"id": "Int64", "customer": "Int64", "amount": "Float64"}
    assert created["orders"].payload["rows"] == 1000 and created["left-over"].payload["rows"] == 10
    assert "Parquet SCAN" in created["orders"].payload["plan"]
    consumed = {e.payload["name"]: e for e in by_name[ev.RESULT_CONSUMED]}
    assert related_ids(consumed["orders"], "task-run") == task_ref("customer-totals")
    assert related_ids(consumed["orders"], "producer") == task_ref("orders")
    assert related_ids(consumed["customer-totals"], "task-run") == task_ref("collect-customer-totals")

    # The result nobody read is released at session end: the event to alert on.
    [released] = by_name[ev.RESULT_RELEASED]
    assert released.payload == {"name": "left-over", "unconsumed": True, "at_session_end": True}
    assert released.resource.id == created["left-over"].resource.id
    assert related_ids(released, "task-run") == task_ref("left-over")

    [started] = by_name[ev.ENGINE_STARTED]
    [stopped] = by_name[ev.ENGINE_STOPPED]
    assert started.resource.id == stopped.resource.id
    assert started.resource.id.startswith("prefect-cudf-polars.engine-session.")
    assert started.payload["backend"] == "cpu" and started.payload["gpus"] == []
    assert stopped.payload["counts"] == {"produced": 3, "consumed": 2, "released_unconsumed": 1}
    # The event carries the session's timings (seconds), the figures its summary artifact shows.
    timings = stopped.payload["timings"]
    assert set(timings) == {"engine_start_s", "admission_wait_s", "engine_shutdown_s"}
    [summary] = artifacts_of(flow_run_id=flow_run_id, key=summary_key("pipeline"))
    for row, key in (("engine start", "engine_start_s"), ("engine shutdown", "engine_shutdown_s"),
                     ("admission wait", "admission_wait_s")):
        assert f"| {row} | {timings[key]:.2f} s |" in summary.data, (key, timings, summary.data)
