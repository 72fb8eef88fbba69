"""
The first run on a fresh machine is quiet: no ERROR, no traceback, the CPU fallback said once.

Prefect 3.9's local API starts a telemetry service that writes to the database
the first start is still migrating (``sqlite3.OperationalError: database is
locked``) or, with no route to the internet, fails to send (``Failed to send
telemetry``); both print as ERROR with a traceback on a user's first ``make run``
or ``python flow.py``, and that first start can outlast Prefect's 20 s wait for it.
Importing the package turns the telemetry off and waits longer, for the temporary
local API only and where the user set neither (``prefect_cudf_polars/local_api.py``).
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


def fresh_machine_env(prefect_home: Path, **settings: str) -> dict[str, str]:
    """This environment without any Prefect setting (no API, no profile), a new PREFECT_HOME, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k not in ("MAKEFLAGS", "MAKELEVEL")}
    return {**env, "PREFECT_HOME": str(prefect_home), "COLUMNS": "160", **settings}


def readme_example(heading: str) -> str:
    """The first ``python`` block after ``heading`` in the README."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index(heading) :]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.timeout(400)
def test_the_readme_flow_run_with_plain_python_on_a_fresh_prefect_home_prints_no_error_and_no_traceback(tmp_path):
    (tmp_path / "flow.py").write_text(readme_example("## Your own flow"))
    proc = subprocess.run(
        [sys.executable, "flow.py"], cwd=tmp_path, env=fresh_machine_env(tmp_path / "prefect-home"),
        capture_output=True, text=True, timeout=360,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Starting temporary server" in out and "Finished in state Completed" in out, out[-4000:]
    for noise in (re.search(r"\|\s*ERROR\s*\|.*", out), re.search(r"Traceback.*", out)):
        assert noise is None, out[max(noise.start() - 300, 0) : noise.start() + 3000]


SETTINGS_SEEN = """
import os
import prefect_cudf_polars
from prefect.settings import get_current_settings
s = get_current_settings().server
print(os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED"), s.analytics_enabled, s.ephemeral.startup_timeout_seconds)
"""


def settings_seen(tmp_path: Path, **settings: str) -> str:
    """What a process that imports the package sees: the analytics variable, the two settings."""
    proc = subprocess.run(
        [sys.executable, "-c", SETTINGS_SEEN], cwd=tmp_path, env=fresh_machine_env(tmp_path / "home", **settings),
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_the_temporary_local_api_defaults_to_no_telemetry_and_a_longer_start_up_wait(tmp_path):
    assert settings_seen(tmp_path) == "false False 120"


def test_a_users_own_settings_of_the_local_api_are_kept(tmp_path):
    assert settings_seen(
        tmp_path, PREFECT_SERVER_ANALYTICS_ENABLED="true", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="45"
    ) == "true True 45"
    # Set in the active profile (`prefect config set`), not in the environment.
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "profiles.toml").write_text(
        'active = "mine"\n\n[profiles.mine]\nPREFECT_SERVER_ANALYTICS_ENABLED = "true"\n'
    )
    assert settings_seen(tmp_path) == "None True 120"


def test_with_a_prefect_api_url_nothing_is_set(tmp_path):
    assert settings_seen(tmp_path, PREFECT_API_URL="http://127.0.0.1:4200/api") == "None True 20"
