"""
A process that exits with a session still open prints no error, and one warning naming the
results that were still live (a real subprocess talking to the test's Prefect API).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prefect.settings import PREFECT_API_URL

SCRIPT = Path(__file__).parent / "scripts" / "exit_without_closing.py"


def test_exiting_with_an_open_session_prints_one_warning_naming_the_live_results(orders, tmp_path):
    ids = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(orders), str(ids)],
        env={
            **os.environ,
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            # Prefect's own warning for a task run outside a flow run is not what this is about.
            "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        },
        capture_output=True, text=True, timeout=240,
    )
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 0, printed[-4000:]
    result = json.loads(ids.read_text())
    errors = [line for line in printed.splitlines() if "ERROR" in line or "Traceback" in line]
    assert not errors, f"error at exit: {errors[0]}\n{printed[-4000:]}" if errors else ""
    naming = [line for line in printed.splitlines()
              if result["id"] in line or (repr(result["name"]) in line and "arning" in line)]
    assert len(naming) == 1, f"lines naming the live result {result}: {naming}\n{printed[-3000:]}"
    assert "arning" in naming[0] and result["id"] in naming[0], naming[0]

