"""
Held results that move to pinned host memory and back on a real GPU (``spmd``), and ``tee``'s device copies.

A flow holds forty 50 MB results unread under ``device_memory_limit=1 GB``: twice its limit.
The oldest unread ones move out by the pinned route (each partition packed into the engine's
pinned pool, back into its own store slot when read), every one reads back equal to polars' CPU
engine, and while the flow runs the CUDA driver's used device memory (``cudaMemGetInfo``,
sampled every 5 ms) stays within the limit above its figure before the flow run (the process's
CUDA context, made by a first flow run). A query whose 400 MB result does not fit beside 700 MB
of held tables under that limit runs out of memory with spill off; with spill host the engine's
memory resource asks for room as it runs and the oldest tables move out. A move the pinned pool has no free
block for, near ``host_spill_limit``, goes by the host frame route; on a running query's demand it is not made (at most
one WARNING per engine call), and the query goes on with the room it finds or fails as out of memory; either way no
partition stays on the device once read. ``tee`` of a loaded table makes its copies as device
copies of the partitions: nothing is produced again, and each copy reads equal to polars.
"""

from __future__ import annotations

import threading

import numpy as np
import polars as pl
import pytest
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import DeviceMemoryError, GPUResult, collect, execute, gpu_task, tee

pytestmark = pytest.mark.gpu

ROWS = 3_125_000  # int64 and float64 columns: 50,000,000 bytes a table
LIMIT = 1_000_000_000
TABLES = 40  # 2 GB held: twice the limit
#: Bytes the driver's figure may pass the limit by (allocations outside rmm: streams, kernels' own).
DRIVER_SLACK = 256 * 2**20


def driver_used() -> int:
    import rmm.mr

    free, total = rmm.mr.available_device_memory()
    return int(total - free)


class PeakSampler:
    """The CUDA driver's largest used device memory while the ``with`` block runs (sampled every 5 ms)."""

    def __enter__(self) -> PeakSampler:
        self.peak, self._stop = driver_used(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, driver_used())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def table(i: int, rows: int = ROWS) -> pl.LazyFrame:
    return pl.LazyFrame({"k": np.arange(rows, dtype=np.int64)}).with_columns(v=pl.lit(float(i)))


@gpu_task
def total(part: GPUResult) -> pl.LazyFrame:
    return part.lazy().select(pl.col("v").sum(), pl.col("k").sum(), pl.len())


def held_twice_the_limit():
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd", device_memory_limit=LIMIT,
                                                            spill_results="host")))
    def tables_under_a_limit():
        held = [execute(table(i), name=f"table-{i}") for i in range(TABLES)]
        sums = [collect(total(r)) for r in held]
        return sums, get_engine_session().summary()

    return tables_under_a_limit()


@pytest.fixture(scope="module")
def warm():
    """One small flow run first: the CUDA context and the kernels stay for the process's life."""

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd")))
    def one_table():
        return collect(total(execute(table(0), name="table-0"))).row(0)

    assert one_table() == (0.0, ROWS * (ROWS - 1) // 2, ROWS)


def test_a_flow_holding_twice_its_limit_reads_every_result_back_equal_to_polars_through_pinned_memory(warm):
    before = driver_used()
    with PeakSampler() as sampled:
        sums, summary = held_twice_the_limit()
    for i, got in enumerate(sums):
        assert got.row(0) == (i * float(ROWS), ROWS * (ROWS - 1) // 2, ROWS), f"table-{i}"
    spills = summary["held"]["spills"]
    assert spills["results"] >= TABLES // 2 and spills["routes"] == {"pinned": spills["results"]}, spills
    assert spills["back"] == spills["results"] and spills["back_seconds"] > 0
    assert summary["counts"]["released_unconsumed"] == 0
    assert sampled.peak - before <= LIMIT + DRIVER_SLACK, (
        f"driver: {before:,} bytes before the flow run, a peak of {sampled.peak:,} during it")
    assert driver_used() - before <= DRIVER_SLACK


HELD = 14  # 700 MB held: within the held budget of 800 MB, so nothing moves before the next call
BIG_ROWS = 25_000_000  # two int64 columns: a 400 MB result, which does not fit beside what is held


@gpu_task
def big_sums(big: GPUResult) -> pl.LazyFrame:
    return big.lazy().select(pl.col("k").sum(), pl.col("d").sum(), pl.len())


@pytest.mark.parametrize("spill", ["off", "host"])
def test_a_query_that_needs_the_room_held_results_take_gets_it_on_demand_with_spill_host(warm, spill):
    """With spill off the big query runs out of memory and the held tables stay readable; with spill host the
    engine's memory resource asks the ledger for room as the query runs, and every result equals polars."""
    big = pl.LazyFrame({"k": np.arange(BIG_ROWS, dtype=np.int64)}).with_columns(d=pl.col("k") * 2)

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd", device_memory_limit=LIMIT,
                                                            spill_results=spill)))
    def room_on_demand():
        held = [execute(table(i), name=f"table-{i}") for i in range(HELD)]
        state = execute(big, name="big", return_state=True)
        if spill == "off":
            with pytest.raises(DeviceMemoryError, match="ran out of device memory"):
                state.result()
            got = None
        else:
            got = collect(big_sums(state.result())).row(0)
        return got, [collect(total(r)).row(0) for r in held], get_engine_session().summary()

    before = driver_used()
    with PeakSampler() as sampled:
        got, sums, summary = room_on_demand()
    assert sums == [(i * float(ROWS), ROWS * (ROWS - 1) // 2, ROWS) for i in range(HELD)]
    spills = summary["held"]["spills"]
    if spill == "off":
        assert got is None and spills["results"] == 0
    else:
        k = BIG_ROWS * (BIG_ROWS - 1) // 2
        assert got == (k, 2 * k, BIG_ROWS)
        assert spills["on_demand"] >= 1 and spills["routes"] == {"pinned": spills["results"]}, spills
        assert spills["back"] == spills["results"]
    assert summary["counts"]["released_unconsumed"] == 0
    assert sampled.peak - before <= LIMIT + DRIVER_SLACK, (
        f"driver: {before:,} bytes before the flow run, a peak of {sampled.peak:,} during it")


FRAGMENT_ROWS = 25_000_000  # int64 and float64 columns: a 400,000,000-byte result
FRAGMENT_LIMIT = 20_000_000_000  # a held budget of 16 GB keeps forty and leaves 4 GB to make the next one in
FRAGMENT_TABLES = 44  # four move out as they are made: three fill the pool's two blocks, one fits neither


def test_a_move_the_pinned_pool_has_no_free_block_for_goes_by_the_host_frame_route_and_reads_back_equal(warm):
    """Under ``host_spill_limit`` of 1.5 GiB the pinned pool's blocks are 1 GiB and 512 MiB: they hold three
    400 MB results, and the fourth, which the host budget admits (410 MB left), fits no block's free tail and no
    growth under the limit: it moves by the host frame route, and every result reads back equal to polars.
    ``spill_device_limit="100%"`` keeps rapidsmpf's spill manager from asking for room below the limit, so every
    move is the ledger's own after an engine call."""
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(
        backend="spmd", device_memory_limit=FRAGMENT_LIMIT, spill_device_limit="100%", spill_results="host",
        host_spill_limit=1_610_612_736)))
    def fragmented_pool():
        held = [execute(table(i, FRAGMENT_ROWS), name=f"big-{i}") for i in range(FRAGMENT_TABLES)]
        return [collect(total(r)).row(0) for r in held], get_engine_session().summary()["held"]["spills"]

    before = driver_used()
    sums, spills = fragmented_pool()
    assert driver_used() - before <= DRIVER_SLACK  # the host frame route leaves nothing on the device
    k = FRAGMENT_ROWS * (FRAGMENT_ROWS - 1) // 2
    assert sums == [(i * float(FRAGMENT_ROWS), k, FRAGMENT_ROWS) for i in range(FRAGMENT_TABLES)]
    routes = spills["routes"]  # the pool's two blocks take three at once; the one neither fits goes by the frame route
    assert routes.get("pinned", 0) >= 3 and routes.get("host frame", 0) >= 1 and spills["on_demand"] == 0, spills
    assert spills["back"] == spills["results"], spills


