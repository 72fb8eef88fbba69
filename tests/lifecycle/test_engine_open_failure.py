"""
A flow run whose engine cannot open ends Failed with the reason (flow-run states read back
from the real Prefect API), and a flow run that runs no GPU task starts no engine.

The engine opens at the first GPU call inside the flow run, so the error is raised inside
the run and Prefect fails it; before that, nothing of the engine is started. The GPU case
runs in a subprocess that sees no GPU (``CUDA_VISIBLE_DEVICES=""``), the same on a machine
with GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import polars as pl
import pytest
from prefect import flow, task
from prefect.settings import PREFECT_API_URL

from api_reads import flow_runs_of_flow
from conftest import read_run_logs
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import collect, execute

SCRIPTS = Path(__file__).parent / "scripts"
UNSAVED = "No saved cudf-polars engine block named 'no-such-block'"


def _only_run(flow_name: str):
    runs = flow_runs_of_flow(flow_name)
    assert len(runs) == 1, [r.state for r in runs]
    return runs[0]


def test_a_runner_naming_an_unsaved_block_fails_the_flow_run_with_the_reason(orders):
    name = f"unsaved-block-{uuid.uuid4().hex[:8]}"

    @flow(name=name, task_runner=CudfPolarsTaskRunner("no-such-block"))
    def misnamed():
        return collect(execute(pl.scan_parquet(orders))).height

    with pytest.raises(LookupError, match=UNSAVED):
        misnamed()
    run = _only_run(name)
    assert run.state.is_failed(), f"the flow run was left {run.state.type.value}: {run.state.message!r}"
    assert UNSAVED in run.state.message


@pytest.fixture(scope="module")
def no_gpu_runs() -> dict[str, dict]:
    """
    The two flow runs of ``scripts/no_gpu_here.py``, in a process that sees no GPU, by flow suffix.

    Each also carries ``printed``: what the process printed (stdout and stderr, in order)
    while that flow run ran, up to its ``OUTCOME`` line.
    """
    prefix = f"no-gpu-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "no_gpu_here.py"), prefix],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240,
    )
    runs, printed = {}, []
    for line in proc.stdout.splitlines():
        if line.startswith("OUTCOME "):
            outcome = json.loads(line[len("OUTCOME "):])
            runs[outcome["flow"][len(prefix) + 1:]] = {**outcome, "run": _only_run(outcome["flow"]), "printed": printed}
            printed = []
        else:
            printed.append(line)
    assert proc.returncode == 0 and len(runs) == 2, (proc.returncode, proc.stdout[-4000:])
    return runs


def test_a_gpu_backend_without_a_gpu_fails_the_flow_run_with_the_reason(no_gpu_runs):
    gpu = no_gpu_runs["gpu-task"]
    assert gpu.get("raised") == "NoGPUError", gpu
    assert "backend='spmd' needs an NVIDIA GPU" in gpu["message"]
    state = gpu["run"].state
    assert state.is_failed(), f"the flow run was left {state.type.value}: {state.message!r}"
    assert "backend='spmd' needs an NVIDIA GPU" in state.message


def test_a_flow_run_with_no_gpu_task_starts_no_engine_and_says_so(no_gpu_runs):
    plain = no_gpu_runs["no-gpu-task"]
    assert plain.get("returned") == 42, plain
    assert plain["run"].state.is_completed(), plain["run"].state
    # The runner is entered before the flow run's context exists and left after it is gone,
    # so with no GPU call in the run it says so on the process's console, not in the run's log.
    said = [line for line in plain["printed"] if "cudf-polars engine not started: no GPU task ran" in line]
    assert len(said) == 1, plain["printed"][-30:]
    messages = read_run_logs(plain["run"].id, expect="Finished in state")
    assert not any("engine session started" in m for m in messages), messages


def test_gpu_tasks_submitted_at_once_open_one_engine(cpu_block, orders):
    @task
    def session_id() -> str:
        return get_engine_session().id

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def at_once():
        futures = [session_id.submit() for _ in range(8)]
        return {f.result() for f in futures}

    state = at_once(return_state=True)
    assert len(state.result()) == 1
    messages = read_run_logs(state.state_details.flow_run_id, expect="session ended")
    assert len([m for m in messages if "engine session started" in m]) == 1, messages
