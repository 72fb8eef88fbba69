"""What a GPU task shows in the UI: its task run's name and its result artifact, read back through the API."""

from __future__ import annotations

import re

import polars as pl
from prefect import flow

from api_reads import artifacts_of, task_runs_of
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task


@gpu_task
def busy_customers(orders_result: GPUResult) -> pl.LazyFrame:
    return orders_result.lazy().group_by("customer").agg(pl.len().alias("orders"))


def _run(flow_fn):
    state = flow_fn(return_state=True)
    assert state.is_completed(), state
    return state.state_details.flow_run_id


def test_task_runs_are_named_after_their_query_and_can_be_renamed(orders):
    renamed = busy_customers.with_options(task_run_name="customers-{orders_result.name}")

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        counts = collect(busy_customers(r))
        again = renamed(execute(pl.scan_parquet(orders)))
        collect(execute(again))
        return counts

    names = set(task_runs_of(_run(pipeline), expect=7))
    assert {"orders", "busy_customers", "collect-busy_customers"} <= names
    # Defaults for an unnamed query and the override on .with_options.
    assert {"execute-query", "customers-query", "collect-busy_customers"} <= names


def test_each_gpu_task_run_gets_an_artifact_with_plan_schema_placement_memory_seconds(orders):
    seen = {}

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        r = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 50), name="big-orders")
        seen["result"] = (r.id, r.engine_seconds, dict(r.schema))
        return collect(busy_customers(r))

    flow_run_id = _run(pipeline)
    runs = task_runs_of(flow_run_id, expect=3)
    [artifact] = artifacts_of(task_run_id=runs["big-orders"].id)
    text = artifact.data
    result_id, seconds, schema = seen["result"]
    assert artifact.type == "markdown" and artifact.flow_run_id == flow_run_id
    assert "cudf-polars result `big-orders`" in text
    # polars' optimized plan (the filter pushed into the parquet scan), as explain() gives it.
    plan = pl.scan_parquet(orders).filter(pl.col("amount") > 50).explain()
    assert "SELECTION" in plan and f"```\n{plan}\n```" in text
    for name, dtype in schema.items():
        assert f"| `{name}` | `{dtype}` |" in text
    assert "| backend | cpu |" in text
    assert "| ranks (GPUs) | 0 |" in text and "| partitions | 1 |" in text
    assert f"| engine call | {seconds:.3f} s |" in text
    assert f"`{result_id}`" in text
    # Memory after the call: the cpu backend's host store holds the filtered orders.
    held = pl.read_parquet(orders).filter(pl.col("amount") > 50).estimated_size()
    bytes_after = int(re.search(r"\| memory in use after \| ([\d,]+) bytes", text)[1].replace(",", ""))
    assert bytes_after == held
    assert "host store of the cpu backend" in text
    # The chained gpu_task has its own artifact; collect (host result) has none.
    [chained] = artifacts_of(task_run_id=runs["busy_customers"].id)
    assert "cudf-polars result `busy_customers`" in chained.data and "`orders`" in chained.data
    assert artifacts_of(task_run_id=runs["collect-busy_customers"].id) == []


def test_a_refused_persistence_request_is_an_artifact_on_the_task_run(orders):
    persisting = busy_customers.with_options(persist_result=True)

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        return collect(persisting(execute(pl.scan_parquet(orders), name="orders")))

    runs = task_runs_of(_run(pipeline), expect=3)
    texts = [a.data for a in artifacts_of(task_run_id=runs["busy_customers"].id)]
    [refusal] = [t for t in texts if t.startswith("### Result persistence refused")]
    assert "task `busy_customers`" in refusal and "persist_result=True" in refusal
    assert "**Nothing was persisted**" in refusal and "collect the data to the host" in refusal
    # The task that asked nothing has no refusal.
    assert not any("persistence refused" in a.data for a in artifacts_of(task_run_id=runs["orders"].id))
