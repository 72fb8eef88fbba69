"""The storage tasks' results and task runs are named after the data they read and write."""

from __future__ import annotations

import pytest
from prefect import flow

from api_reads import task_runs_of
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import collect, read_parquet, sink_parquet
from prefect_cudf_polars.tasks.storage.run_names import source_name


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("data/orders.parquet", "orders"),
        ("/tmp/x/orders.pq", "orders"),
        ("s3://lake/trips/", "trips"),
        ("s3://lake/trips/*.parquet", "trips"),
        ("s3://lake/trips/2024-*/part.parquet", "trips"),
        ("s3://lake", "lake"),
        (["s3://lake/jan.parquet", "s3://lake/feb.parquet", "s3://lake/mar.parquet"], "jan-and-2-more"),
        ("*.parquet", "parquet"),
    ],
)
def test_a_source_is_named_by_its_file_stem_or_folder(source, name):
    assert source_name(source) == name


def test_read_and_sink_task_runs_read_well_in_the_ui(orders, tmp_path):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        first = read_parquet(str(orders))
        assert first.name == "orders"
        sink_parquet(first, str(tmp_path / "out"))
        again = read_parquet(str(orders), name="orders-again")
        return collect(again).height

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    names = set(task_runs_of(state.state_details.flow_run_id, expect=4, final=True))
    assert {"read-parquet-orders", "sink-parquet-orders", "read-parquet-orders-again", "collect-orders-again"} <= names
