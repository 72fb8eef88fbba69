"""Credentials never reach logs, artifacts, events, run records or error messages."""

from __future__ import annotations

import logging
import time
import uuid

import polars as pl
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
)
from prefect.events.filters import EventFilter, EventRelatedFilter
from prefect_aws import AwsCredentials

from prefect_cudf_polars.blocks import CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import S3AccessError, collect, read_parquet, sink_parquet

from conftest import read_run_logs
from s3_fixtures import bucket, moto_s3, trips_df, upload  # noqa: F401 (fixtures)


def _events_for(flow_run_id, *, expect_at_least: int, timeout: float = 30.0) -> list[str]:
    """Every event related to the flow run, as JSON text (events arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            page = client.read_events(
                filter=EventFilter(
                    related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"])
                ),
                limit=50,
            )
        events = [e.model_dump_json() for e in page.events]
        if len(events) >= expect_at_least or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


def test_no_secret_in_logs_artifacts_events_or_errors(
    cpu_block, moto_s3, bucket, upload, trips_df, tmp_path, caplog, capfd
):
    caplog.set_level(logging.DEBUG, logger="prefect_cudf_polars")
    caplog.set_level(logging.INFO)
    upload(bucket, "in/t.parquet", trips_df)
    good_name = f"etl-{uuid.uuid4().hex[:8]}"
    bad_name = f"bad-{uuid.uuid4().hex[:8]}"
    wrong_secret = f"WRONG-{uuid.uuid4().hex}"
    moto_s3.credentials().save(good_name)
    moto_s3.credentials(secret=wrong_secret).save(bad_name)
    secrets = [moto_s3.secret_access_key, moto_s3.access_key_id, wrong_secret]

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block), log_prints=True)
    def etl() -> dict:
        creds = AwsCredentials.load(good_name)
        trips = read_parquet(f"s3://{bucket}/in/*.parquet", creds, predicate=pl.col("distance") > 0)
        written = sink_parquet(trips, f"s3://{bucket}/out", creds, staging_dir=str(tmp_path))
        try:
            read_parquet(f"s3://{bucket}/in/t.parquet", AwsCredentials.load(bad_name))
        except S3AccessError as exc:
            refused = str(exc)
        again = collect(read_parquet(f"s3://{bucket}/out/*.parquet", creds))
        return {"rows": written.rows, "refused": refused, "again": again.height}

    state = etl(return_state=True)
    out = state.result()
    assert out["rows"] == out["again"] == trips_df.filter(pl.col("distance") > 0).height
    assert "refused the credentials" in out["refused"]
    flow_run_id = state.state_details.flow_run_id

    logs = read_run_logs(flow_run_id, expect="engine session ended")  # the run's last line: the earlier ones are in
    assert any("refused the credentials" in m for m in logs)  # the failed task run's log
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
        flow_run = client.read_flow_run(flow_run_id)
        task_runs = client.read_task_runs(
            task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]))
        )
    events = _events_for(flow_run_id, expect_at_least=len(task_runs))
    assert len(task_runs) >= 5 and events

    captured = capfd.readouterr()
    texts = {
        "flow run logs": "\n".join(logs),
        "artifacts": "\n".join(a.model_dump_json() for a in artifacts),
        "events": "\n".join(events),
        "flow run record": flow_run.model_dump_json(),
        "task run records": "\n".join(t.model_dump_json() for t in task_runs),
        "error message": out["refused"],
        "python logging": caplog.text,
        "stdout/stderr": captured.out + captured.err,
    }
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"a credential appeared in the {where}"
