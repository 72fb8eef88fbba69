"""Reading parquet from moto's S3 server on the cpu backend, and the errors users get."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsTaskRunner
from prefect_cudf_polars.tasks.storage.credentials import resolve_s3_access
from prefect_cudf_polars.tasks import GPUResult, S3AccessError, collect, read_parquet
from prefect_cudf_polars.tasks.storage.read import scan_parquet
from prefect_cudf_polars.tasks.storage.errors import explain_engine_error
from s3_fixtures import moto_s3, bucket, trips_df, upload  # noqa: F401 (fixtures)


def read_in_flow(cpu_block, source, credentials, **kwargs) -> pl.DataFrame:
    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def pipeline() -> pl.DataFrame:
        result = read_parquet(source, credentials, **kwargs)
        assert isinstance(result, GPUResult) and result.backend == "cpu"
        return collect(result)

    return pipeline()


def test_reads_an_object_a_glob_and_a_prefix(cpu_block, moto_s3, bucket, upload, trips_df):
    parts = [trips_df[:1000], trips_df[1000:2000], trips_df[2000:]]
    for i, part in enumerate(parts):
        upload(bucket, f"trips/part-{i}.parquet", part)
    creds = moto_s3.credentials()

    one = read_in_flow(cpu_block, f"s3://{bucket}/trips/part-0.parquet", creds)
    assert_frame_equal(one, parts[0])
    glob = read_in_flow(cpu_block, f"s3://{bucket}/trips/*.parquet", creds)
    assert_frame_equal(glob.sort("id"), trips_df)
    listed = read_in_flow(
        cpu_block, [f"s3://{bucket}/trips/part-{i}.parquet" for i in range(3)], creds
    )
    assert_frame_equal(listed.sort("id"), trips_df)


def test_columns_and_predicate_are_applied(cpu_block, moto_s3, bucket, upload, trips_df):
    upload(bucket, "t.parquet", trips_df)
    got = read_in_flow(
        cpu_block,
        f"s3://{bucket}/t.parquet",
        moto_s3.credentials(),
        columns=["id", "distance"],
        predicate=pl.col("distance") > 0,
    )
    expected = trips_df.select("id", "distance").filter(pl.col("distance") > 0)
    assert_frame_equal(got, expected)


def test_local_paths_need_no_credentials(cpu_block, orders):
    got = read_in_flow(cpu_block, str(orders), None)
    assert_frame_equal(got, pl.read_parquet(orders))


def test_wrong_secret_says_the_credentials_were_refused(cpu_block, moto_s3, bucket, upload, trips_df):
    upload(bucket, "t.parquet", trips_df)
    wrong = "WRONG/secret+value-0123456789"
    with pytest.raises(S3AccessError) as info:
        read_in_flow(cpu_block, f"s3://{bucket}/t.parquet", moto_s3.credentials(secret=wrong))
    err = info.value
    assert err.reason == "credentials" and err.url == f"s3://{bucket}/t.parquet"
    assert "refused the credentials" in str(err) and "AwsCredentials block" in str(err)
    assert moto_s3.endpoint in str(err)
    assert wrong not in str(err) and moto_s3.access_key_id not in str(err)


def test_unknown_key_id_says_the_credentials_were_refused(cpu_block, moto_s3, bucket, upload, trips_df):
    upload(bucket, "t.parquet", trips_df)
    with pytest.raises(S3AccessError) as info:
        read_in_flow(
            cpu_block, f"s3://{bucket}/t.parquet", moto_s3.credentials(key_id="AKIAUNKNOWNKEY000000")
        )
    assert info.value.reason == "credentials"


def test_missing_bucket_says_so_and_what_to_do(cpu_block, moto_s3):
    with pytest.raises(S3AccessError) as info:
        read_in_flow(cpu_block, "s3://no-such-bucket-here/t.parquet", moto_s3.credentials())
    assert info.value.reason == "no-bucket"
    assert "bucket 'no-such-bucket-here' does not exist" in str(info.value)
    assert "create the bucket" in str(info.value)


def test_no_matching_object_says_so(cpu_block, moto_s3, bucket):
    with pytest.raises(S3AccessError) as info:
        read_in_flow(cpu_block, f"s3://{bucket}/nothing/*.parquet", moto_s3.credentials())
    assert info.value.reason == "not-found"
    assert "'nothing/'" in str(info.value)


def test_engine_errors_from_polars_reader_are_translated_and_scrubbed(moto_s3, bucket, upload, trips_df):
    """The reader's own error (past the checks) becomes an S3AccessError without secrets."""
    upload(bucket, "t.parquet", trips_df)
    wrong = "WRONG/secret+value-abcdef"
    access = resolve_s3_access(moto_s3.credentials(secret=wrong))
    url = f"s3://{bucket}/t.parquet"
    with pytest.raises(OSError) as info:
        scan_parquet(url, access, backend="cpu").collect()
    translated = explain_engine_error(
        info.value, url=url, bucket=bucket, access=access, doing="read parquet from"
    )
    assert translated is not None and translated.reason == "credentials"
    assert wrong not in str(translated)
    assert explain_engine_error(ValueError("bad dtype"), url=url, bucket=bucket, access=access, doing="x") is None


