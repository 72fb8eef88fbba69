"""
What GPU tasks show in the UI, read back through the API: task run names, the flow run's session
summary listing every result, the ``result.created`` events' facts, and, with the block's
``result_artifacts``, one artifact per result on the task run that produced it.
"""

from __future__ import annotations

import re

import polars as pl
from prefect import flow

from api_reads import artifacts_of, events_of, task_runs_of
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.blocks import telemetry
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task


@gpu_task
def busy_customers(orders_result: GPUResult) -> pl.LazyFrame:
    return orders_result.lazy().group_by("customer").agg(pl.len().alias("orders"))


@gpu_task
def customer_orders(path: str, customer: int) -> pl.LazyFrame:
    return pl.scan_parquet(path).filter(pl.col("customer") == customer)


def _run(flow_fn):
    state = flow_fn(return_state=True)
    assert state.is_completed(), state
    return state.state_details.flow_run_id


def summary_text(flow_run_id, flow_name: str) -> str:
    """The markdown of the flow run's session summary artifact."""
    [summary] = artifacts_of(flow_run_id=flow_run_id, key=telemetry.summary_key(flow_name))
    assert summary.type == "markdown" and summary.task_run_id is None
    return summary.data


def table_after(text: str, heading: str, columns: list[str]) -> list[dict[str, str]]:
    """The rows of the markdown table under ``heading``, each as a dict of its ``columns``."""
    lines = text[text.index(heading):].split("\n\n")[1].splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == columns, lines[0]
    return [dict(zip(columns, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def summary_results(text: str) -> list[dict[str, str]]:
    """Each result of the summary, the columns of its two tables in one dict; checks the count in "Results (N)"."""
    header = re.search(r"^#### Results \((\d+)\)$", text, re.MULTILINE)
    assert header, f"no Results table in:\n{text}"
    made = table_after(text, header[0], ["result", "produced by task run", "at the end", "rows", "bytes"])
    calls = table_after(text, "#### Each result's task run and engine call",
                        ["result", "task run id", "partitions", "engine s"])
    assert [r["result"] for r in made] == [r["result"] for r in calls], text
    more = re.search(r"^\.\.\. and (\d+) more", text, re.MULTILINE)
    assert len(made) + (int(more[1]) if more else 0) == int(header[1]), text
    return [{**m, **c} for m, c in zip(made, calls, strict=True)]


def _bytes(cell: str) -> int:
    found = re.match(r"([\d,]+) bytes", cell)
    assert found, cell
    return int(found[1].replace(",", ""))


def test_task_runs_are_named_after_their_query_and_can_be_renamed(orders):
    renamed = busy_customers.with_options(task_run_name="customers-{orders_result.name}")

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        counts = collect(busy_customers(r))
        again = renamed(execute(pl.scan_parquet(orders)))
        collect(execute(again))
        return counts

    names = set(task_runs_of(_run(pipeline), expect=7, final=True))
    assert {"orders", "busy_customers", "collect-busy_customers"} <= names
    # Defaults for an unnamed query and the override on .with_options.
    assert {"execute-query", "customers-query", "collect-busy_customers"} <= names


def test_with_result_artifacts_each_gpu_task_run_gets_an_artifact_with_plan_schema_rows_bytes_placement(orders):
    seen = {}

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu", result_artifacts=True)))
    def pipeline():
        r = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 50), name="big-orders")
        seen["result"] = (r.id, r.engine_seconds, dict(r.schema))
        return collect(busy_customers(r))

    flow_run_id = _run(pipeline)
    runs = task_runs_of(flow_run_id, expect=3, final=True)
    [artifact] = artifacts_of(task_run_id=runs["big-orders"].id)
    text = artifact.data
    result_id, seconds, schema = seen["result"]
    big = pl.read_parquet(orders).filter(pl.col("amount") > 50)
    assert artifact.key == telemetry.result_key("big-orders") == "big-orders-gpu-result"  # its title in the UI
    assert artifact.type == "markdown" and artifact.flow_run_id == flow_run_id
    assert "cudf-polars result `big-orders`" in text
    assert artifact.description.startswith("cudf-polars result 'big-orders'")
    # polars' optimized plan (the filter pushed into the parquet scan), as explain() gives it.
    plan = pl.scan_parquet(orders).filter(pl.col("amount") > 50).explain()
    assert "SELECTION" in plan and f"```\n{plan}\n```" in text
    assert f"#### Output schema ({len(schema)} columns)" in text
    for name, dtype in schema.items():
        assert f"| `{name}` | `{dtype}` |" in text
    # Where it lives, its size, what the call took.
    assert "| backend | cpu |" in text
    assert "| ranks (GPUs) | 0 |" in text and "| partitions | 1 |" in text
    assert f"| rows | {big.height} |" in text
    assert _bytes(re.search(r"\| bytes \| ([^|]+) \|", text)[1]) == big.estimated_size()
    assert f"| engine call | {seconds:.3f} s |" in text
    assert f"`{result_id}`" in text
    # Memory after the call: the cpu backend's host store holds the filtered orders.
    assert _bytes(re.search(r"\| memory in use after \| ([^|]+) \|", text)[1]) == big.estimated_size()
    # The chained gpu_task has its own artifact; collect (host result) has none.
    [chained] = artifacts_of(task_run_id=runs["busy_customers"].id)
    assert "cudf-polars result `busy_customers`" in chained.data and "| `orders` | `UInt32` |" in chained.data
    assert "| rows | 7 |" in chained.data
    assert artifacts_of(task_run_id=runs["collect-busy_customers"].id) == []
    # The summary says how the memory figures are measured on this backend.
    assert "| memory measured as | host store of the cpu backend |" in summary_text(flow_run_id, "pipeline")


def test_result_artifacts_are_written_only_with_the_block_option_and_the_summary_lists_every_result(orders):
    def pipeline_with(block: CudfPolarsEngine):
        @flow(name="orders-report", task_runner=CudfPolarsTaskRunner(block))
        def pipeline():
            r = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 50), name="big-orders")
            execute(pl.scan_parquet(orders), name="left-unread")
            return collect(busy_customers(r))

        return pipeline

    names = ("big-orders", "left-unread", "busy_customers", "collect-busy_customers")
    on = _run(pipeline_with(CudfPolarsEngine(backend="cpu", result_artifacts=True)))
    on_runs = task_runs_of(on, expect=4, final=True)
    for name in names[:3]:
        [artifact] = artifacts_of(task_run_id=on_runs[name].id)
        assert f"cudf-polars result `{name}`" in artifact.data
        assert "#### Query plan (as the engine ran it)" in artifact.data and "#### Output schema" in artifact.data
    assert artifacts_of(task_run_id=on_runs["collect-busy_customers"].id) == []

    off = _run(pipeline_with(CudfPolarsEngine(backend="cpu")))
    off_runs = task_runs_of(off, expect=4, final=True)
    assert set(names) <= set(off_runs)
    assert all(artifacts_of(task_run_id=run.id) == [] for run in off_runs.values())
    [summary] = artifacts_of(flow_run_id=off)  # the flow run's only artifact
    assert summary.key == telemetry.summary_key("orders-report") == "orders-report-cudf-polars-session"

    # Both flow runs' summaries list every result: who made it, its state at the end, its figures.
    table = pl.read_parquet(orders)
    big, everything = table.filter(pl.col("amount") > 50), table
    per_customer = big.group_by("customer").agg(pl.len().alias("orders"))
    expected = {
        "big-orders": ("consumed", big),
        "left-unread": ("released unread", everything),
        "busy_customers": ("consumed", per_customer),
    }
    for flow_run_id, runs in ((on, on_runs), (off, off_runs)):
        text = summary_text(flow_run_id, "orders-report")
        assert "| results produced | 3 |" in text and "| results released unconsumed | 1 |" in text
        rows = {r["result"]: r for r in summary_results(text)}
        assert set(rows) == {f"`{name}`" for name in expected}
        for name, (state, frame) in expected.items():
            row = rows[f"`{name}`"]
            assert (row["produced by task run"], row["task run id"]) == (name, str(runs[name].id))
            assert row["at the end"] == state
            assert row["rows"] == str(frame.height) and row["bytes"] == f"{frame.estimated_size():,}"
            assert row["partitions"] == "1" and float(row["engine s"]) >= 0
        # Memory at the end: read before the engine's shutdown, it is the result nobody read, which the shutdown frees.
        unread = f"{everything.estimated_size():,} bytes ({everything.estimated_size() / 2**20:,.1f} MiB)"
        assert f"| memory at the end | {unread} |" in text and f"| held then by unread results | {unread}, 1 result(s) |" in text
        assert "*memory at the end* is read just before the engine's shutdown, which frees what the unread results hold." in text
        assert "#### Moved to host memory" not in text  # no device_memory_limit: nothing moved

    # The result.created events carry the same facts, with the schema and the plan.
    found = events_of(off, expect={telemetry.RESULT_CREATED: 3})
    created = {e.payload["name"]: e.payload for e in found if e.event == telemetry.RESULT_CREATED}
    assert set(created) == set(expected)
    for name, (_, frame) in expected.items():
        payload = created[name]
        assert payload["backend"] == "cpu" and payload["ranks"] == [0] and payload["partitions"] == 1
        assert payload["rows"] == frame.height and payload["bytes"] == frame.estimated_size()
        assert payload["schema"] == {k: str(v) for k, v in frame.schema.items()}
        assert payload["deferred"] is False and payload["fused_steps"] == []
        assert payload["engine_seconds"] >= 0 and payload["memory_in_use_bytes"] >= frame.estimated_size()
    # The event's plan is the query's logical plan (the artifact's is the optimized one the engine ran).
    big_query = pl.scan_parquet(orders).filter(pl.col("amount") > 50)
    assert created["big-orders"]["plan"] == big_query.explain(optimized=False)


