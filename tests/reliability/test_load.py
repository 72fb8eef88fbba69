"""
Load: a flow of 1,000 small GPU tasks keeps host and engine memory flat (and Prefect's
API records every one of its task runs), and a result that Prefect's futures still hold
after consumption keeps no engine memory.

Host memory is this process's resident set size (``VmRSS`` in /proc/self/status,
bytes), read inside the flow run every 100 tasks, next to the engine's memory
(``session.memory_in_use()``: rmm statistics on the GPU, the host store's bytes
on ``cpu``); the test prints the figures (run with ``-s`` to see them). The
``spmd`` case is marked ``gpu`` and gives the device figures on a GPU machine.

On the GPU the engine's figure is not flat along a chain: with cudf-polars
26.10.2 each chained ``execute(r.lazy().with_columns(...))`` step keeps 8,000
bytes more allocated (one replaced 1,000-row float64 column) while the chain's
last result is live, with cudf-polars' ``SPMDEngine`` alone exactly as through
our tasks, and all of it is freed when the last result is read (``tests/gpu/scripts/chained_memory.py``
measures the three ways). So on ``spmd`` the test checks that our tasks add
nothing to cudf-polars' own figures, step for step, and that reading the last
result brings the engine back to its start.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import polars as pl
import pytest
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task
from reliability_fixtures import engine_block  # noqa: F401 (pytest fixtures)

TASKS = 1000
#: Allowed RSS growth from task 200 to task 1,000 (bytes). Prefect keeps a small
#: record of every task run of the flow run (states, futures), and each result
#: keeps its lineage (a few Python objects); engine data itself must not grow.
FLAT_BYTES = 64 * 2**20


def completed_task_runs_when(flow_run_id, count: int, *, timeout: float) -> int:
    """
    The flow run's Completed task runs, as the API counts them, once there are ``count``
    (or ``timeout`` seconds have passed).
    """
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    flt = TaskRunFilter(
        flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]),
        state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.COMPLETED])),
    )
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            counted = client.request("POST", "/task_runs/count", json={"task_runs": flt.model_dump(mode="json")}).json()
        if counted >= count or time.monotonic() > deadline:
            return counted
        time.sleep(1)


def rss_bytes() -> int:
    """Resident set size of this process, in bytes (VmRSS, Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found")


@gpu_task
def bump(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().with_columns(pl.col("amount") + 1.0)


def cudf_polars_alone(orders: Path, steps: int) -> list[int]:
    """The same chain on cudf-polars' ``SPMDEngine`` alone: rmm's figure every 100 steps (bytes)."""
    from cudf_polars.engine.spmd import SPMDEngine

    from prefect_cudf_polars.blocks.backends.compat import rank_reading

    

    def rank_allocated_bytes():

        return rank_reading()[0]
    from prefect_cudf_polars.blocks import CudfPolarsEngine
    from prefect_cudf_polars.blocks.backends.streaming import silence_unstable_warning

    silence_unstable_warning()
    figures = []
    block = CudfPolarsEngine(backend="spmd", raise_on_fail=True)
    with SPMDEngine(**block.engine_kwargs()) as engine:
        start = rank_allocated_bytes()
        r = engine.execute(pl.scan_parquet(orders))
        for i in range(1, steps):
            r = engine.execute(r.lazy().with_columns(pl.col("amount") + 1.0))
            if (i + 1) % 100 == 0:
                figures.append(rank_allocated_bytes() - start)
        r.release()
    return figures


@pytest.mark.timeout(600)
def test_a_flow_of_1000_small_tasks_keeps_memory_flat(engine_block, orders):
    readings: list[tuple[int, int, int, int, int]] = []
    ends: dict = {}

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def thousand():
        session = get_engine_session()
        r = execute(pl.scan_parquet(orders), name="orders")
        for i in range(1, TASKS):
            r = bump(r)
            if (i + 1) % 100 == 0:
                gc.collect()
                readings.append(
                    (i + 1, rss_bytes(), session.memory_in_use(), held_partitions(),
                     len(session.live_results))
                )
        total = collect(r.lazy().select(pl.col("amount").sum()))
        ends["back_to_start"] = session.memory_in_use() == session.memory["at_start"]
        ends["at_start"] = session.memory["at_start"]
        return total

    store_before = held_partitions()
    state = thousand(return_state=True)
    total = state.result()
    expected = pl.read_parquet(orders)["amount"].sum() + (TASKS - 1) * 1000
    assert total.item() == pytest.approx(expected)
    print(f"\nbackend={engine_block.backend}\ntasks  rss_MiB  engine_bytes  host_store_partitions  live_results")
    for tasks, rss, engine, parts, live in readings:
        print(f"{tasks:5d}  {rss / 2**20:7.1f}  {engine:12d}  {parts:21d}  {live:12d}")
    expected_parts = store_before + (1 if engine_block.backend == "cpu" else 0)
    assert all(parts == expected_parts and live == 1 for *_, parts, live in readings)
    assert ends["back_to_start"]  # reading the last result freed the whole chain
    if engine_block.backend == "cpu":
        engine_bytes = [engine for _, _, engine, _, _ in readings[1:]]
        # One live result of the same shape at every reading: the host store is flat.
        assert max(engine_bytes) - min(engine_bytes) <= 2**20, engine_bytes
    else:
        ours = [engine - ends["at_start"] for _, _, engine, _, _ in readings]
        alone = cudf_polars_alone(orders, TASKS)
        print(f"engine bytes over start, ours:  {ours}\ncudf-polars SPMDEngine alone: {alone}")
        # Our tasks, session, lineage and artifacts add no device memory to cudf-polars' own.
        assert all(abs(a - b) <= 64 * 2**10 for a, b in zip(ours, alone, strict=True)), (ours, alone)
    growth = readings[-1][1] - readings[1][1]
    print(f"RSS growth from task 200 to task {TASKS}: {growth / 2**20:.1f} MiB")
    assert growth < FLAT_BYTES, f"host memory grew {growth / 2**20:.1f} MiB over 800 tasks"
    assert held_partitions() == store_before
    # Prefect's API records task runs from their events, after they ran: it gets to every one
    # of the flow run's (the 1,000 GPU tasks and the collect), each Completed.
    recorded = completed_task_runs_when(state.state_details.flow_run_id, TASKS + 1, timeout=300)
    assert recorded == TASKS + 1, f"the API recorded {recorded} of the {TASKS + 1} task runs as Completed"


def test_results_held_by_futures_after_consumption_keep_no_engine_memory(engine_block, orders):
    probes = {}

    @gpu_task
    def heavy(path: str) -> pl.LazyFrame:
        return pl.scan_parquet(path)

    @gpu_task(collect=True)
    def rows(r: GPUResult) -> pl.LazyFrame:
        # Count a real column: cudf-polars refuses a zero-column read of a persisted result.
        return r.lazy().select(pl.col("id").count())

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def held():
        futures = [heavy.submit(str(orders)) for _ in range(4)]
        counts = [rows(f) for f in futures]  # consumes each result; the futures still hold them
        results = [f.result() for f in futures]
        probes["persisted"] = [r.persisted for r in results]
        probes["store"] = held_partitions()
        session = get_engine_session()
        probes["engine_memory_back_to_start"] = session.memory_in_use() == session.memory["at_start"]
        probes["states"] = [r.state for r in results]
        return counts, futures

    store_before = held_partitions()
    counts, futures = held()
    assert [c.item() for c in counts] == [1000] * 4
    # The handles are still reachable through the futures, yet they let go of
    # the engine's persisted results and the store holds nothing for them.
    assert probes["states"] == ["consumed"] * 4
    assert probes["persisted"] == [None] * 4
    assert probes["store"] == store_before
    assert probes["engine_memory_back_to_start"]  # rmm statistics on the GPU
    held_results = [f.result() for f in futures]
    assert all(isinstance(r, GPUResult) for r in held_results)


def test_a_consumed_handles_persisted_result_is_garbage_collected(cpu_block, orders):
    store_before = held_partitions()
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders))
        probe = weakref.ref(r.persisted)
        assert session.collect(r.lazy()).height == 1000
        r.release()  # what the tasks do after the engine call
        session.run(lambda: None)  # the release is queued on the owner thread: let it run
        gc.collect()
        assert probe() is None  # the handle `r` is alive, the engine's result is not
        assert r.state == "consumed"
        assert held_partitions() == store_before