def _scan_cloud_options(lf: pl.LazyFrame) -> str:
    """The scan's cloud options as cudf-polars' translator reads them (polars' IR visitor)."""
    visitor = lf._ldf.visit()
    node = visitor.view_current_node()
    while type(node).__name__ != "Scan":
        visitor.set_node(visitor.get_inputs()[0])
        node = visitor.view_current_node()
    _typ, _reader_options, cloud_options = node.scan_type
    return cloud_options


def test_gpu_scans_carry_no_secret(moto_s3):
    """On GPU backends the scan's cloud options hold endpoint and region only.

    cudf-polars keeps these options in its query plan (and ignores them; KvikIO
    reads the environment), so a key there would travel with the plan.
    """
    access = resolve_s3_access(moto_s3.credentials())
    schema = {"a": pl.Int64}  # no footer read needed to plan
    gpu = _scan_cloud_options(scan_parquet("s3://b/t.parquet", access, backend="spmd", schema=schema))
    assert moto_s3.endpoint in gpu
    assert moto_s3.secret_access_key not in gpu and moto_s3.access_key_id not in gpu
    cpu = _scan_cloud_options(scan_parquet("s3://b/t.parquet", access, backend="cpu", schema=schema))
    assert moto_s3.secret_access_key in cpu  # polars' own reader gets the keys as options


def test_gpu_style_scan_reads_with_the_environment_only(moto_s3, bucket, upload, trips_df):
    """The client-side half of a GPU read: polars resolves the scan with keys from AWS_* only.

    On GPU backends polars (in this process) reads the parquet footers to plan the
    query before cudf-polars runs it; the scan carries endpoint and region, the keys
    come from the environment set around the engine call. moto enforces signatures
    here, so this read succeeds only if the environment's keys were used.
    """
    from prefect_cudf_polars.blocks.backends.environment import environment as aws_environment

    upload(bucket, "t.parquet", trips_df)
    access = resolve_s3_access(moto_s3.credentials())
    lf = scan_parquet(f"s3://{bucket}/t.parquet", access, backend="spmd")
    with aws_environment(access.environment()):
        got = lf.collect()
    assert_frame_equal(got, trips_df)


#: The GPU reader's whole message for refused keys (cudf-polars 26.10 through KvikIO).
KVIKIO_REFUSED = (
    "CUDF failure at: /__w/cudf/cudf/cpp/src/io/utilities/datasource.cpp:430: Error accessing "
    "the remote file. Reason: KvikIO detects an URL error at: "
    "/__w/kvikio/kvikio/cpp/src/detail/url.cpp:114: Unsupported URL scheme"
)


def _fails_like_the_gpu_reader() -> None:
    raise RuntimeError(KVIKIO_REFUSED)


@pytest.mark.parametrize(
    ("keys", "path", "reason"),
    [("wrong", "t.parquet", "credentials"), ("right", "gone.parquet", "not-found"),
     ("right", "t.parquet", "failed")],
)
def test_a_gpu_read_error_without_the_servers_answer_is_explained_by_asking_it(
    cpu_block, moto_s3, bucket, upload, trips_df, keys, path, reason
):
    from prefect_cudf_polars.tasks.storage.read import run_reading_s3

    upload(bucket, "t.parquet", trips_df)
    wrong = "WRONG/secret+value-abcdef"
    creds = moto_s3.credentials(secret=wrong) if keys == "wrong" else moto_s3.credentials()
    access = resolve_s3_access(creds)
    url = f"s3://{bucket}/{path}"
    with cpu_block.session() as session, pytest.raises(S3AccessError) as info:
        run_reading_s3(session, access, _fails_like_the_gpu_reader, url=url)
    assert info.value.reason == reason and info.value.url == url
    assert "Unsupported URL scheme" in str(info.value)  # the engine's words are kept
    assert wrong not in str(info.value) and moto_s3.secret_access_key not in str(info.value)
