"""
What the Prefect UI shows for a real GPU run: SPMD backend, one rank, one GPU.

The session summary, the events and (with the block's ``result_artifacts``) each result's
artifact must carry real GPU figures: backend ``spmd``, the device's name, device memory rmm
has allocated (bytes > 0 while a result lives on the GPU); so must the deployment of
prefect.yaml run by a worker with a ``spmd`` engine block against a real `prefect server start`
on 127.0.0.1. Skipped without an NVIDIA GPU and RAPIDS (see conftest).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from prefect import flow

from api_reads import artifacts_of, events_of, task_runs_of
from deployment_harness import deploy_and_run_once, prefect_server
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task
from prefect_cudf_polars.blocks import telemetry as ev
from prefect_cudf_polars.blocks.telemetry import summary_key

pytestmark = pytest.mark.gpu

ROWS = 2_000_000


def _bytes(text: str, label: str) -> int:
    found = re.search(rf"\| {label}[^|]* \| ([\d,]+) bytes", text)
    assert found, f"no {label!r} row in:\n{text}"
    return int(found[1].replace(",", ""))


@pytest.fixture(scope="module")
def numbers(tmp_path_factory) -> str:
    """2M rows of real parquet (~32 MB in GPU memory when loaded)."""
    path = tmp_path_factory.mktemp("numbers") / "numbers.parquet"
    rng = np.random.default_rng(0)
    pl.DataFrame({"key": rng.integers(0, 1000, ROWS), "x": rng.random(ROWS)}).write_parquet(path)
    return str(path)


@gpu_task(name="key-sums")
def key_sums(rows: GPUResult) -> pl.LazyFrame:
    return rows.lazy().group_by("key").agg(pl.col("x").sum())


def summary_results(markdown: str) -> dict[str, list[str]]:
    """The session summary's "Results" table: each result's cells after its name, by name."""
    table = markdown[markdown.index("#### Results"):].split("\n\n")[1]  # its table, up to the next blank line
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0].strip("`"): row[1:] for row in cells}


def test_gpu_artifacts_and_events_carry_spmd_rmm_figures(numbers):
    block = CudfPolarsEngine(backend="spmd", raise_on_fail=True, result_artifacts=True)

    @flow(name="gpu-monitoring", task_runner=CudfPolarsTaskRunner(block))
    def pipeline():
        rows = execute(pl.scan_parquet(numbers).filter(pl.col("x") > 0.5), name="half")
        execute(pl.scan_parquet(numbers), name="left-on-gpu")  # released unconsumed
        return collect(key_sums(rows))

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    runs = task_runs_of(flow_run_id, expect=4, final=True)
    half_rows = pl.scan_parquet(numbers).filter(pl.col("x") > 0.5).select(pl.len()).collect().item()

    # The result's artifact (the block's result_artifacts): where it lives, its size, rmm's figure.
    [half] = artifacts_of(task_run_id=runs["half"].id)
    text = half.data
    assert "| backend | spmd |" in text and "| partitions | 1 |" in text
    gpu_name = re.search(r"\| ranks \(GPUs\) \| 0 \((.+?)\) \|", text)[1]
    assert "NVIDIA" in gpu_name
    assert f"| rows | {half_rows} |" in text
    # ~1M rows x 2 columns of 8 bytes (~16 MB) stay in device memory after the call.
    assert _bytes(text, "bytes") >= half_rows * 16
    assert _bytes(text, "memory in use after") >= 4_000_000

    [summary] = artifacts_of(flow_run_id=flow_run_id, key=summary_key("gpu-monitoring"))
    s = summary.data
    assert "| backend | spmd |" in s and f"| GPUs | {gpu_name} |" in s
    assert "| memory measured as | device memory rmm has allocated (rmm statistics) |" in s
    assert "| results produced | 3 |" in s and "| results released unconsumed | 1 |" in s
    assert _bytes(s, "peak memory rank 0") >= _bytes(text, "memory in use after")
    assert _bytes(s, "peak memory") > 0
    listed = summary_results(s)
    assert {name: cells[1] for name, cells in listed.items()} == {
        "half": "consumed", "left-on-gpu": "released unread", "key-sums": "consumed",
    }
    assert listed["half"][2] == str(half_rows) and listed["left-on-gpu"][2] == str(ROWS)

    found = events_of(flow_run_id, expect={ev.ENGINE_STOPPED: 1, ev.RESULT_RELEASED: 1, ev.RESULT_CREATED: 3})
    by_name = {}
    for event in found:
        by_name.setdefault(event.event, []).append(event)
    [started] = by_name[ev.ENGINE_STARTED]
    assert started.payload["backend"] == "spmd" and started.payload["gpus"] == [gpu_name]
    created = {e.payload["name"]: e.payload for e in by_name[ev.RESULT_CREATED]}
    assert created["half"]["backend"] == "spmd" and created["half"]["ranks"] == [0]
    assert created["half"]["memory_in_use_bytes"] > 0
    assert created["half"]["rows"] == half_rows and created["half"]["bytes"] == _bytes(text, "bytes")
    assert created["left-on-gpu"]["rows"] == ROWS and created["left-on-gpu"]["plan"].strip()
    # What the engine held when the session ended, before its shutdown: the result nobody read.
    assert _bytes(s, "memory at the end") >= _bytes(s, "held then by unread results") == created["left-on-gpu"]["bytes"]
    [stopped] = by_name[ev.ENGINE_STOPPED]
    assert stopped.payload["counts"]["released_unconsumed"] == 1
    assert stopped.payload["peak_memory"] > 0
    assert stopped.payload["memory"]["at_end"] >= created["left-on-gpu"]["bytes"]


@pytest.mark.timeout(900)
def test_deployment_runs_on_the_gpu_with_a_spmd_engine_block(nyc_paths, tmp_path):
    """The README's deploy with `--backend spmd`, one run by a worker; its artifacts show the GPU."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    (tmp_path / "prefect-home").mkdir()
    with prefect_server(tmp_path / "prefect-home") as server:
        run = deploy_and_run_once(
            server, backend="spmd", out_dir=tmp_path / "report",
            data_dir=str(Path(nyc_paths["flights"]).parent),
        )
        with temporary_settings(updates={PREFECT_API_URL: server["url"]}):
            with get_client(sync_client=True) as client:
                flow_run = client.read_flow_run(run["flow_run_id"])
            assert flow_run.state.is_completed(), (flow_run.state, run["worker_log"][-4000:])
            assert run["scheduled"], "the scheduler made no future runs"
            by_key = {a.key: a for a in artifacts_of(flow_run_id=flow_run.id) if a.key}
            summary = by_key["flight-delay-report-cudf-polars-session"].data
            assert "| backend | spmd |" in summary and "NVIDIA" in summary
            assert "| results produced | 4 |" in summary
            assert _bytes(summary, "peak memory rank 0") > 0
            # The summary lists the GPU results; their result.created events carry rmm's figure.
            listed = summary_results(summary)
            assert set(listed) == {"enrich-flights", "route-month-delays", "worst-routes", "carrier-month-delays"}
            assert all(cells[1] == "consumed" and int(cells[2]) > 0 for cells in listed.values()), listed
            assert listed["worst-routes"][2] == "20"
            found = events_of(flow_run.id, expect={ev.RESULT_CREATED: 4, ev.ENGINE_STOPPED: 1})
            created = {e.payload["name"]: e.payload for e in found if e.event == ev.RESULT_CREATED}
            enriched = created["enrich-flights"]
            assert enriched["backend"] == "spmd" and enriched["ranks"] == [0]
            assert enriched["memory_in_use_bytes"] > 0 and enriched["bytes"] > 0
            assert enriched["rows"] == int(listed["enrich-flights"][2])
        report = pl.read_parquet(tmp_path / "report" / "flight_delay_report.parquet")
        assert report.height == 20
        assert (tmp_path / "report" / "flight_delay_chart.png").stat().st_size > 10_000
