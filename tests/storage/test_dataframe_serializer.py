"""PolarsDataFrameSerializer: round trips, refusals, and collect outputs in S3 result storage (moto)."""

from __future__ import annotations

import datetime as dt
import uuid

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow
from prefect.results import ResultStore
from prefect.serializers import Serializer
from prefect_aws import S3Bucket

from prefect_cudf_polars.blocks import CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import (
    PolarsDataFrameSerializer,
    collect,
    execute,
    persisted_collect,
)
from s3_fixtures import moto_s3, bucket, trips_df  # noqa: F401 (fixtures)


def varied() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "i": [1, None, 3],
            "u8": pl.Series([1, 2, 255], dtype=pl.UInt8),
            "f": [0.5, float("nan"), None],
            "s": ["a", None, "ünï"],
            "b": [True, False, None],
            "d": [dt.date(2013, 1, 1), None, dt.date(2024, 2, 29)],
            "ts": pl.Series(
                [dt.datetime(2013, 1, 1, 5, 30), None, dt.datetime(2020, 6, 1)],
                dtype=pl.Datetime("us", "America/New_York"),
            ),
            "dur": pl.Series([dt.timedelta(seconds=5), None, dt.timedelta(days=1)]),
            "lst": [[1, 2], [], None],
            "st": [{"x": 1, "y": "p"}, {"x": None, "y": "q"}, None],
        }
    )


@pytest.mark.parametrize("fmt", ["parquet", "ipc"])
def test_round_trip_keeps_values_and_dtypes(fmt):
    ser = PolarsDataFrameSerializer(format=fmt)
    df = varied()
    blob = ser.dumps(df)
    blob.decode("ascii")  # Prefect embeds it in a JSON result record
    assert_frame_equal(ser.loads(blob), df)


def test_ipc_keeps_enum_and_categorical_exactly():
    df = pl.DataFrame(
        {
            "e": pl.Series(["lo", "hi", "lo"], dtype=pl.Enum(["lo", "hi"])),
            "c": pl.Series(["x", "y", "x"], dtype=pl.Categorical),
        }
    )
    ser = PolarsDataFrameSerializer(format="ipc")
    assert_frame_equal(ser.loads(ser.dumps(df)), df)


def test_prefect_resolves_it_by_type_name():
    ser = Serializer(type="polars-dataframe", format="ipc")
    assert isinstance(ser, PolarsDataFrameSerializer) and ser.format == "ipc"


def test_refusals_say_what_to_do():
    ser = PolarsDataFrameSerializer()
    with pytest.raises(TypeError, match="not LazyFrame; collect it first"):
        ser.dumps(pl.LazyFrame({"a": [1]}))
    with pytest.raises(TypeError, match="another result serializer"):
        ser.dumps({"a": 1})
    with pytest.raises(ValueError, match="not written by PolarsDataFrameSerializer"):
        ser.loads(b"%%% not base64 %%%")
    with pytest.raises(ValueError, match="not a parquet file"):
        ser.loads(PolarsDataFrameSerializer(format="ipc").dumps(pl.DataFrame({"a": [1]})))
    with pytest.raises(ValueError, match="no snappy"):
        PolarsDataFrameSerializer(format="ipc", compression="snappy").dumps(pl.DataFrame({"a": [1]}))


def test_collect_output_round_trips_through_s3_result_storage(cpu_block, moto_s3, bucket, trips_df):
    """collect's DataFrame goes to an S3Bucket block (moto) and reads back equal."""
    block_name = f"results-{uuid.uuid4().hex[:8]}"
    S3Bucket(bucket_name=bucket, bucket_folder="prefect-results", credentials=moto_s3.credentials()).save(
        block_name
    )
    storage = S3Bucket.load(block_name)
    key = f"report-{uuid.uuid4().hex[:8]}.parquet"
    keep = persisted_collect(storage, key=key)

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def report():
        r = execute(trips_df.lazy().group_by("carrier").agg(pl.len(), pl.col("distance").mean()))
        return keep(r, return_state=True)

    state = report()
    expected = trips_df.group_by("carrier").agg(pl.len(), pl.col("distance").mean())
    assert_frame_equal(state.result().sort("carrier"), expected.sort("carrier"))

    # The object is really in the bucket, and a fresh store (another process would do
    # the same with the saved block) reads it back equal.
    objects = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="prefect-results/")
    assert f"prefect-results/{key}" in [o["Key"] for o in objects["Contents"]]
    record = ResultStore(result_storage=S3Bucket.load(block_name)).read(key)
    assert record.metadata.serializer.type == "polars-dataframe"
    assert_frame_equal(record.result.sort("carrier"), expected.sort("carrier"))


def test_default_key_writes_one_record_per_run(cpu_block, tmp_path, trips_df):
    """Two flow runs with the default key write two records (no stale cache hit)."""
    from prefect.filesystems import LocalFileSystem

    storage = LocalFileSystem(basepath=str(tmp_path))
    storage.save(f"results-{uuid.uuid4().hex[:8]}")
    keep = persisted_collect(storage, format="ipc")

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def run(n: int):
        return keep(execute(trips_df.lazy().head(n)))

    assert run(3).height == 3
    assert run(5).height == 5  # not the first run's record
    records = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(records) == 2
    heights = sorted(
        ResultStore(result_storage=storage).read(str(p.relative_to(tmp_path))).result.height
        for p in records
    )
    assert heights == [3, 5]
    assert collect.persist_result is False  # the plain task keeps the GPU defaults
