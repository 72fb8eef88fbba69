"""
An owned cluster outside the flow run's process group, and still gone when the flow process is killed.

A Prefect process worker cancels a flow run with SIGTERM to the run's whole process
group. The worker processes of an owned Dask cluster move into process groups of their
own, so that signal reaches only the flow process, whose teardown then releases the
results on the workers and closes the cluster. When the flow process is SIGKILLed (no
teardown at all), its worker processes must still end: nothing may be orphaned.

CPU: a ``distributed.LocalCluster`` with process workers, started through the ``dask``
backend's ``connect`` (the same nanny and worker-process machinery as ``LocalCUDACluster``),
in a real subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import kill_all, wait_gone

pytest.importorskip("distributed")

SCRIPT = Path(__file__).parent / "scripts" / "owned_dask_cluster.py"


def _start() -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("READY "):
            return proc, json.loads(line[len("READY "):])
    proc.kill()
    raise AssertionError(f"the cluster process ended early with {proc.wait()}")


@pytest.mark.timeout(300)
def test_an_owned_clusters_workers_leave_the_flow_process_group_and_die_with_it():
    proc, ready = _start()
    try:
        assert ready["pgid"] == ready["pid"]  # the stand-in flow process leads its group
        assert len(ready["workers"]) == 2
        # Each worker leads a group of its own: a signal to the flow process's group misses them.
        assert ready["worker_groups"] == ready["workers"], ready
        os.killpg(ready["pgid"], signal.SIGKILL)  # the flow process dies without any teardown
        proc.wait(timeout=30)
        left = wait_gone(set(ready["workers"]), timeout=30)
        assert left == set(), f"worker processes orphaned by the killed flow process: {sorted(left)}"
    finally:
        kill_all(proc, ready["workers"])