@pytest.mark.timeout(300)
def test_a_pinned_pool_that_cannot_take_a_result_on_demand_ends_the_flow_run_with_one_warning_per_call(warm, caplog):
    """Under a 6 GB limit, making a 400 MB table takes more room than the held budget leaves, so queries ask for
    room as they run; under ``host_spill_limit`` of 1.5 GiB the pinned pool takes three results, then none. A
    call that finds no room fails with ``DeviceMemoryError``; every other result reads back equal to polars, the
    ledger logs at most one such WARNING per engine call (not one per periodic spill check), the flow run ends,
    and the driver's used memory comes back, although pytest's ``caplog`` keeps every WARNING's record (a record
    holds the failed move's text, not its traceback, whose frames hold the running engine and its pool)."""
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd", device_memory_limit=6_000_000_000,
                                                            spill_results="host", host_spill_limit=1_610_612_736)))
    def pool_full_on_demand():
        states = [execute(table(i, FRAGMENT_ROWS), name=f"big-{i}", return_state=True) for i in range(16)]
        outcomes = [state.result(raise_on_failure=False) for state in states]
        sums = {i: collect(total(r)).row(0) for i, r in enumerate(outcomes) if isinstance(r, GPUResult)}
        return [type(r).__name__ for r in outcomes], sums, get_engine_session().summary()["held"]["spills"]

    before = driver_used()
    kinds, sums, spills = pool_full_on_demand()
    assert driver_used() - before <= DRIVER_SLACK
    assert set(kinds) <= {"GPUResult", "DeviceMemoryError"}, kinds
    k = FRAGMENT_ROWS * (FRAGMENT_ROWS - 1) // 2
    assert sums == {i: (i * float(FRAGMENT_ROWS), k, FRAGMENT_ROWS) for i, kind in enumerate(kinds)
                    if kind == "GPUResult"}
    warned = [r for r in caplog.records if "could not move held result" in r.getMessage()]
    assert len(warned) <= len(kinds) + 2 * len(sums), len(warned)  # engine calls: 16 tables, a sum and collect each
    assert spills["back"] == spills["results"] and spills["routes"].get("pinned", 0) >= 3, spills


def test_tee_copies_a_loaded_table_on_the_device_and_each_copy_reads_equal_to_polars(tmp_path):
    path = tmp_path / "table.parquet"
    table(3).collect().write_parquet(path)
    built = []

    @gpu_task
    def loaded() -> pl.LazyFrame:
        built.append(1)
        return pl.scan_parquet(path)

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd", raise_on_fail=True)))
    def split():
        copies = tee(loaded(), 3)
        return [collect(total(c)).row(0) for c in copies], get_engine_session().counts

    rows, counts = split()
    assert rows == [(3.0 * ROWS, ROWS * (ROWS - 1) // 2, ROWS)] * 3
    assert built == [1]  # the copies are device copies: the table was loaded once
    # The table, its 3 copies (the first takes over its partitions) and 3 sums; every one read.
    assert counts["produced"] == 7 and counts["consumed"] == 7 and counts["released_unconsumed"] == 0
