"""
A deployment served by a real ``prefect worker start --type process``, and cancelling its flow runs.

For tests that stop a flow run the way Prefect's process worker does: SIGTERM to the run's
whole process group (then SIGKILL after its grace period).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client

from processes import child_pids, pid_alive, stop

#: The backends a flow process runs its engine on, owning it: for dask its
#: ``LocalCUDACluster``, for ray a local Ray.
SUBPROCESS_BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("spmd", id="spmd", marks=pytest.mark.gpu),
    pytest.param("dask", id="dask", marks=pytest.mark.gpu),
    pytest.param(
        "ray", id="ray",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not find_spec("ray"), reason="needs Ray (pip install ray)")],
    ),
]


@contextlib.contextmanager
def process_worker_deployment(
    pool: str, *, flow_name: str, entrypoint: str, folder: Path, parameters: dict[str, Any],
    env: dict[str, str], log: Path,
) -> Iterator[subprocess.Popen]:
    """
    A process work pool ``pool`` with one deployment (also named ``pool``) and a worker serving it.

    The deployment runs ``entrypoint`` (``file.py:function``) from ``folder`` with
    ``parameters``. The worker runs one flow run at a time, with ``env``, its output
    going to ``log``. It is stopped on exit, and its process tree must be gone a second
    later (an ``AssertionError`` otherwise).
    """
    with get_client(sync_client=True) as client:
        from prefect.client.schemas.actions import WorkPoolCreate

        client.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
        client.create_deployment(
            flow_id=client.create_flow_from_name(flow_name),
            name=pool,
            work_pool_name=pool,
            entrypoint=entrypoint,
            path=str(folder),
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(folder)}}],
            parameters=parameters,
        )
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process", "--limit", "1"],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        yield worker
    except BaseException:
        stop([worker], timeout=60)
        raise
    worker_tree = child_pids(worker.pid) if worker.poll() is None else set()
    stop([worker], timeout=60)
    time.sleep(1)
    assert not [p for p in worker_tree if pid_alive(p)], "worker processes left behind"


def cancel_and_wait(flow_run_id: Any, timeout: float = 120.0) -> tuple[Any, float]:
    """
    Ask the API to cancel a flow run (``Cancelling``) and wait for a final state.

    Returns the final state and the seconds from the request to it being read.
    """
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Cancelling())
        requested = time.monotonic()
        while not (state := client.read_flow_run(flow_run_id).state).is_final():
            assert time.monotonic() < requested + timeout, f"still {state.type} after {timeout:g} s"
            time.sleep(0.2)
    return state, time.monotonic() - requested
