"""
A process whose session is ended by SIGTERM leaves nothing in its process group once it exits.

A Prefect process worker cancels a flow run with SIGTERM to the run's process group and
counts the run ``Cancelled`` once the group is gone; multiprocessing's resource tracker
(started by spawned processes, as distributed's workers on ``dask``) must not outlive the
flow process there (a real subprocess in its own process group).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from prefect.settings import PREFECT_API_URL

SCRIPT = Path(__file__).parent / "scripts" / "terminated_after_spawning.py"
#: Seconds after the process's exit within which its group must be gone (a zombie
#: left to the machine's PID 1 stays for about 1-1.5 s where PID 1 reaps lazily).
GROUP_GONE_WITHIN_S = 0.3


def group_alive(pgid: int) -> bool:
    """Whether any process (a zombie included) is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_session_ended_by_sigterm_leaves_no_resource_tracker_in_the_process_group(orders, tmp_path):
    summary_file = tmp_path / "summary.json"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(orders), str(summary_file)],
        env={
            **os.environ,
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        },
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    printed, _ = proc.communicate(timeout=240)
    exited = time.monotonic()
    lingering = group_alive(proc.pid)
    while lingering and time.monotonic() - exited < 10:
        time.sleep(0.01)
        lingering = group_alive(proc.pid)
    gone_after = time.monotonic() - exited
    assert proc.returncode == 143, printed[-4000:]
    summary = json.loads(summary_file.read_text())
    assert summary["teardown"] == "complete", summary
    assert summary["counts"]["released_unconsumed"] == 1, summary
    assert not lingering and gone_after < GROUP_GONE_WITHIN_S, (
        f"the process group was still there {gone_after:.2f} s after the process exited\n{printed[-3000:]}"
    )
