"""
A device memory limit on a real GPU (``spmd``): held results past it spill to host memory or fail clearly.

A pipeline loads twenty 200 MB tables as results under ``device_memory_limit=4 GB`` (a held
budget of 3.2 GB; loading a table from host memory takes about twice its size on the device): with ``spill_results="host"`` the oldest unread ones move to host memory,
come back when read, and the sums equal the same queries on polars' CPU engine; with
``"off"`` the load that does not fit fails naming the results held. A single result past the limit fails
as out of memory (rmm's ``LimitingResourceAdaptor``) while the rest of the GPU is free. By
the time each flow call returns, the CUDA driver's used device memory (``cudaMemGetInfo``)
is within 256 MiB of its figure before the flow run (after a first flow run in the process
has made the CUDA context and loaded the kernels).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import DeviceMemoryError, GPUResult, collect, execute, gpu_task

pytestmark = pytest.mark.gpu

ROWS = 12_500_000  # int64 and float64 columns: 200,000,000 bytes a table
LIMIT = 4_000_000_000
TABLES = 20
#: Bytes the driver's figure may stay above its figure before a flow run, once the flow call returns.
DRIVER_SLACK = 256 * 2**20


def driver_used() -> int:
    import rmm.mr

    free, total = rmm.mr.available_device_memory()
    return int(total - free)


def table(i: int) -> pl.LazyFrame:
    return pl.LazyFrame({"k": np.arange(ROWS, dtype=np.int64)}).with_columns(v=pl.lit(float(i)))


@gpu_task
def total(*parts: GPUResult) -> pl.LazyFrame:
    return pl.concat([p.lazy() for p in parts]).select(pl.col("v").sum(), pl.len())


def pipeline(spill: str):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd", device_memory_limit=LIMIT,
                                                            spill_results=spill)))
    def tables_under_a_limit():
        held = [execute(table(i), name=f"table-{i}") for i in range(TABLES)]
        sums = [collect(total(*held[i:i + 2])) for i in range(0, TABLES, 2)]
        session = get_engine_session()
        pinned = session.running_engine.pinned_pool(0).pool_size() if spill == "host" else 0
        return sums, session.summary(), pinned

    return tables_under_a_limit()


@pytest.fixture(scope="module")
def warm():
    """One flow run first: the CUDA context and the kernels stay for the process's life."""
    pipeline("host")


def test_results_past_the_limit_move_to_host_memory_and_equal_polars(warm, record_property):
    before = driver_used()
    sums, summary, pinned = pipeline("host")
    after = driver_used()
    for i, got in zip(range(0, TABLES, 2), sums):
        assert got.row(0) == ((2 * i + 1) * float(ROWS), 2 * ROWS)
    held = summary["held"]
    record_property("spills", held["spills"])
    record_property("driver_before_after", [before, after])
    assert held["limit"] == LIMIT and held["spills"]["results"] >= 1 and held["spills"]["back"] >= 1
    assert held["peak_held"] <= LIMIT
    record_property("pinned_pool_bytes", pinned)
    # The pinned pool grows by its own size from 1 GiB: at most about twice what moved out, not half its limit.
    assert held["spills"]["routes"].get("pinned") and pinned <= max(2 * held["spills"]["bytes"], 2**30), (
        f"pinned pool {pinned:,} bytes after {held['spills']}")
    assert summary["counts"]["released_unconsumed"] == 0
    assert after - before <= DRIVER_SLACK, f"driver: {before:,} bytes before, {after:,} after the flow run"


def test_with_spill_off_the_load_the_held_results_leave_no_room_for_fails_naming_them(warm):
    before = driver_used()
    with pytest.raises(DeviceMemoryError, match=r"(?s)device_memory_limit=4,000,000,000 bytes.*held budget of "
                       r"3,200,000,000.*'table-0' \([0-9,]+ bytes.*spill_results=\"host\""):
        pipeline("off")
    assert driver_used() - before <= DRIVER_SLACK


def test_a_result_past_the_limit_fails_as_out_of_memory_while_the_gpu_is_free(warm):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd", device_memory_limit=1_000_000_000)))
    def one_big_result():
        state = execute(pl.concat([table(i) for i in range(6)]), name="too-big", return_state=True)  # 1.2 GB
        with pytest.raises(DeviceMemoryError, match=r"(?s)ran out of device memory.*device_memory_limit"):
            state.result()
        return collect(execute(table(1), name="fits")).height  # the session stays usable

    before = driver_used()
    assert one_big_result() == ROWS
    after = driver_used()
    assert after - before <= DRIVER_SLACK, f"driver: {before:,} bytes before, {after:,} after the flow run"
