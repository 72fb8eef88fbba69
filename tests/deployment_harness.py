"""
The README's deploy, run for real by tests: a `prefect server start` on 127.0.0.1 with a
temporary PREFECT_HOME (SQLite), `prefect-cudf-polars deploy` with the project's prefect.yaml,
the schedule's future runs, one triggered run executed by `prefect worker start --run-once`.

Every process is started in its own session and stopped by its id (``os.killpg`` on the
process group whose id is the started process's PID), also when a step fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import free_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENT = "flight-delay-report/daily-flight-delay-report"
SERVER_START_S = 240
WORKER_S = 300


def stop(proc: subprocess.Popen) -> None:
    """Stop a process started with ``start_new_session=True`` and its children, by its id."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
    else:
        try:  # children the leader left behind
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_cli(args: list[str], env: dict[str, str], *, timeout: float = 180) -> str:
    """Run a command to its end (bounded) and return its output; fail the test on an error."""
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        out, _ = proc.communicate()
        pytest.fail(f"{args} ran past {timeout} s:\n{out[-4000:]}")
    finally:
        stop(proc)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{out[-6000:]}"
    return out


@contextlib.contextmanager
def prefect_server(home: Path) -> Iterator[dict]:
    """`prefect server start` on a free loopback port, SQLite in ``home`` (a PREFECT_HOME)."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": url,
        "PREFECT_UI_API_URL": url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_ENABLED": "false",
        # The scheduler looks for new deployments every second (Prefect's default: every 5 s).
        "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1",
        "PWD": str(ROOT),
    }
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
         "--port", str(port)],
        cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prefect server exited {proc.returncode}:\n{(home / 'server.log').read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prefect server not healthy after {SERVER_START_S} s")
            time.sleep(0.25)
        yield {"url": url, "ui": f"http://127.0.0.1:{port}", "env": env, "home": home}
    finally:
        stop(proc)
        log.close()


def deploy_and_run_once(server: dict, *, backend: str, out_dir: Path, data_dir: str) -> dict:
    """
    Deploy as the README says (engine block named ``backend``), trigger one run, let a worker
    run it once. Returns the deployment, the scheduled future runs, the triggered run's id and
    the command outputs.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    env = server["env"]
    deploy_log = run_cli(
        [sys.executable, "-m", "prefect_cudf_polars.cli", "deploy",
         "--engine-block", backend, "--backend", backend],
        env, timeout=300,
    )
    with temporary_settings(updates={PREFECT_API_URL: server["url"]}):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name(DEPLOYMENT)
            # The schedule makes future runs (Prefect's scheduler service, within seconds).
            deadline = time.monotonic() + 90
            while True:
                scheduled = [
                    r for r in client.read_flow_runs(limit=50)
                    if r.deployment_id == deployment.id and r.state_type.value == "SCHEDULED"
                ]
                if scheduled or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            run = client.create_flow_run_from_deployment(
                deployment.id,
                parameters={
                    "engine_block": backend,
                    "output_dir": str(out_dir),
                    "data_dir": data_dir,
                },
            )
    worker_log = run_cli(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", "gpu-pool", "--run-once"],
        env, timeout=WORKER_S,
    )
    return {
        "deployment": deployment,
        "scheduled": scheduled,
        "flow_run_id": run.id,
        "out_dir": out_dir,
        "deploy_log": deploy_log,
        "worker_log": worker_log,
    }
