"""
The flow-run-end benchmark (``python -m benchmarks.session_end``) on the CPU, so it never rots.

The real command runs in a subprocess against the test session's Prefect API, with a
few results, the flow runs in an order other than the default, and a warm-up. No timing
is asserted: only that its three flow runs ran in that order and completed, that the
control run really had the session monitor switched off (no artifact and no event of
ours) while ``ours`` wrote one artifact per result and its summary, and that the figures
it reports are the differences it names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api_reads import artifacts_of, events_of

ROOT = Path(__file__).resolve().parents[2]
# benchmarks/ is a folder of the repository, not an installed package.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import session_end  # noqa: E402
RESULTS = 4
ORDER = ["ours", "plain", "ours_monitor_off"]
WARMUP = 2


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from prefect.settings import get_current_settings

    out = tmp_path_factory.mktemp("session-end") / "session_end.json"
    env = {**os.environ, "PREFECT_API_URL": str(get_current_settings().api.url), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.session_end", "--results", str(RESULTS), "--backend", "cpu",
         "--artifact-timeout", "60", "--order", ",".join(ORDER), "--warmup", str(WARMUP), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_three_flow_runs_complete_and_the_figures_are_their_differences(figures: dict) -> None:
    from prefect.client.orchestration import get_client

    runs = {name: figures[name] for name in ("plain", "ours_monitor_off", "ours")}
    with get_client(sync_client=True) as client:
        for name, run in runs.items():
            state = client.read_flow_run(run["flow_run_id"]).state
            assert state is not None and state.is_completed(), (name, state)
    assert figures["results"] == RESULTS and figures["backend"] == "cpu"
    assert figures["order"] == ORDER and figures["warmup_results"] == WARMUP
    with get_client(sync_client=True) as client:
        starts = [client.read_flow_run(runs[name]["flow_run_id"]).start_time for name in ORDER]
    assert starts == sorted(starts)
    # Every flow run but the last waited for the API to hold its task runs, within the bound.
    for name in ORDER[:-1]:
        assert runs[name]["settled"] is True, name
        assert 0 <= runs[name]["settle_s"] < session_end.SETTLE_TIMEOUT_S, name
    assert "settle_s" not in runs[ORDER[-1]]
    assert {"prefect", "polars", "prefect-cudf-polars"} <= set(figures["machine"]["packages"])
    assert figures["session_end_added_s"] == pytest.approx(runs["ours"]["end_s"] - runs["plain"]["end_s"])
    assert figures["monitor_end_added_s"] == pytest.approx(
        runs["ours"]["end_s"] - runs["ours_monitor_off"]["end_s"]
    )
    for name in ("ours_monitor_off", "ours"):
        assert 0 <= runs[name]["session_close_s"] < runs[name]["end_s"] + 1e-6, name
    assert runs["ours"]["artifacts_s"] is not None


def test_the_control_run_writes_no_artifact_and_ours_one_per_result_and_its_summary(figures: dict) -> None:
    assert artifacts_of(flow_run_id=figures["ours_monitor_off"]["flow_run_id"], settled=False) == []
    # ours's events are read first, so that the control run's have had as long to arrive.
    ours_events = events_of(figures["ours"]["flow_run_id"], expect={"prefect_cudf_polars.engine.stopped": 1})
    assert "prefect_cudf_polars.engine.stopped" in {event.event for event in ours_events}
    assert events_of(figures["ours_monitor_off"]["flow_run_id"], expect={}, timeout=0) == []
    ours = artifacts_of(flow_run_id=figures["ours"]["flow_run_id"], settled=False)
    per_result = [artifact for artifact in ours if artifact.task_run_id is not None]
    summaries = [artifact for artifact in ours if artifact.task_run_id is None]
    assert len(per_result) == RESULTS
    assert len({artifact.task_run_id for artifact in per_result}) == RESULTS
    assert len(summaries) == 1 and summaries[0].key is not None
    assert figures["monitoring"] == {
        "result_artifacts": True, "plans": True, "events": True, "summary_artifact": True,
    }
