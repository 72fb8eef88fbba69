"""
One query may read a result several times: a self-join, a join with an aggregate of itself, a
``concat`` of two filters, a correlated sub-query, a semi and an anti join over three filtered
reads, and a union of two joins over one dimension table.

A result's frame is a ``cache()`` over its scan, and a plan that uses it more than once runs
with polars' common-subplan elimination off, so the scan runs once and the engine fans the
partitions out. Each shape equals polars on the CPU over the same parquet file, and the
engine's store is back where it was. Two queries (two tasks) still need ``tee``.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from api_reads import events_of
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import GPUResult, ResultConsumedError, collect, execute, gpu_task

Shape = Callable[[Callable[[], pl.LazyFrame], pl.LazyFrame], pl.LazyFrame]
COLUMNS = ["id", "customer", "amount"]

#: Each shape reads the orders through ``read()`` (called once per use, as a user writes it);
#: ``facts`` is a second table (a parquet scan) where the shape needs one.
SHAPES: dict[str, Shape] = {
    "self-join": lambda read, facts: read().join(read(), on="id", suffix="_again"),
    "join with an aggregate of itself": lambda read, facts: read().join(
        read().group_by("customer").agg(pl.col("amount").sum().alias("customer_total")), on="customer"),
    "concat of two filters": lambda read, facts: pl.concat(
        [read().filter(pl.col("amount") > 90), read().filter(pl.col("amount") < 5)]),
    "correlated sub-query": lambda read, facts: read().join(
        read().group_by("customer").agg(pl.col("amount").mean().alias("mean")), on="customer",
    ).filter(pl.col("amount") > pl.col("mean")).select(COLUMNS),
    "semi and anti join of three filtered reads": lambda read, facts: read().filter(pl.col("amount") > 20).join(
        read().filter(pl.col("amount") > 95), on="customer", how="semi",
    ).join(read().filter(pl.col("amount") < 2), on="customer", how="anti"),
    "union of two joins over one dimension": lambda read, facts: pl.concat([
        facts.filter(pl.col("id") < 300).join(read(), on="id"),
        facts.filter(pl.col("id") >= 700).join(read(), on="id"),
    ]),
}


def expected(orders, shape: str) -> pl.DataFrame:
    return SHAPES[shape](lambda: pl.scan_parquet(orders), pl.scan_parquet(orders)).collect()


def same_rows(got: pl.DataFrame, want: pl.DataFrame) -> None:
    """Equal as sets of rows (row order across partitions is not defined)."""
    assert_frame_equal(got.sort(got.columns), want.sort(want.columns), check_dtypes=False)


@gpu_task(name="shape")
def shape_task(r: GPUResult, shape: str, facts_path: str) -> pl.LazyFrame:
    return SHAPES[shape](r.lazy, pl.scan_parquet(facts_path))


def run_shapes(engine: CudfPolarsEngine, orders) -> dict[str, tuple[pl.DataFrame, pl.DataFrame]]:
    """Per shape, in one flow run: the shape in a gpu_task, and the shape of a frame read in the flow body."""

    @flow(task_runner=CudfPolarsTaskRunner(engine))
    def pipeline():
        out = {}
        for shape in SHAPES:
            in_task = collect(shape_task(execute(pl.scan_parquet(orders), name="orders"), shape, str(orders)))
            r = execute(pl.scan_parquet(orders), name="orders")
            in_body = collect(SHAPES[shape](r.lazy, pl.scan_parquet(orders)))
            out[shape] = (in_task, in_body)
        assert get_engine_session().live_results == ()
        return out

    return pipeline()


def test_every_shape_that_reads_a_result_several_times_equals_polars_on_the_cpu_backend(cpu_block, orders):
    before = held_partitions()
    for shape, (in_task, in_body) in run_shapes(cpu_block, orders).items():
        same_rows(in_task, expected(orders, shape))
        same_rows(in_body, expected(orders, shape))
    assert held_partitions() == before


def test_the_result_created_event_gives_the_reads_of_each_input_and_the_bytes_per_read(cpu_block, orders):
    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        joined = shape_task(r, "semi and anti join of three filtered reads", str(orders))
        return r.bytes, collect(joined).height

    state = pipeline(return_state=True)
    orders_bytes, _ = state.result()
    events = events_of(state.state_details.flow_run_id, expect={"prefect_cudf_polars.result.created": 2})
    [created] = [e for e in events if e.event == "prefect_cudf_polars.result.created" and e.payload["name"] == "shape"]
    [read] = created.payload["inputs_read"]
    assert (read["name"], read["reads"], read["bytes_per_read"]) == ("orders", 3, orders_bytes)
    [first] = [e for e in events if e.event == "prefect_cudf_polars.result.created" and e.payload["name"] == "orders"]
    assert first.payload["inputs_read"] == []  # read from parquet, no result


@gpu_task(name="two-queries")
def two_queries(r: GPUResult) -> pl.LazyFrame:
    get_engine_session().collect(r.lazy().join(r.lazy(), on="id"))  # the first query reads it twice
    return r.lazy()  # a second query


def test_a_second_query_reading_the_same_result_still_needs_tee(cpu_block, orders):
    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        first = collect(r.lazy().join(r.lazy(), on="id")).height
        said = (r"already read by a query that ran in this same {run} .*which may read it several times.*"
                r"To read it in two queries, split it first with `tee\(result, 2\)`")
        with pytest.raises(ResultConsumedError, match=said.format(run="flow run")):
            r.lazy()  # for a second query
        with pytest.raises(ResultConsumedError, match=said.format(run="task run 'two-queries'")):
            two_queries(execute(pl.scan_parquet(orders), name="orders"))
        frame = execute(pl.scan_parquet(orders), name="orders").lazy()
        collect(frame)
        with pytest.raises(ResultConsumedError, match=r"was already read by an earlier query: a result is read by "
                           r"one query.*To read one result in two queries, split it first with `tee\(result, 2\)`"):
            collect(frame)  # the same frame, run again
        return first

    assert pipeline() == 1000


@pytest.mark.gpu
def test_every_shape_that_reads_a_result_several_times_equals_polars_on_the_gpu(orders):
    for shape, (in_task, in_body) in run_shapes(CudfPolarsEngine(backend="spmd", raise_on_fail=True), orders).items():
        same_rows(in_task, expected(orders, shape))
        same_rows(in_body, expected(orders, shape))
