"""The parquet sink on the cpu backend: local folders, moto S3 prefixes, and targets refused before anything is lost."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsTaskRunner
from prefect_cudf_polars.tasks.storage.credentials import resolve_s3_access
from prefect_cudf_polars.tasks import (
    GPUResult,
    ParquetSinkSummary,
    ResultConsumedError,
    S3AccessError,
    collect,
    execute,
    sink_parquet,
)
from s3_fixtures import moto_s3, bucket, trips_df, upload  # noqa: F401 (fixtures)


def sink_in_flow(cpu_block, df: pl.DataFrame, target: str, **kwargs):
    """Execute ``df`` on the engine, sink the result; return (summary or error, result state)."""

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def pipeline():
        result = execute(df.lazy(), name="trips")
        try:
            outcome = sink_parquet(result, target, **kwargs)
        except (S3AccessError, FileExistsError, ValueError) as exc:  # the refusals the tests inspect
            outcome = exc
        state = result.state
        # A result a refused target left live can still be used.
        rescued = collect(result) if state == "live" else None
        return outcome, state, rescued

    return pipeline()


def test_sink_to_a_local_folder(cpu_block, tmp_path, trips_df):
    target = tmp_path / "out" / "trips"
    summary, state, _ = sink_in_flow(cpu_block, trips_df, str(target))
    assert isinstance(summary, ParquetSinkSummary)
    assert state == "consumed"
    assert summary.rows == trips_df.height and summary.backend == "cpu"
    assert summary.files and all(Path(f).parent == target for f in summary.files)
    assert summary.bytes == sum(Path(f).stat().st_size for f in summary.files)
    assert_frame_equal(pl.read_parquet(summary.files).sort("id"), trips_df)


def test_sink_to_an_s3_prefix_uploads_and_cleans_staging(cpu_block, moto_s3, bucket, trips_df, tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    summary, state, _ = sink_in_flow(
        cpu_block, trips_df, f"s3://{bucket}/daily/2013-01-01",
        credentials=moto_s3.credentials(), staging_dir=str(staging),
    )
    assert isinstance(summary, ParquetSinkSummary) and state == "consumed"
    assert summary.target == f"s3://{bucket}/daily/2013-01-01"
    assert all(f.startswith(f"s3://{bucket}/daily/2013-01-01/part.") for f in summary.files)
    listing = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="daily/2013-01-01/")
    assert sorted(f"s3://{bucket}/{o['Key']}" for o in listing["Contents"]) == summary.files
    assert sum(o["Size"] for o in listing["Contents"]) == summary.bytes
    assert summary.rows == trips_df.height
    assert list(staging.iterdir()) == []  # staged parts removed after upload
    back = pl.read_parquet(
        f"s3://{bucket}/daily/2013-01-01/*.parquet",
        storage_options=resolve_s3_access(moto_s3.credentials()).storage_options(),
    )
    assert_frame_equal(back.sort("id"), trips_df)


def test_non_empty_prefix_is_refused_and_the_result_stays_live(cpu_block, moto_s3, bucket, trips_df, upload):
    upload(bucket, "daily/old.parquet", trips_df[:5])
    err, state, rescued = sink_in_flow(
        cpu_block, trips_df, f"s3://{bucket}/daily", credentials=moto_s3.credentials()
    )
    assert isinstance(err, S3AccessError) and err.reason == "exists"
    assert "overwrite=True" in str(err) and "daily/old.parquet" in str(err)
    assert state == "live"
    assert_frame_equal(rescued, trips_df)  # nothing lost


def test_overwrite_replaces_the_prefix(cpu_block, moto_s3, bucket, trips_df, upload):
    upload(bucket, "daily/old.parquet", trips_df[:5])
    summary, _, _ = sink_in_flow(
        cpu_block, trips_df, f"s3://{bucket}/daily", credentials=moto_s3.credentials(), overwrite=True
    )
    keys = [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="daily/")["Contents"]]
    assert "daily/old.parquet" not in keys and len(keys) == len(summary.files)


def test_missing_bucket_is_refused_before_the_result_is_claimed(cpu_block, moto_s3, trips_df):
    err, state, rescued = sink_in_flow(
        cpu_block, trips_df, "s3://no-such-bucket-here/out", credentials=moto_s3.credentials()
    )
    assert isinstance(err, S3AccessError) and err.reason == "no-bucket"
    assert "create the bucket" in str(err)
    assert state == "live" and rescued.height == trips_df.height


def test_wrong_credentials_are_refused_before_the_result_is_claimed(cpu_block, moto_s3, bucket, trips_df):
    wrong = "WRONG/secret-for-sink-000"
    err, state, _ = sink_in_flow(
        cpu_block, trips_df, f"s3://{bucket}/out", credentials=moto_s3.credentials(secret=wrong)
    )
    assert isinstance(err, S3AccessError) and err.reason == "credentials"
    assert wrong not in str(err)
    assert state == "live"


def test_failed_upload_keeps_the_staged_parts(cpu_block, moto_s3, bucket, trips_df, tmp_path):
    """A key that may list but not write passes the checks; the upload is denied."""
    reader = moto_s3.credentials(key_id=moto_s3.reader_key_id, secret=moto_s3.reader_secret)
    # The key's premise, checked with boto3 itself: it may list the bucket.
    assert moto_s3.client(moto_s3.reader_key_id, moto_s3.reader_secret).list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    err, state, _ = sink_in_flow(
        cpu_block, trips_df, f"s3://{bucket}/out", credentials=reader, staging_dir=str(tmp_path)
    )
    assert isinstance(err, S3AccessError) and err.reason == "denied"
    assert state == "consumed"
    staged = [p for p in tmp_path.rglob("*.parquet")]
    assert staged and str(staged[0].parent) in str(err)  # the message says where they are
    assert_frame_equal(pl.read_parquet(staged).sort("id"), trips_df)  # nothing lost


def test_local_target_that_is_not_empty_is_refused(cpu_block, tmp_path, trips_df):
    (tmp_path / "keep.txt").write_text("mine")
    err, state, _ = sink_in_flow(cpu_block, trips_df, str(tmp_path))
    assert isinstance(err, FileExistsError) and "overwrite=True" in str(err)
    assert state == "live" and (tmp_path / "keep.txt").exists()


def test_a_consumed_result_is_refused(cpu_block, tmp_path, trips_df):
    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def pipeline():
        result = execute(trips_df.lazy())
        collect(result)
        with pytest.raises(ResultConsumedError, match="a GPU result is read once"):
            sink_parquet(result, str(tmp_path / "x"))
        return isinstance(result, GPUResult)

    assert pipeline()
    assert not (tmp_path / "x").exists()


def test_overwrite_with_a_result_that_cannot_be_read_deletes_nothing(cpu_block, moto_s3, bucket, upload, tmp_path, trips_df):
    upload(bucket, "daily/old.parquet", trips_df[:5])
    (tmp_path / "keep.parquet").write_bytes(b"mine")

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def pipeline():
        result = execute(trips_df.lazy())
        collect(result)
        for target, options in ((str(tmp_path), {}), (f"s3://{bucket}/daily", {"credentials": moto_s3.credentials()})):
            with pytest.raises(ResultConsumedError, match="a GPU result is read once"):
                sink_parquet(result, target, overwrite=True, **options)

    pipeline()
    assert (tmp_path / "keep.parquet").read_bytes() == b"mine"
    keys = [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="daily/")["Contents"]]
    assert keys == ["daily/old.parquet"]


def test_unknown_compression_is_refused(cpu_block, tmp_path, trips_df):
    err, state, _ = sink_in_flow(cpu_block, trips_df, str(tmp_path / "x"), compression="brotli-9")
    assert isinstance(err, ValueError) and "zstd" in str(err)
    assert state == "live"
