"""
Cancelling a deployment's flow run through the API is as clean as success, on every backend.

A real ``prefect worker start --type process`` runs ``tests/reliability/scripts/flow_until_signalled.py``
(three results, one consumed, then a wait in the flow body) on the backend under test: ``cpu``,
and on a GPU ``spmd``, ``dask`` (an owned ``LocalCUDACluster``) and ``ray`` (a local Ray). The
test asks the API to cancel the run. Prefect 3.9's process worker then sends SIGTERM to the
run's whole process group (an owned cluster included) and SIGKILL 30 s later. Required:

* the run is ``Cancelled`` within 10 s of the request (``CANCELLED_WITHIN_S``);
* the session's end line was written (results produced 3, consumed 1, released unconsumed 2)
  with a complete teardown, and the ``engine.stopped`` event reached the API;
* no process of the run is left, and on a GPU the device memory is back to its figure before.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from api_reads import events_of
from nvidia_smi import device_memory_used_mib, wait_back_to
from process_worker import SUBPROCESS_BACKENDS, cancel_and_wait, process_worker_deployment, worker_env
from processes import pid_alive, wait_until

FLOW_FOLDER = Path(__file__).parents[1] / "reliability" / "scripts"
#: Seconds from the request to ``Cancelled``, on every backend. Prefect's process worker
#: checks every 3 s whether the run's process group is gone (docs/reliability.md gives the figures).
CANCELLED_WITHIN_S = 10.0
ENGINE_STOPPED = "prefect_cudf_polars.engine.stopped"


@contextlib.contextmanager
def evidence_on_failure(folder: Path) -> Iterator[None]:
    """Add the ends of the worker's log, the flow's log and the flow process's stacks to a failure."""
    try:
        yield
    except AssertionError as failure:
        tails = []
        for name in ("worker.log", "flow.log", "stacks.txt"):
            path = folder / name
            text = path.read_text()[-3000:] if path.exists() else "(not written)"
            tails.append(f"--- {name}\n{text}")
        raise AssertionError("\n".join([str(failure), *tails])) from failure


@pytest.mark.parametrize("backend", SUBPROCESS_BACKENDS)
@pytest.mark.timeout(360)
def test_a_cancelled_flow_run_is_cancelled_within_its_bound_with_its_teardown_done(backend, tmp_path, orders, figure):
    from prefect.deployments import run_deployment

    pool = f"cancel-{tmp_path.name}"[:50]
    env = worker_env(PREFECT_CUDF_POLARS_TEST_BACKEND=backend)
    device_memory_before = device_memory_used_mib() if backend != "cpu" else None
    ready_file = tmp_path / "ready.json"
    with process_worker_deployment(
        pool, flow_name="hold-results", entrypoint="flow_until_signalled.py:hold_results", folder=FLOW_FOLDER,
        parameters={"evidence": str(tmp_path), "path": str(orders)}, env=env, log=tmp_path / "worker.log",
    ) as worker:
        flow_run = run_deployment(f"hold-results/{pool}", timeout=0)
        wait_until(lambda: ready_file.exists() or worker.poll() is not None, 300, "the flow run holding its results")
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-4000:]
        ready = json.loads(ready_file.read_text())
        assert ready["flow_run_id"] == str(flow_run.id) and ready["live"] == ["live", "live"]
        with evidence_on_failure(tmp_path):
            marks: dict[str, float] = {}
            state, seconds = cancel_and_wait(flow_run.id, pid=ready["pid"], marks=marks)
            figure(f"{backend}_seconds_to_{state.type.value.lower()}", round(seconds, 2))
            # Where the seconds go: the flow process's end, its group's end, then Prefect's part.
            for name, value in marks.items():
                figure(f"{backend}_{name}", value)
            assert state.is_cancelled(), state
            assert seconds <= CANCELLED_WITHIN_S, (
                f"{backend}: Cancelled {seconds:.1f} s after the request (bound {CANCELLED_WITHIN_S:g} s); "
                f"seconds after the request: {marks}"
            )
    # No process of the run is left.
    assert not pid_alive(ready["pid"])
    assert not [p for p in ready["children"] if pid_alive(p)], "processes of the flow run left behind"
    # The session's end, written synchronously by the flow process before it ended.
    log = (tmp_path / "flow.log").read_text().splitlines()
    ended = [line for line in log if "engine session ended" in line]
    assert len(ended) == 1, f"{backend}: {len(ended)} session end lines; flow log:\n" + "\n".join(log[-40:])
    assert (
        f"backend={backend}, results produced 3, consumed 1, released unconsumed 2" in ended[0]
    ), ended[0]
    assert not [line for line in log if "teardown stopped waiting" in line], log[-20:]
    stopped = [e for e in events_of(flow_run.id, expect={ENGINE_STOPPED: 1}) if e.event == ENGINE_STOPPED]
    assert stopped and stopped[0].payload["teardown"] == "complete", stopped
    if device_memory_before is not None:
        wait_back_to(device_memory_before, 60, "device memory back to its figure before")
