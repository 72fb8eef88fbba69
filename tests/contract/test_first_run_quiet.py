"""
The first run on a fresh machine is quiet: no ERROR, no traceback, the CPU fallback said once.

Prefect 3.9's local API starts a telemetry service that writes to the database
the first start is still migrating (``sqlite3.OperationalError: database is
locked``) or, with no route to the internet, fails to send (``Failed to send
telemetry``); both print as ERROR with a traceback on a user's first ``make run``.
The CPU fallback is said once: in a flow run as a WARNING line of the flow
run's log (the console and the UI); outside one as a Python ``RuntimeWarning``
that names the user's line, not a frame inside Prefect or ``contextlib``.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.blocks.backends import probe as gpu_probe
from prefect_cudf_polars.tasks import collect, execute

ROOT = Path(__file__).resolve().parents[2]
#: A Python warning as printed: ``path/to/file.py:12: RuntimeWarning: ...``.
WARNING_LINE = re.compile(r"^(?P<path>\S+\.py):\d+: \w*Warning: ", re.M)


def fallback_said(pipeline) -> tuple[list[warnings.WarningMessage], list[str]]:
    """
    How a flow run told of the CPU fallback: the Python RuntimeWarnings raised while
    it ran, and the lines of its log (read back from the API) that say it.
    Skips where a GPU backend is used.
    """
    from api_reads import log_records

    if gpu_probe.probe().problem is None:
        pytest.skip("a GPU backend runs here: no CPU fallback to tell of")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = pipeline(return_state=True)
    assert state.is_completed(), state
    raised = [w for w in caught if issubclass(w.category, RuntimeWarning) and "cpu_fallback=True" in str(w.message)]
    logs = log_records(state.state_details.flow_run_id, expect="cpu_fallback=True")
    logged = [log.message for log in logs if "cpu_fallback=True" in log.message and log.level == logging.WARNING]
    return raised, logged


def test_the_cpu_fallback_of_a_task_runner_is_said_once_in_the_flow_runs_log(orders):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="auto", cpu_fallback=True)))
    def pipeline():
        return collect(execute(pl.scan_parquet(orders))).height

    raised, logged = fallback_said(pipeline)
    assert raised == [] and len(logged) == 1, (raised, logged)
    assert "uses the cpu backend" in logged[0]


def test_the_cpu_fallback_of_a_session_in_the_flow_body_is_said_once_in_the_flow_runs_log(orders):
    @flow
    def pipeline():
        with CudfPolarsEngine(backend="auto", cpu_fallback=True).session():
            return collect(execute(pl.scan_parquet(orders))).height

    raised, logged = fallback_said(pipeline)
    assert raised == [] and len(logged) == 1, (raised, logged)


def test_the_cpu_fallback_outside_a_flow_run_is_a_python_warning_at_the_users_line(orders):
    if gpu_probe.probe().problem is None:
        pytest.skip("a GPU backend runs here: no CPU fallback to tell of")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with CudfPolarsEngine(backend="auto", cpu_fallback=True).session() as session:
            assert session.collect(pl.scan_parquet(orders)).height == 1000
    [w] = [w for w in caught if issubclass(w.category, RuntimeWarning) and "cpu_fallback=True" in str(w.message)]
    assert w.filename == __file__, f"the warning points at {w.filename}:{w.lineno}"


@pytest.mark.timeout(600)
def test_a_first_make_run_on_a_fresh_prefect_home_prints_no_error_and_no_traceback(nyc_paths, tmp_path):
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("`make run` runs the checkout's .venv; these tests run in another environment")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "COLUMNS": "160"}
    # A fresh machine: no Prefect API configured, nothing set by hand.
    for name in ("PREFECT_API_URL", "PREFECT_SERVER_ANALYTICS_ENABLED", "MAKEFLAGS", "MAKELEVEL"):
        env.pop(name, None)
    args = (f"--output-dir {tmp_path / 'out'} --top 5 "
            f"--data-dir {Path(nyc_paths['flights']).parent}")
    proc = subprocess.run(
        ["make", "--no-print-directory", "run", f"ARGS={args}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=560,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Finished in state Completed" in out
    for noise in (re.search(r"\|\s*ERROR\s*\|.*", out), re.search(r"Traceback.*", out)):
        assert noise is None, out[max(noise.start() - 300, 0) : noise.start() + 3000]
    for match in WARNING_LINE.finditer(out):
        path = match.group("path")
        assert "site-packages" not in path and not path.endswith("contextlib.py"), match.group(0)
