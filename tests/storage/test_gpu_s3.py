"""
S3 reads and the parquet sink on a real GPU (SPMD backend, raise_on_fail=True), against moto.

Skipped without an NVIDIA GPU and the RAPIDS packages (see tests/conftest.py).
Needs moto[server] and prefect-aws on the GPU machine; no network (moto runs
in this process on 127.0.0.1).

``raise_on_fail=True`` makes any part of a query that cudf-polars cannot run
on the GPU raise instead of falling back to polars on the CPU, and the result
being cudf-polars' ``PersistedQueryResult`` shows the engine produced it.
With moto enforcing signatures, a read succeeds only with the block's keys:
KvikIO falls back to unsigned requests when signed ones fail, and moto refuses
those.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks.storage.credentials import resolve_s3_access
from prefect_cudf_polars.tasks import (
    GPUResult,
    S3AccessError,
    collect,
    gpu_task,
    read_parquet,
    sink_parquet,
)
from prefect_cudf_polars.tasks.storage.read import run_reading_s3, scan_parquet

from s3_fixtures import bucket, moto_s3, upload  # noqa: F401 (fixtures)

# A read that hangs inside kvikio's native code ignores pytest-timeout's signal method;
# the thread method ends the whole run with stack dumps instead of hanging it.
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120, method="thread")]

ROWS = 1_000_000


@pytest.fixture(scope="module")
def table() -> pl.DataFrame:
    rng = np.random.default_rng(0)
    return pl.DataFrame(
        {
            "key": rng.integers(0, 1000, ROWS),
            "x": rng.random(ROWS),
            "y": rng.integers(0, 100, ROWS),
        }
    )


@pytest.fixture()
def data_bucket(bucket, upload, table) -> str:
    """The table as four parquet objects under s3://<bucket>/in/."""
    for i in range(4):
        upload(bucket, f"in/part-{i}.parquet", table[i * ROWS // 4 : (i + 1) * ROWS // 4])
    return bucket


@pytest.fixture()
def unsigned_ok(moto_s3):
    """moto accepts any request for this test (isolates the feature from request signing).

    Signature checks against KvikIO's requests are covered by
    ``test_s3_read_runs_on_the_gpu_with_the_blocks_keys`` on its own, so a signing
    mismatch between KvikIO's libcurl and moto shows up there only.
    """
    moto_s3.set_auth(False)
    yield
    moto_s3.set_auth(True)


@pytest.fixture()
def spmd() -> CudfPolarsEngine:
    return CudfPolarsEngine(backend="spmd", raise_on_fail=True)


@gpu_task
def summarise(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().group_by("key").agg(pl.col("x").sum(), pl.len().alias("n")).sort("key")


def expected_summary(table: pl.DataFrame) -> pl.DataFrame:
    return (
        table.filter(pl.col("y") < 50)
        .group_by("key")
        .agg(pl.col("x").sum(), pl.len().alias("n"))
        .sort("key")
    )


def _read_on_gpu(engine, url, creds):
    @flow(task_runner=CudfPolarsTaskRunner(engine))
    def pipeline():
        from cudf_polars.engine.persisted_result import PersistedQueryResult

        r = read_parquet(url, creds, predicate=pl.col("y") < 50, name="trips")
        assert isinstance(r.persisted.query_result, PersistedQueryResult), type(r.persisted)
        assert r.backend == engine.backend
        return collect(summarise(r))

    return pipeline()


def test_s3_read_runs_on_the_gpu_with_the_blocks_keys(spmd, moto_s3, data_bucket, table):
    got = _read_on_gpu(spmd, f"s3://{data_bucket}/in/*.parquet", moto_s3.credentials())
    assert_frame_equal(got, expected_summary(table), check_dtypes=False, rel_tol=1e-9)


def test_s3_read_on_the_gpu_without_signature_checks(spmd, moto_s3, data_bucket, table, unsigned_ok):
    """The same read with moto accepting any request (isolates KvikIO's S3 path from signing).

    The endpoint still has to reach KvikIO through AWS_ENDPOINT_URL: without it
    KvikIO would address AWS itself instead of the test's moto server.
    """
    got = _read_on_gpu(spmd, f"s3://{data_bucket}/in/*.parquet", moto_s3.credentials())
    assert_frame_equal(got, expected_summary(table), check_dtypes=False, rel_tol=1e-9)


def test_s3_read_on_dask_sets_the_environment_on_every_rank(moto_s3, data_bucket, table, unsigned_ok):
    """Dask workers are other processes: the AWS_* variables must reach them (endpoint included)."""
    engine = CudfPolarsEngine(backend="dask", raise_on_fail=True)
    got = _read_on_gpu(engine, f"s3://{data_bucket}/in/*.parquet", moto_s3.credentials())
    assert_frame_equal(got, expected_summary(table), check_dtypes=False, rel_tol=1e-9)


def test_a_retry_reads_s3_again_on_the_gpu_with_the_blocks_keys(spmd, moto_s3, data_bucket, table):
    """A task whose first attempt consumed an S3 read's result is retried on a recomputed one: the
    replayed read plans and reads with the block's keys (moto checks signatures)."""
    attempts: list[str] = []

    @gpu_task(retries=1, retry_delay_seconds=0)
    def flaky_summary(r: GPUResult) -> pl.LazyFrame:
        lf = r.lazy()
        attempts.append(r.id)
        if len(attempts) == 1:
            raise OSError("transient failure after reading the input")
        return lf.group_by("key").agg(pl.col("x").sum(), pl.len().alias("n")).sort("key")

    @flow(task_runner=CudfPolarsTaskRunner(spmd))
    def pipeline():
        r = read_parquet(f"s3://{data_bucket}/in/*.parquet", moto_s3.credentials(), predicate=pl.col("y") < 50)
        return collect(flaky_summary(r)), r.id

    got, original = pipeline()
    assert attempts[0] == original and attempts[1] != original
    assert_frame_equal(got, expected_summary(table), check_dtypes=False, rel_tol=1e-9)


def test_wrong_keys_fail_clearly_before_and_inside_the_engine(spmd, moto_s3, data_bucket):
    wrong = "WRONG-gpu-secret-0123456789"
    creds = moto_s3.credentials(secret=wrong)
    url = f"s3://{data_bucket}/in/part-0.parquet"

    @flow(task_runner=CudfPolarsTaskRunner(spmd))
    def pipeline():
        with pytest.raises(S3AccessError) as checked:
            read_parquet(url, creds)
        # Past the checks: the engine's own reader (polars' planner, then KvikIO) is refused.
        session = get_engine_session()
        access = resolve_s3_access(creds)
        lf = scan_parquet(url, access, backend=session.backend)
        with pytest.raises(S3AccessError) as inside:
            run_reading_s3(session, access, session.execute, lf, url=url, name="bad")
        return checked.value, inside.value

    checked, inside = pipeline()
    for err in (checked, inside):
        assert err.reason == "credentials", str(err)
        assert wrong not in str(err) and moto_s3.access_key_id not in str(err)


def test_sink_writes_from_the_gpu_to_s3_and_a_folder(
    spmd, moto_s3, data_bucket, table, tmp_path, unsigned_ok
):
    creds = moto_s3.credentials()

    @flow(task_runner=CudfPolarsTaskRunner(spmd))
    def pipeline():
        to_s3 = sink_parquet(
            read_parquet(f"s3://{data_bucket}/in/*.parquet", creds, predicate=pl.col("y") < 50),
            f"s3://{data_bucket}/out/filtered",
            creds,
            staging_dir=str(tmp_path),
        )
        to_folder = sink_parquet(
            read_parquet(f"s3://{data_bucket}/in/*.parquet", creds, columns=["key", "x"]),
            str(tmp_path / "local"),
        )
        return to_s3, to_folder

    to_s3, to_folder = pipeline()
    filtered = table.filter(pl.col("y") < 50)
    assert to_s3.backend == "spmd" and to_s3.rows == filtered.height
    assert to_s3.files and all(f.startswith(f"s3://{data_bucket}/out/filtered/part.") for f in to_s3.files)
    listing = moto_s3.client().list_objects_v2(Bucket=data_bucket, Prefix="out/filtered/")
    assert sum(o["Size"] for o in listing["Contents"]) == to_s3.bytes
    back = pl.read_parquet(
        f"s3://{data_bucket}/out/filtered/*.parquet",
        storage_options=resolve_s3_access(creds).storage_options(),
    )
    assert_frame_equal(back.sort("key", "x"), filtered.sort("key", "x"), check_dtypes=False)
    assert not any(tmp_path.glob("cudf-polars-sink-*"))  # staging removed after upload

    assert to_folder.rows == ROWS and to_folder.files
    local = pl.read_parquet(to_folder.files)
    assert_frame_equal(
        local.sort("key", "x"), table.select("key", "x").sort("key", "x"), check_dtypes=False
    )
