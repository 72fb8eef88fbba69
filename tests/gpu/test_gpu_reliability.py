"""
Device memory exhausted on a real GPU (SPMD backend): the error names the block
option that spills, the session survives, nothing else is lost, and our layer
holds nothing the failure left behind.

What cudf-polars itself leaves allocated after an out-of-memory failure is
measured next to ours (``alone`` mode of the script): with cudf-polars 26.10.2
each failed query of this shape leaves 16,250,112 bytes allocated through rmm
with no Python object holding them, growing with each failure until the engine
shuts down. The test checks that
our session adds nothing to that figure and that shutting the engine down (the
session's end) gives the memory back to the driver.

The other reliability tests (teardown on every ending, tee, retries, 32 tasks at
once, 1,000 tasks, bad inputs) run on the GPU as the ``spmd`` cases of
``tests/reliability/`` (marked ``gpu``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).parent / "scripts" / "exhaust_device_memory.py"
#: Free-memory difference tolerated between a run with failures and the control
#: run, after shutdown (bytes): lazily loaded kernels of the failed path.
FREE_SLACK = 8 * 2**20


def run_script(mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), mode], capture_output=True, text=True, timeout=300
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    return json.loads(lines[-1][len("RESULT "):])


def test_device_memory_exhausted_says_which_option_spills():
    ours, alone, control = run_script("ours"), run_script("alone"), run_script("control")
    for out in (ours, alone, control):
        print(json.dumps({k: v for k, v in out.items() if k != "message"}))
    # The script catches MemoryError only (DeviceMemoryError is one); any other error fails it.
    assert ours["raised"] == "DeviceMemoryError", ours
    assert "spill_device_limit" in ours["message"] and "target_partition_size" in ours["message"]
    assert "cudf-polars said:" in ours["message"]
    assert ours["live_after_error"] == ["kept"]  # the failed query left no result behind
    assert ours["kept_rows"] == 3 and ours["small_query_rows"] == 10  # nothing lost, nothing hung
    # A held error keeps nothing alive: the same figure with the error alive and gone.
    assert ours["held_with_error_1"] == ours["after_error_1"]
    # What stays allocated after each failure is cudf-polars' own figure, not ours.
    assert alone["raised"] is not None and alone["kept_rows"] == 3, alone
    for attempt in (1, 2):
        left_ours = ours[f"after_error_{attempt}"] - ours["at_start"]
        left_alone = alone[f"after_error_{attempt}"] - alone["at_start"]
        assert abs(left_ours - left_alone) <= 2**20, (attempt, left_ours, left_alone)
    # Shutting the engine down gives it back to the driver (no pool: frees reach cudaMemGetInfo).
    lost_ours = ours["free_before_engine"] - ours["free_after_shutdown"]
    lost_control = control["free_before_engine"] - control["free_after_shutdown"]
    assert lost_ours - lost_control <= FREE_SLACK, (lost_ours, lost_control)
