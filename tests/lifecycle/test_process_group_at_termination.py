"""
A process whose flow run SIGTERM ended leaves nothing in its process group once it exits.

A Prefect process worker cancels a flow run with SIGTERM to the run's process group and
counts the run ``Cancelled`` once the group is gone; multiprocessing's resource tracker
(started by spawned processes, as distributed's workers on ``dask``) must not outlive the
flow process there. A real subprocess runs the flow in a group of its own, under a launcher
that is a child subreaper, so an orphaned tracker would stay in the group as the launcher's
zombie.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

SCRIPTS = Path(__file__).parent / "scripts"
#: Seconds after the flow process's exit within which its group must be gone.
GROUP_GONE_WITHIN_S = 0.3


@pytest.mark.skipif(sys.platform != "linux", reason="needs Linux's prctl(PR_SET_CHILD_SUBREAPER)")
def test_a_flow_run_ended_by_sigterm_leaves_no_resource_tracker_in_the_process_group(orders):
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "in_own_group.py"),
         sys.executable, str(SCRIPTS / "terminated_after_spawning.py"), str(orders)],
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        printed, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's group; the flow's has its own
        printed, _ = proc.communicate(timeout=30)
        pytest.fail(f"the launcher did not end within 240 s\n{printed[-3000:]}")
    assert proc.returncode == 0, printed[-4000:]
    report = json.loads(printed.strip().splitlines()[-1])
    # Prefect 3.9 ends the process with SIGTERM again once the flow run is over.
    assert report["returncode"] == -signal.SIGTERM, printed[-4000:]
    ended = [line for line in printed.splitlines() if "engine session ended" in line]
    assert len(ended) == 1 and "released unconsumed 1" in ended[0], printed[-3000:]
    gone = report["group_gone_after_s"]
    assert gone is not None and gone < GROUP_GONE_WITHIN_S, (
        f"the flow process's group was still there {gone} s after it exited\n{printed[-3000:]}"
    )
    errors = [line for line in printed.splitlines() if "Traceback" in line or "leaked" in line]
    assert not errors, f"noise at exit: {errors}\n{printed[-3000:]}"
