"""
The local Ray a ``ray`` session owns runs outside the flow run's process group, and never outlives it.

A Prefect process worker cancels a flow run with SIGTERM to the run's whole process group;
a local Ray in that group drains for 30 s and keeps the run from ending. The session's own
head runs in a session of its own (none of its processes is in the flow process's group),
its end leaves no Ray process, and a SIGKILLed flow process takes every Ray process with
it. CPU, with Ray installed (skipped without it): a real head and driver in a subprocess.
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

pytest.importorskip("ray", reason="needs Ray (pip install ray)")

SCRIPT = Path(__file__).parent / "scripts" / "own_ray_head.py"


def _start(*args: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("READY "):
            return proc, json.loads(line[len("READY "):])
    raise AssertionError(f"the driver ended early with {proc.wait()}")


@pytest.mark.timeout(300)
def test_the_sessions_ray_head_is_outside_the_flow_process_group_and_stops_with_the_session():
    proc, ready = _start("stop")
    try:
        assert ready["started"], ready
        assert ready["pgid"] not in ready["groups"], ready  # a group SIGTERM reaches no Ray process
        assert proc.stdout.readline().strip() == "STOPPED"  # type: ignore[union-attr]
        assert wait_gone(set(ready["started"]), timeout=10) == set()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.timeout(300)
def test_a_sigkilled_driver_takes_every_process_of_its_ray_head_with_it():
    proc, ready = _start()
    try:
        os.killpg(ready["pgid"], signal.SIGKILL)  # no teardown at all
        proc.wait(timeout=30)
        left = wait_gone(set(ready["started"]), timeout=10)
        assert left == set(), f"Ray processes orphaned by the killed driver: {sorted(left)}"
    finally:
        kill_all(proc, ready["started"])
