"""
A process that exits with a session still open prints no error, and one warning naming the
results that were still live (a real subprocess talking to the test's Prefect API).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
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
    naming = [line for line in printed.splitlines() if result["id"] in line]
    assert len(naming) == 1, f"lines naming the live result {result}: {naming}\n{printed[-3000:]}"
    assert "arning" in naming[0] and result["name"] in naming[0], naming[0]


def test_exiting_before_the_api_took_every_artifact_drops_them_with_one_warning():
    """What the exit's bounded drain did not send is dropped, said once, and the process ends at once."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "scripts" / "exit_with_unsent_artifacts.py")],
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        capture_output=True, text=True, timeout=240,
    )
    ended = time.time()
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 0, printed[-4000:]
    returned = re.search(r"flow run returned 40 at ([0-9.]+)", printed)
    assert returned, printed[-4000:]
    # The drain (1 s here), the writer's stop (at most 1 s) and Prefect's own exit work; not
    # the blocked writes' 120 s.
    assert ended - float(returned.group(1)) < 30.0, printed[-4000:]
    errors = [line for line in printed.splitlines() if "ERROR" in line or "Traceback" in line]
    assert not errors, f"error at exit: {errors[0]}\n{printed[-4000:]}"
    dropped = [line for line in printed.splitlines() if "were not sent" in line]
    assert len(dropped) == 1 and "WARNING" in dropped[0], printed[-4000:]
    count = int(re.search(r"(\d+) cudf-polars monitoring records \(events, artifacts\) were not sent", dropped[0]).group(1))
    # Each result's record (event and artifact) and its result.released event; the summary artifact.
    assert 40 <= count <= 2 * 40 + 1, dropped[0]
