"""S3 access from an AwsCredentials block: the forms each reader gets, and secrets kept out of sight."""

from __future__ import annotations

import os
import pickle
import threading

import polars as pl
from polars.io.plugins import register_io_source
import pytest
from prefect import flow, task
from prefect_aws import AwsClientParameters, AwsCredentials
from pydantic import SecretStr

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.environment import environment as aws_environment
from prefect_cudf_polars.tasks import GPUResult, collect, gpu_task
from prefect_cudf_polars.tasks.storage.credentials import resolve_s3_access, scrub

SECRET = "s3cr3t/KEY+with=odd-chars"
KEY_ID = "AKIAEXAMPLEKEYID0001"


def block(**extra) -> AwsCredentials:
    return AwsCredentials(
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="eu-west-1",
        aws_client_parameters=AwsClientParameters(endpoint_url="http://127.0.0.1:9000/"),
        **extra,
    )


def test_explicit_keys_give_polars_options_and_kvikio_environment():
    access = resolve_s3_access(block(aws_session_token="tok-123"))
    assert access.endpoint_url == "http://127.0.0.1:9000"  # trailing slash dropped (KvikIO appends /bucket)
    assert access.storage_options() == {
        "aws_region": "eu-west-1",
        "aws_endpoint_url": "http://127.0.0.1:9000",
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_session_token": "tok-123",
    }
    assert access.environment() == {
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": "tok-123",
    }


def test_no_block_is_anonymous_aws_and_unsets_stale_keys():
    access = resolve_s3_access(None)
    assert access.anonymous and access.endpoint_url is None and access.region == "us-east-1"
    assert access.storage_options() == {"aws_region": "us-east-1", "aws_skip_signature": "true"}
    env = access.environment()
    assert env["AWS_ACCESS_KEY_ID"] is None and env["AWS_ENDPOINT_URL"] is None


def test_profile_block_resolves_through_boto3s_chain(tmp_path, monkeypatch):
    creds = tmp_path / "credentials"
    creds.write_text(f"[etl]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent-config"))
    access = resolve_s3_access(AwsCredentials(profile_name="etl", region_name="us-west-2"))
    assert access.storage_options()["aws_secret_access_key"] == SECRET
    assert access.region == "us-west-2"


def test_secrets_never_in_repr_str_or_pickle():
    access = resolve_s3_access(block(aws_session_token="tok-123"))
    for text in (repr(access), str(access), access.describe()):
        assert SECRET not in text and KEY_ID not in text and "tok-123" not in text
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(access)
    assert scrub(f"GET with {SECRET} and {KEY_ID}", access) == "GET with *** and ***"


def test_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="endpoint_url"):
        resolve_s3_access(
            AwsCredentials(aws_client_parameters=AwsClientParameters(endpoint_url="minio:9000"))
        )
    with pytest.raises(TypeError, match="AwsCredentials.load"):
        resolve_s3_access({"aws_access_key_id": KEY_ID})  # type: ignore[arg-type]


def test_environment_is_set_for_the_block_and_restored(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://stale:1")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    env = resolve_s3_access(block()).environment()
    with aws_environment(env):
        assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET
        assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ
    assert os.environ["AWS_ENDPOINT_URL"] == "http://stale:1"
    with pytest.raises(RuntimeError, match="boom"), aws_environment(env):
        raise RuntimeError("boom")
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ


def test_engine_call_and_its_planning_see_the_environment_on_the_owner_thread():
    env = resolve_s3_access(block()).environment()
    seen: dict[str, str | None] = {}
    planned: list[tuple[str | None, str]] = []

    def schema() -> pl.Schema:  # polars asks for it while planning, as it lists an object-store scan's objects
        planned.append((os.environ.get("AWS_SECRET_ACCESS_KEY"), threading.current_thread().name))
        return pl.Schema({"a": pl.Int64})

    def rows(with_columns, predicate, n_rows, batch_size):
        yield pl.DataFrame({"a": [1, 2]})

    def probe(df: pl.DataFrame) -> pl.DataFrame:  # runs inside the engine call
        seen["secret"], seen["thread"] = os.environ.get("AWS_SECRET_ACCESS_KEY"), threading.current_thread().name
        return df

    @task
    def look() -> int:
        session = get_engine_session()
        return session.collect(register_io_source(rows, schema=schema).map_batches(probe), environment=env).height

    # raise_on_fail=False: a Python function runs on the CPU engine (cudf-polars would refuse it).
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu", raise_on_fail=False)))
    def check():
        return look()

    assert check() == 2
    assert seen["secret"] == SECRET
    assert seen["thread"].startswith("cudf-polars-engine-owner")
    assert planned and all(secret == SECRET and thread.startswith("cudf-polars-engine-owner")
                           for secret, thread in planned), planned
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ or os.environ["AWS_SECRET_ACCESS_KEY"] != SECRET


def test_a_retry_recomputes_its_input_with_the_environment_that_input_was_read_with(monkeypatch):
    """A GPU S3 read's credentials travel as its engine call's environment; a retry that recomputes its
    result (the first attempt consumed it) runs the read again with them."""
    from prefect_cudf_polars.blocks import EngineSession

    env = resolve_s3_access(block()).environment()
    calls: list[tuple[str, object]] = []
    original_execute = EngineSession.execute

    def spy(self, lf, **kwargs):
        calls.append((kwargs.get("name"), kwargs.get("environment")))
        return original_execute(self, lf, **kwargs)

    monkeypatch.setattr(EngineSession, "execute", spy)
    attempts: list[str] = []

    @gpu_task(retries=1, retry_delay_seconds=0)
    def flaky(r: GPUResult) -> pl.LazyFrame:
        lf = r.lazy()  # claims r: a retry needs it recomputed
        attempts.append(r.id)
        if len(attempts) == 1:
            raise OSError("transient failure after reading the input")
        return lf

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def check():
        r = get_engine_session().execute(pl.LazyFrame({"a": [1, 2]}), name="read", environment=env)
        return collect(flaky(r)).height, r.id

    height, original = check()
    assert height == 2 and attempts[0] == original and attempts[1] != original
    assert [environment for name, environment in calls if name == "read"] == [env, env], calls


def test_secret_fields_stay_secret_in_the_saved_block():
    saved = block()
    saved.save(f"s3-secret-{os.getpid()}", overwrite=True)
    loaded = AwsCredentials.load(f"s3-secret-{os.getpid()}")
    assert isinstance(loaded.aws_secret_access_key, SecretStr)
    assert SECRET not in repr(loaded)
    assert resolve_s3_access(loaded).storage_options()["aws_secret_access_key"] == SECRET
