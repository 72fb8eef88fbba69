"""
Result artifacts are written off the critical path: neither a GPU task run nor the end of
its flow run waits for them, and every GPU task run still gets its artifact.

The second test holds every task-run artifact write (a ``POST /artifacts/`` through Prefect's
client) until the test lets them go: the flow run must end, Completed with its
session's end line, while they are held; once let go, each GPU task run gets its artifact.
How long a session's end takes for 1,000 results is a benchmark figure
(``benchmarks/session_end.py``), not asserted here.
"""

from __future__ import annotations

import threading
import time

import anyio
import polars as pl
from prefect import flow
from prefect.client.orchestration import PrefectClient

from api_reads import artifacts_of, task_runs_of
from conftest import read_run_logs
from prefect_cudf_polars.blocks import CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import GPUResult, gpu_task

#: Seconds after which the held artifact writes go ahead anyway.
HOLD_S = 30.0


@gpu_task
def customer_orders(path: str, customer: int) -> pl.LazyFrame:
    return pl.scan_parquet(path).filter(pl.col("customer") == customer)


def result_artifacts_by_task_run(flow_run_id) -> dict:
    """The result artifacts of a flow run's task runs, by task run id."""
    found: dict = {}
    for artifact in artifacts_of(flow_run_id=flow_run_id):
        if artifact.task_run_id is not None and "cudf-polars result" in (artifact.data or ""):
            found.setdefault(artifact.task_run_id, []).append(artifact)
    return found


def wait_for_result_artifacts(flow_run_id, expected: int, timeout: float = 120.0) -> dict:
    """Poll until ``expected`` task runs have a result artifact (or ``timeout`` seconds pass)."""
    deadline = time.monotonic() + timeout
    while True:
        found = result_artifacts_by_task_run(flow_run_id)
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def run_wide_flow(cpu_block, orders, tasks: int):
    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def wide() -> list[str]:
        futures = [
            customer_orders.with_options(task_run_name=f"customer-{i}").submit(str(orders), i % 7)
            for i in range(tasks)
        ]
        results: list[GPUResult] = [f.result() for f in futures]
        return [r.id for r in results]

    return wide(return_state=True)


def test_every_gpu_task_run_of_a_wide_flow_gets_its_artifact(cpu_block, orders):
    tasks = 60
    state = run_wide_flow(cpu_block, orders, tasks)
    ids = state.result()
    flow_run_id = state.state_details.flow_run_id
    found = wait_for_result_artifacts(flow_run_id, tasks)
    runs = task_runs_of(flow_run_id, expect=tasks, final=True)
    gpu_runs = {run.id: name for name, run in runs.items() if name.startswith("customer-")}
    assert len(gpu_runs) == tasks
    missing = sorted(name for run_id, name in gpu_runs.items() if run_id not in found)
    assert not missing, f"task runs without their result artifact: {missing}"
    assert all(len(found[run_id]) == 1 for run_id in gpu_runs), "a task run has more than one result artifact"
    texts = "\n".join(a.data for arts in found.values() for a in arts)
    assert all(f"`{result_id}`" in texts for result_id in ids)


def test_the_flow_run_ends_while_result_artifacts_are_still_being_written(cpu_block, orders, monkeypatch):
    release = threading.Event()
    held: list = []
    send = PrefectClient.request

    async def holding(self, method, path, *args, **kwargs):
        body = kwargs.get("json") or {}
        if method == "POST" and path == "/artifacts/" and body.get("task_run_id") is not None:
            held.append(body["task_run_id"])
            await anyio.to_thread.run_sync(release.wait)
        return await send(self, method, path, *args, **kwargs)

    monkeypatch.setattr(PrefectClient, "request", holding)
    tasks = 10
    let_go = threading.Timer(HOLD_S, release.set)
    let_go.start()
    try:
        state = run_wide_flow(cpu_block, orders, tasks)
        ended_while_held = not release.is_set() and bool(held)
        flow_run_id = state.state_details.flow_run_id
        runs = task_runs_of(flow_run_id, expect=tasks, final=True)
        logs = read_run_logs(flow_run_id, expect="session ended")
    finally:
        release.set()
        let_go.cancel()
    assert ended_while_held, (
        f"the flow run ended only after its result artifact writes were let go ({len(held)} "
        f"writes held, let go after {HOLD_S:g} s)"
    )
    assert state.is_completed(), state
    assert all(run.state.is_completed() for run in runs.values()), {n: r.state for n, r in runs.items()}
    assert any("engine session ended" in m and f"results produced {tasks}" in m for m in logs), logs
    found = wait_for_result_artifacts(flow_run_id, tasks)
    gpu_runs = [run.id for name, run in runs.items() if name.startswith("customer-")]
    assert len(gpu_runs) == tasks and all(run_id in found for run_id in gpu_runs), (
        f"{len(found)} of {tasks} task runs got their result artifact after the writes were let go"
    )
