"""
Device memory exhausted on a real GPU (SPMD backend): the error names the block
option that spills, the session survives, nothing else is lost.

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


def test_device_memory_exhausted_says_which_option_spills():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    out = json.loads(lines[-1][len("RESULT "):])
    print(json.dumps(out, indent=1))
    if "start_error" in out:
        pytest.skip(f"rmm LimitingResourceAdaptor could not be configured here: {out['start_error']}")
    assert out["raised"] == "DeviceMemoryError", out
    assert out["is_memory_error"]
    assert "spill_device_limit" in out["message"] and "target_partition_size" in out["message"]
    assert "cudf-polars said:" in out["message"]
    assert out["live_after_error"] == ["kept"]  # the failed query left no result behind
    assert out["kept_rows"] == 3 and out["small_query_rows"] == 10  # nothing lost, nothing hung
    assert out["before_shutdown"] == out["at_start"]  # rmm back to its starting figure
