"""
Release and teardown on every way a flow run ends (real Prefect API; cpu, and on a GPU spmd;
the SIGTERM and cancellation tests also on dask and ray).

After each ending: the session's results are released, the engine was shut down
on its owner thread, no child process is left behind, and the cpu backend's host
store holds nothing more than before. SIGTERM and cancellation run the flow in a
real subprocess (the second one under a real process worker).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from prefect import flow
from prefect.client.orchestration import get_client

from prefect_cudf_polars.blocks import (
    CudfPolarsTaskRunner,
    get_engine_session,
)
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task
from nvidia_smi import device_memory_used_mib, wait_back_to
from process_worker import SUBPROCESS_BACKENDS, cancel_and_wait, process_worker_deployment
from processes import pid_alive
from reliability_fixtures import engine_block, torn_down, subprocess_env  # noqa: F401 (pytest fixtures)

SCRIPTS = Path(__file__).parent / "scripts"
END_LINE = re.compile(
    r"engine session ended: backend=(\w+), results produced (\d+), consumed (\d+), "
    r"released unconsumed (\d+); (?:host store|device memory \(rmm statistics\)) at start "
    r"(\S+), peak \S+, at the end (\S+) \(bytes; read before the engine's shutdown.* on thread (\S+)$"
)


def test_success(engine_block, orders, torn_down):
    sessions = []

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def ok():
        sessions.append(get_engine_session())
        execute(pl.scan_parquet(orders), name="never read")
        return collect(execute(pl.scan_parquet(orders))).height

    assert ok() == 1000
    (session,) = sessions
    torn_down(session)
    assert session.counts == {"produced": 2, "consumed": 1, "released_unconsumed": 1}


def test_task_raising(engine_block, orders, torn_down):
    sessions, kept = [], []

    @gpu_task
    def broken(r: GPUResult) -> pl.LazyFrame:
        r.lazy()
        raise ValueError("bug in a step")

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def fails_in_a_task():
        sessions.append(get_engine_session())
        kept.append(execute(pl.scan_parquet(orders), name="kept"))
        broken(execute(pl.scan_parquet(orders)))

    with pytest.raises(ValueError, match="bug in a step"):
        fails_in_a_task()
    torn_down(sessions[0])
    assert kept[0].state == "released"


def test_flow_raising(engine_block, orders, torn_down):
    sessions, kept = [], []

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def fails_in_the_body():
        sessions.append(get_engine_session())
        kept.extend(execute(pl.scan_parquet(orders)) for _ in range(3))
        raise RuntimeError("flow body fails")

    with pytest.raises(RuntimeError, match="flow body fails"):
        fails_in_the_body()
    torn_down(sessions[0])
    assert [r.state for r in kept] == ["released"] * 3
    assert sessions[0].counts["released_unconsumed"] == 3


def test_flow_retry_releases_the_failed_attempt_before_the_next_starts(engine_block, orders, torn_down):
    seen = []

    @flow(retries=1, task_runner=CudfPolarsTaskRunner(engine_block))
    def flaky():
        session = get_engine_session()
        previous = seen[-1]["session"] if seen else None
        seen.append(
            {
                "session": session,
                "previous_closed": previous.closed if previous else None,
                "previous_live": len(previous.live_results) if previous else None,
                "store_at_start": held_partitions(),
            }
        )
        execute(pl.scan_parquet(orders), name="left by attempt")
        if len(seen) == 1:
            raise RuntimeError("first attempt fails")
        return "done"

    store_before = held_partitions()
    assert flaky() == "done"
    first, second = seen
    assert second["previous_closed"] is True and second["previous_live"] == 0
    assert second["store_at_start"] == store_before  # attempt 1's result was gone before attempt 2 ran
    assert first["session"] is not second["session"]
    torn_down(first["session"])
    torn_down(second["session"])


def test_keyboard_interrupt_in_the_flow_body(engine_block, orders, torn_down):
    sessions = []

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def interrupted():
        sessions.append(get_engine_session())
        execute(pl.scan_parquet(orders))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    torn_down(sessions[0])


def test_keyboard_interrupt_inside_block_session(engine_block, orders, torn_down):
    sessions = []

    @flow
    def interrupted():
        with engine_block.session() as session:
            sessions.append(session)
            execute(pl.scan_parquet(orders))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    torn_down(sessions[0])


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 150.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"process ended early with {proc.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} did not appear in {timeout} s")
        time.sleep(0.2)
    time.sleep(0.2)  # the writer has closed it
    return json.loads(path.read_text())


def _evidence(evidence: Path) -> str:
    """The flow log, the stacks of a flow process that outlived its stop, and the worker log."""
    parts = []
    for name, chars in (("flow.log", 4000), ("stacks.txt", 12000), ("worker.log", 6000)):
        path = evidence / name
        if path.exists():
            parts.append(f"--- {name} (last {chars} characters)\n{path.read_text()[-chars:]}")
    return "\n".join(parts)


def _assert_flow_process_torn_down(evidence: Path, ready: dict, backend: str) -> None:
    """
    Check the stopped flow process's teardown from its evidence.

    The same after a SIGTERM to the flow process and after a Prefect process worker's
    SIGTERM to the run's whole process group (an owned Dask cluster's workers and a
    local Ray head are outside it).
    """
    # Before the stop: two results live in the flow process's engine.
    assert ready["live"] == ["live", "live"]
    assert ready["memory_held"] > ready["memory_at_start"]
    if backend == "cpu":
        assert ready["host_store_partitions"] == 2
    # The flow process and anything it started are gone.
    assert not pid_alive(ready["pid"])
    assert not [p for p in ready["children"] if pid_alive(p)]
    # The session's end line, written synchronously by the flow process.
    log = (evidence / "flow.log").read_text().splitlines()
    lines = [m for m in log if "session ended" in m]
    assert len(lines) == 1, _evidence(evidence)
    (line,) = lines
    found, produced, consumed, released, at_start, held_at_end, thread = END_LINE.search(line).groups()
    assert (found, produced, consumed, released) == (backend, "3", "1", "2"), line
    # An owned Dask cluster or local Ray runs outside the flow run's process group, so a
    # group SIGTERM leaves it answering until the teardown has released every result.
    gave_up = [m for m in log if "teardown stopped waiting" in m]
    assert gave_up == [], gave_up
    # The two live results were held until the end, and the session released them then.
    assert at_start == str(ready["memory_at_start"]) and held_at_end == str(ready["memory_held"]), line
    assert thread.startswith("cudf-polars-engine-owner")


@pytest.mark.parametrize("backend", SUBPROCESS_BACKENDS)
def test_sigterm_to_the_flow_process(backend, tmp_path, orders, subprocess_env):
    device_memory_before = device_memory_used_mib() if backend != "cpu" else None
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "flow_until_signalled.py"), str(tmp_path), str(orders)],
        env={**subprocess_env, "PREFECT_CUDF_POLARS_TEST_BACKEND": backend},
    )
    try:
        ready = _wait_for(tmp_path / "ready.json", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    _assert_flow_process_torn_down(tmp_path, ready, backend)
    if device_memory_before is not None:
        wait_back_to(device_memory_before, 60, "device memory back to its figure before")
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(ready["flow_run_id"]).state
    assert state.is_crashed() and "termination signal" in state.message


@pytest.mark.parametrize("backend", SUBPROCESS_BACKENDS)
def test_cancelling_a_deployments_flow_run_while_a_worker_runs_it(backend, tmp_path, orders, subprocess_env):
    from prefect.deployments import run_deployment

    pool = f"teardown-{tmp_path.name}"[:50]
    device_memory_before = device_memory_used_mib() if backend != "cpu" else None
    with process_worker_deployment(
        pool, flow_name="hold-results", entrypoint="flow_until_signalled.py:hold_results", folder=SCRIPTS,
        parameters={"evidence": str(tmp_path), "path": str(orders)},
        env={**subprocess_env, "PREFECT_CUDF_POLARS_TEST_BACKEND": backend}, log=tmp_path / "worker.log",
    ) as worker:
        flow_run = run_deployment(f"hold-results/{pool}", timeout=0)
        ready = _wait_for(tmp_path / "ready.json", worker)
        assert ready["flow_run_id"] == str(flow_run.id)
        state, seconds = cancel_and_wait(flow_run.id)
        print(f"{backend}: Cancelling to {state.type.value} in {seconds:.1f} s")
        assert state.is_cancelled(), state
        assert worker.poll() is None  # the worker survives the cancellation
        if device_memory_before is not None:
            # Whatever the teardown did, every process that held device memory has ended.
            wait_back_to(device_memory_before, 60, "device memory back to its figure before")
        _assert_flow_process_torn_down(tmp_path, ready, backend)