def test_every_gpu_task_run_of_a_wide_flow_is_listed_in_the_session_summary(cpu_block, orders):
    tasks = 60

    @flow(name="wide", task_runner=CudfPolarsTaskRunner(cpu_block))
    def wide() -> list[str]:
        futures = [
            customer_orders.with_options(task_run_name=f"customer-{i}").submit(str(orders), i % 7)
            for i in range(tasks)
        ]
        return [f.result().id for f in futures]

    flow_run_id = _run(wide)
    runs = task_runs_of(flow_run_id, expect=tasks, final=True)
    gpu_runs = {name: run.id for name, run in runs.items() if name.startswith("customer-")}
    assert len(gpu_runs) == tasks
    text = summary_text(flow_run_id, "wide")
    assert f"| results produced | {tasks} |" in text and f"| results released unconsumed | {tasks} |" in text
    rows = summary_results(text)
    assert len(rows) == tasks
    listed = {(row["produced by task run"], row["task run id"]): row for row in rows}
    table = pl.read_parquet(orders)
    for i in range(tasks):
        name = f"customer-{i}"
        row = listed.get((name, str(gpu_runs[name])))
        assert row is not None, f"task run {name} is not in the summary:\n{text}"
        assert row["result"] == "`customer_orders`" and row["at the end"] == "released unread"
        assert row["rows"] == str(table.filter(pl.col("customer") == i % 7).height)
    # The summary is the flow run's only artifact.
    assert [a.key for a in artifacts_of(flow_run_id=flow_run_id)] == [telemetry.summary_key("wide")]


