"""
What a GPU task run's page says of the GPU: one line in its Logs tab per result it made (rows,
bytes, partitions, the engine call's seconds; a deferred step says nothing ran), and one each
time the result moves to host memory or back, read back through the API. The lines go to
Prefect's API log handler only, not to the console.
"""

from __future__ import annotations

import logging
import re
import uuid

import polars as pl
from prefect import flow

from api_reads import artifacts_of, log_records, task_run_list, task_runs_of
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, telemetry
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task

ROWS = 100_000
TABLE_BYTES = 1_600_000  # two 8-byte columns of ROWS rows, as polars' estimated_size counts them


@gpu_task
def busy_customers(orders_result: GPUResult) -> pl.LazyFrame:
    return orders_result.lazy().group_by("customer").agg(pl.len().alias("orders"))


@gpu_task(name="small-orders", defer=True)
def small_orders(orders_result: GPUResult) -> pl.LazyFrame:
    return orders_result.lazy().filter(pl.col("amount") < 10)


@gpu_task
def total(*parts: GPUResult) -> pl.LazyFrame:
    return pl.concat([p.lazy() for p in parts]).select(pl.col("v").sum(), pl.len())


def lines_of(flow_run_id, expect: str) -> dict[object, list[logging.LogRecord]]:
    """The cudf-polars lines of a flow run's log, by the task run they belong to (``None``: the flow run)."""
    by_run: dict[object, list] = {}
    for record in log_records(flow_run_id, expect=expect):
        if record.message.startswith("cudf-polars"):
            by_run.setdefault(record.task_run_id, []).append(record)
    return by_run


def test_a_gpu_task_runs_log_says_what_it_made_on_the_engine(orders, caplog):
    made = {}

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        big = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 50), name="big-orders")
        made["big-orders"] = (big.rows, big.bytes, big.engine_seconds)
        counts = busy_customers(big)
        made["busy_customers"] = (counts.rows, counts.bytes, counts.engine_seconds)
        return collect(counts), collect(small_orders(execute(pl.scan_parquet(orders), name="orders")))

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    runs = task_runs_of(flow_run_id, expect=6, final=True)
    by_run = lines_of(flow_run_id, expect="cudf-polars deferred step 'small-orders'")
    big = pl.read_parquet(orders).filter(pl.col("amount") > 50)
    assert made["big-orders"][:2] == (big.height, big.estimated_size())
    for name, (rows, size, seconds) in made.items():
        [line] = by_run[runs[name].id]
        assert line.level == logging.INFO and line.name == "prefect.task_runs"
        assert line.message == (f"cudf-polars result {name!r}: {rows} rows, {size:,} bytes ({size / 2**20:,.1f} MiB), "
                                f"1 partition(s) on the engine (cpu); engine call {seconds:.3f} s")
    [deferred] = by_run[runs["small-orders"].id]
    assert deferred.message == ("cudf-polars deferred step 'small-orders': nothing ran; its plan runs fused into the "
                                "engine call of the task run that reads it")
    # A collect brings rows to the host: its task run made no result on the engine.
    assert runs["collect-busy_customers"].id not in by_run
    # The lines are the task runs' own: on their pages, not on the console or in the flow run's log.
    assert not any("cudf-polars result" in r.message for r in by_run.get(None, []))
    assert "cudf-polars result" not in caplog.text and "engine session ended" in caplog.text


def test_a_result_moved_to_host_memory_says_so_on_the_task_run_that_made_it():
    @flow(name="moves", task_runner=CudfPolarsTaskRunner(
        CudfPolarsEngine(backend="cpu", device_memory_limit=6_000_000, spill_results="host")))
    def pipeline():
        held = [execute(pl.LazyFrame({"k": range(ROWS), "v": [float(i)] * ROWS}), name=f"table-{i}")
                for i in range(4)]
        return collect(total(held[0], held[1])), collect(total(held[2], held[3]))

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    readers = {str(run.id): run.name for run in task_run_list(flow_run_id, expect=8, final=True)}
    table_0 = next(run_id for run_id, name in readers.items() if name == "table-0")
    by_run = lines_of(flow_run_id, expect="engine session ended")  # the run's last line: the earlier ones are in
    made, out, back = [line.message for line in by_run[uuid.UUID(table_0)]]
    assert made.startswith(f"cudf-polars result 'table-0': {ROWS} rows, {TABLE_BYTES:,} bytes (1.5 MiB), ")
    assert re.fullmatch(rf"cudf-polars result 'table-0' moved to host memory \(host frame\) in \d+\.\d{{3}} s "
                        rf"\({TABLE_BYTES:,} bytes \(1\.5 MiB\)\) to make room within device_memory_limit",
                        out), out
    reader = re.fullmatch(r"cudf-polars result 'table-0' read back from host memory \(host frame\) by task run "
                          r"'total' \(id (\S+)\)", back)
    assert reader and readers[reader[1]] == "total", back
    # The flow run's end line and the session summary count the moves; the summary lists the moved results.
    [ended] = [r.message for r in by_run[None] if "engine session ended" in r.message]
    assert re.search(r"spill_results=host: [2-9] result\(s\) moved to host memory", ended), ended
    [summary] = artifacts_of(flow_run_id=flow_run_id, key=telemetry.summary_key("moves"))
    assert re.search(r"^\* `table-0`: out in \d+\.\d{3} s \(host frame\); read back$", summary.data, re.MULTILINE), \
        summary.data
    assert re.search(r"\| moved to host memory \| 2 result\(s\), .*; 2 by host frame \|", summary.data), summary.data
