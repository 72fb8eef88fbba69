"""
What a flow writes is a Prefect asset, with the sources it read as upstream assets.

``sink_parquet`` records its target as a materialized asset (Prefect 3.9's
``prefect.asset.materialization.succeeded`` event) whose metadata holds the rows,
bytes, schema and backend written, and whose related assets are the sources read
through ``read_parquet`` (each also gets a ``prefect.asset.referenced`` event).
Asset keys are URIs: ``s3://bucket/prefix``, and ``file://`` URIs for local paths.
The main job's report is an asset too. Events are read back through Prefect's API.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
from prefect import flow

from api_reads import asset_events, related_ids
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import GPUResult, gpu_task, read_parquet, sink_parquet

# The moto S3 server fixtures live with the storage tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "storage"))
from s3_fixtures import bucket, moto_s3, upload  # noqa: E402,F401 (fixtures)

MATERIALIZED = "prefect.asset.materialization.succeeded"
REFERENCED = "prefect.asset.referenced"


@gpu_task(name="big-orders")
def big_orders(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().filter(pl.col("amount") > 50)


def sink_big_orders(source: str, target: str, credentials=None):
    """read_parquet -> a gpu_task -> sink_parquet, in one flow run on the cpu backend."""

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        return sink_parquet(big_orders(read_parquet(source, credentials)), target, credentials)

    return pipeline()


def materialization(asset_key: str):
    """The one materialization event of ``asset_key``."""
    found = [e for e in asset_events(asset_key, expect={MATERIALIZED: 1}) if e.event == MATERIALIZED]
    assert len(found) == 1, f"{len(found)} {MATERIALIZED} events for {asset_key}: {found}"
    return found[0]


def assert_recorded(summary, target_key: str, source_key: str, orders_schema: pl.Schema) -> None:
    event = materialization(target_key)
    assert event.payload["rows"] == summary.rows
    assert event.payload["bytes"] == summary.bytes
    assert event.payload["backend"] == "cpu"
    assert event.payload["schema"] == {name: str(dtype) for name, dtype in orders_schema.items()}
    assert source_key in related_ids(event, "asset"), event.related
    referenced = [e for e in asset_events(source_key, expect={REFERENCED: 1}) if e.event == REFERENCED]
    assert referenced, f"no {REFERENCED} event for {source_key}"


def test_a_local_sink_is_a_materialized_asset_with_its_source_upstream(orders, tmp_path):
    target = tmp_path / "clean"
    summary = sink_big_orders(str(orders), str(target))
    assert summary.rows == pl.read_parquet(orders).filter(pl.col("amount") > 50).height
    assert_recorded(
        summary, target.resolve().as_uri(), Path(orders).resolve().as_uri(), pl.read_parquet_schema(orders)
    )


def test_an_s3_sink_is_a_materialized_asset_with_its_s3_source_upstream(moto_s3, bucket, upload, orders):
    upload(bucket, "raw/orders.parquet", pl.read_parquet(orders))
    source, target = f"s3://{bucket}/raw/orders.parquet", f"s3://{bucket}/clean/orders"
    summary = sink_big_orders(source, target, moto_s3.credentials())
    assert_recorded(summary, target, source, pl.read_parquet_schema(orders))


def test_the_main_jobs_report_is_a_materialized_asset(nyc_paths, tmp_path):
    from prefect_cudf_polars.flows import flight_delay_report
    from prefect_cudf_polars.flows.flight_delays import REPORT_FILE

    CudfPolarsEngine(backend="cpu").save("contract-assets-cpu", overwrite=True)
    report = flight_delay_report(
        engine_block="contract-assets-cpu", output_dir=str(tmp_path), top=5,
        data_dir=str(Path(nyc_paths["flights"]).parent),
    )
    event = materialization((tmp_path / REPORT_FILE).resolve().as_uri())
    assert event.payload["rows"] == report.height == 5
    assert Path(nyc_paths["flights"]).resolve().as_uri() in related_ids(event, "asset"), event.related