def test_the_summary_lists_the_first_results_and_counts_the_rest(cpu_block, orders, monkeypatch):
    monkeypatch.setattr(telemetry, "SUMMARY_RESULTS", 3)

    @flow(name="capped", task_runner=CudfPolarsTaskRunner(cpu_block))
    def capped() -> None:
        for i in range(5):
            execute(pl.scan_parquet(orders), name=f"orders-{i}")

    text = summary_text(_run(capped), "capped")
    assert "#### Results (5)" in text and "| results produced | 5 |" in text
    assert [row["result"] for row in summary_results(text)] == ["`orders-0`", "`orders-1`", "`orders-2`"]
    assert "... and 2 more (each in its `result.created` event)" in text


def test_a_refused_persistence_request_is_an_artifact_on_the_task_run(orders):
    persisting = busy_customers.with_options(persist_result=True)

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        return collect(persisting(execute(pl.scan_parquet(orders), name="orders")))

    runs = task_runs_of(_run(pipeline), expect=3, final=True)
    texts = [a.data for a in artifacts_of(task_run_id=runs["busy_customers"].id)]
    [refusal] = [t for t in texts if t.startswith("### Result persistence refused")]
    assert "task `busy_customers`" in refusal and "persist_result=True" in refusal
    assert "nothing was persisted" in refusal and "collect it to the host" in refusal
    # The task that asked nothing has no refusal.
    assert not any("persistence refused" in a.data for a in artifacts_of(task_run_id=runs["orders"].id))
