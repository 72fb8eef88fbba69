"""
32 tasks submitted at once against one engine session.

Engine calls are serialized on the session's owner thread (see the developer
notes of ``blocks/engine.py``: rapidsmpf needs one thread to create, use and
shut down an engine, and a single-rank engine's stream pool and store are not
promised thread-safe). Here 32 task threads call the engine together: every
result is right, no call overlaps another, and the flow run ends (a
``pytest-timeout`` guard turns a deadlock into a failure instead of a hang).
"""

from __future__ import annotations

import threading

import polars as pl
import pytest
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsTaskRunner
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.blocks.backends.cpu import CpuRunningEngine
from prefect_cudf_polars.blocks.backends.streaming import StreamingRunningEngine
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task
from reliability_fixtures import engine_block  # noqa: F401 (pytest fixtures)

TASKS = 32


@pytest.fixture()
def overlap(monkeypatch, engine_block):
    """Record the most engine calls in flight at once, and the threads they ran on."""
    state = {"now": 0, "most": 0, "threads": set()}
    lock = threading.Lock()
    running = CpuRunningEngine if engine_block.backend == "cpu" else StreamingRunningEngine
    for name in ("execute", "collect"):
        original = getattr(running, name)

        def spy(self, lf, flags, _original=original):
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
                state["threads"].add(threading.current_thread().name)
            try:
                return _original(self, lf, flags)
            finally:
                with lock:
                    state["now"] -= 1

        monkeypatch.setattr(running, name, spy)
    return state


@gpu_task
def customer_total(r: GPUResult, customer: int) -> pl.LazyFrame:
    return r.lazy().filter(pl.col("customer") == customer).select(pl.col("amount").sum(), pl.len())


@pytest.mark.timeout(240)
def test_32_tasks_at_once_on_one_session(engine_block, orders, overlap):
    store_before = held_partitions()

    @flow(task_runner=CudfPolarsTaskRunner(engine_block, max_workers=TASKS))
    def at_once():
        sources = [execute.submit(pl.scan_parquet(orders), name=f"orders-{i}") for i in range(TASKS)]
        totals = [customer_total.submit(s, i % 7) for i, s in enumerate(sources)]
        collected = [collect.submit(t) for t in totals]
        return [f.result() for f in collected]

    results = at_once()
    source = pl.read_parquet(orders)
    for i, df in enumerate(results):
        part = source.filter(pl.col("customer") == i % 7)
        assert df["amount"].item() == part["amount"].sum() and df["len"].item() == part.height
    assert overlap["most"] == 1, "engine calls overlapped"
    assert len(overlap["threads"]) == 1 and overlap["threads"].pop().startswith("cudf-polars-engine-owner")
    assert held_partitions() == store_before
