"""
Held results stay within a budget below the block's ``device_memory_limit``.

On the ``cpu`` backend the limit counts the host store's bytes the way the GPU backends' capped
memory resource counts device bytes: a result past it fails as out of memory, and before each
engine call the results the call does not read must fit the held budget (the limit less the
larger of 20 % of it and the largest partition). With ``spill_results="off"`` a call that does
not fit fails naming them, and they stay readable; with ``"host"`` the least recently produced
unread results move to host memory and come back when read, equal to what they were.
"""

from __future__ import annotations

import pickle

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from api_reads import events_of
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.blocks.memory import held_budget
from prefect_cudf_polars.tasks import (
    DeviceMemoryError, GPUResult, HostPersistenceError, ResultConsumedError, collect, execute, gpu_task)

ROWS = 100_000
TABLE_BYTES = 1_600_000  # two 8-byte columns of ROWS rows, as polars' estimated_size counts them
LIMIT = 6_000_000  # room for three tables, but a held budget of 4,400,000 bytes: two


def table(i: int) -> pl.LazyFrame:
    return pl.LazyFrame({"k": range(ROWS), "v": [float(i)] * ROWS})


@gpu_task
def total(*parts: GPUResult) -> pl.LazyFrame:
    return pl.concat([p.lazy() for p in parts]).select(pl.col("v").sum(), pl.len())


def block(spill: str) -> CudfPolarsEngine:
    return CudfPolarsEngine(backend="cpu", device_memory_limit=LIMIT, spill_results=spill)


def test_the_held_budget_leaves_a_fifth_of_the_limit_or_the_largest_partition():
    assert held_budget(10_000, 500) == 8_000
    assert held_budget(10_000, 3_000) == 7_000
    assert held_budget(LIMIT, TABLE_BYTES) == 4_400_000


def test_with_spill_off_a_call_the_held_results_leave_no_room_for_fails_naming_them_and_they_stay_readable():
    @flow(task_runner=CudfPolarsTaskRunner(block("off")))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(3)]
        refused = execute(table(3), name="table-3", return_state=True)
        with pytest.raises(DeviceMemoryError, match=r"(?s)device_memory_limit=6,000,000 bytes.*hold 4,800,000 "
                           r"bytes, over the held budget of 4,400,000.*'table-0' \(1,600,000 bytes.*'table-2'.*"
                           r"spill_results=\"host\""):
            refused.result()
        sums = collect(total(held[0], held[1])), collect(held[2])
        return sums, get_engine_session().summary()["held"]

    (two, third), held = pipeline()
    assert two.row(0) == (1.0 * ROWS, 2 * ROWS)
    assert_frame_equal(third, table(2).collect())
    assert held["limit"] == LIMIT and held["spills"]["results"] == 0
    assert held["peak_held"] == 3 * TABLE_BYTES
    assert held_partitions() == 0


def test_with_spill_host_unread_results_move_to_host_memory_and_back_and_equal_polars():
    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(5)]
        firsts = collect(total(held[0], held[1]))
        rest = collect(total(held[2], held[3], held[4]))
        return firsts, rest, get_engine_session().summary(), get_engine_session().flow_run_id

    firsts, rest, summary, flow_run_id = pipeline()
    assert firsts.row(0) == (1.0 * ROWS, 2 * ROWS)
    assert rest.row(0) == ((2.0 + 3.0 + 4.0) * ROWS, 3 * ROWS)
    held = summary["held"]
    assert held["spill_results"] == "host" and held["limit"] == LIMIT
    assert held["spills"]["results"] >= 3 and held["spills"]["bytes"] == held["spills"]["results"] * TABLE_BYTES
    assert held["spills"]["back"] >= 3
    assert held["peak_held"] <= held_budget(LIMIT, TABLE_BYTES)
    assert summary["counts"] == {"produced": 7, "consumed": 7, "released_unconsumed": 0}
    assert held_partitions() == 0
    name = "prefect_cudf_polars.result.moved"
    moved = [e for e in events_of(flow_run_id, expect={name: 6}) if e.event == name]
    assert {e.payload["to"] for e in moved} == {"host", "engine"}
    assert all(e.payload["bytes"] == TABLE_BYTES and e.payload["seconds"] >= 0 for e in moved)


def test_a_result_in_host_memory_keeps_every_rule_of_a_result():
    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(4)]
        moved = held[0]  # the least recently produced: in host memory now
        assert get_engine_session().summary()["held"]["spills"]["results"] >= 1
        with pytest.raises(HostPersistenceError, match="GPU result"):
            pickle.dumps(moved)
        first = collect(moved)
        with pytest.raises(ResultConsumedError, match="already"):
            collect(moved)
        return first

    assert_frame_equal(pipeline(), table(0).collect())
    assert held_partitions() == 0


def test_a_result_past_the_limit_fails_as_out_of_memory():
    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        big = pl.LazyFrame({"k": range(4 * ROWS), "v": [1.0] * (4 * ROWS)})  # 6,400,000 bytes
        state = execute(big, name="big", return_state=True)
        with pytest.raises(DeviceMemoryError, match=r"(?s)ran out of device memory.*device_memory_limit.*"
                           r"Exceeded memory limit.*6,400,000 bytes of device_memory_limit=6,000,000"):
            state.result()
        return collect(execute(table(1), name="small"))  # the session stays usable

    assert_frame_equal(pipeline(), table(1).collect())
    assert held_partitions() == 0
