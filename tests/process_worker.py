"""
A deployment served by a real ``prefect worker start --type process``, and cancelling its flow runs.

For tests that stop a flow run the way Prefect's process worker does: SIGTERM to the run's
whole process group (then SIGKILL after its grace period).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client

from processes import child_pids, pid_alive, stop, wait_gone

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


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment for a worker or flow process that talks to this test session's Prefect API
    and asks it for work every second; ``extra`` variables added."""
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "1", **extra}


@contextlib.contextmanager
def process_worker_deployment(
    pool: str, *, flow_name: str, entrypoint: str, folder: Path, parameters: dict[str, Any],
    env: dict[str, str], log: Path, worker_limit: int = 1,
) -> Iterator[subprocess.Popen]:
    """
    A process work pool ``pool`` with one deployment (also named ``pool``) and a worker serving it.

    The deployment runs ``entrypoint`` (``file.py:function``) from ``folder`` with
    ``parameters``. The worker runs ``worker_limit`` flow runs at a time, with ``env``, its output
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
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process", "--limit", str(worker_limit)],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        yield worker
    except BaseException:
        stop([worker], timeout=60)
        raise
    worker_tree = child_pids(worker.pid) if worker.poll() is None else set()
    stop([worker], timeout=60)
    assert not wait_gone(worker_tree, timeout=1), "worker processes left behind"


def cancel_and_wait(
    flow_run_id: Any, timeout: float = 120.0, *, pid: int | None = None, marks: dict[str, float] | None = None
) -> tuple[Any, float]:
    """
    Ask the API to cancel a flow run (``Cancelling``) and wait for a final state.

    Returns the final state and the seconds from the request to it being read.
    With ``pid`` (the flow process, which leads its own process group under a
    process worker), ``marks`` gets the seconds from the request until that
    process was gone (``flow_process_gone_s``) and until its whole group was
    (``group_gone_s``, what Prefect's worker waits for), polled every 50 ms.
    """
    from prefect.states import Cancelling

    marks = {} if marks is None else marks
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Cancelling())
        requested = time.monotonic()
        next_read = requested
        while True:
            now = time.monotonic()
            if pid is not None:
                if "flow_process_gone_s" not in marks and not pid_alive(pid):
                    marks["flow_process_gone_s"] = round(now - requested, 2)
                if "group_gone_s" not in marks and not group_alive(pid):
                    marks["group_gone_s"] = round(now - requested, 2)
            if now >= next_read:
                state = client.read_flow_run(flow_run_id).state
                if state.is_final():
                    break
                assert now < requested + timeout, f"still {state.type} after {timeout:g} s"
                next_read = time.monotonic() + 0.2
            time.sleep(0.05)
    return state, time.monotonic() - requested


def group_alive(pgid: int) -> bool:
    """Whether any process (a zombie included, as Prefect's worker counts it) is in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
