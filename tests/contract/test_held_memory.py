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

from api_reads import artifacts_of, events_of
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.blocks.memory import held_budget, over_budget
from prefect_cudf_polars.tasks import (
    DeviceMemoryError, GPUResult, HostPersistenceError, ResultConsumedError, collect, execute, gpu_task, tee)

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


def test_a_move_host_memory_cannot_take_fails_naming_both_limits_and_the_results_stay_readable():
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu", device_memory_limit=LIMIT,
                                                            spill_results="host", host_spill_limit=2_000_000)))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(4)]  # table-0 moves out: host memory is full
        refused = execute(table(4), name="table-4", return_state=True)
        with pytest.raises(DeviceMemoryError, match=r"(?s)device_memory_limit=6,000,000 bytes.*host memory cannot "
                           r"take them: results moved out already hold 1,600,000 bytes of host_spill_limit=2,000,000 "
                           r"bytes.*'table-1' \(1,600,000 bytes.*Raise host_spill_limit or device_memory_limit"):
            refused.result()
        sums = [collect(total(held[i])) for i in (1, 2, 3, 0)]  # the ones on the engine first: each call fits
        return sums, get_engine_session().summary()["held"]

    sums, held = pipeline()
    assert [s.row(0) for s in sums] == [(float(i) * ROWS, ROWS) for i in (1, 2, 3, 0)]
    assert held["spills"]["results"] == 1 and held["spills"]["routes"] == {"host frame": 1}
    assert held_partitions() == 0


def test_with_spill_host_unread_results_move_to_host_memory_and_back_and_equal_polars():
    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(6)]
        sums = [collect(total(held[i], held[i + 1])) for i in range(0, 6, 2)]
        return sums, get_engine_session().summary(), get_engine_session().flow_run_id

    sums, summary, flow_run_id = pipeline()
    assert [s.row(0) for s in sums] == [((2 * i + 1) * float(ROWS), 2 * ROWS) for i in range(0, 6, 2)]
    held = summary["held"]
    assert held["spill_results"] == "host" and held["limit"] == LIMIT
    assert held["spills"]["results"] >= 4 and held["spills"]["bytes"] == held["spills"]["results"] * TABLE_BYTES
    assert held["spills"]["back"] >= 4 and held["spills"]["back_bytes"] == held["spills"]["back"] * TABLE_BYTES
    assert held["peak_held"] <= held_budget(LIMIT, TABLE_BYTES) + TABLE_BYTES  # the budget, and a new result
    assert summary["counts"] == {"produced": 9, "consumed": 9, "released_unconsumed": 0}
    assert held_partitions() == 0
    name = "prefect_cudf_polars.result.moved"
    every_move = held["spills"]["results"] + held["spills"]["back"]  # one event each
    moved = [e for e in events_of(flow_run_id, expect={name: every_move}) if e.event == name]
    assert len(moved) == every_move
    assert {e.payload["to"] for e in moved} == {"host", "engine"}
    assert all(e.payload["bytes"] == TABLE_BYTES for e in moved)
    assert all(e.payload["seconds"] >= 0 for e in moved if e.payload["to"] == "host")


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


@pytest.mark.parametrize("spill", ["off", "host"])
def test_a_query_whose_result_does_not_fit_beside_the_held_results_gets_room_on_demand_with_spill_host(spill):
    """Two tables held are within the held budget, but a 3.2 MB result does not fit beside them: with spill
    off it fails as out of memory; with spill host the engine asks for room and the oldest table moves out."""
    big = pl.LazyFrame({"k": range(2 * ROWS), "v": [1.0] * (2 * ROWS)})  # 3,200,000 bytes

    @flow(task_runner=CudfPolarsTaskRunner(block(spill)))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(2)]
        state = execute(big, name="big", return_state=True)
        if spill == "off":
            with pytest.raises(DeviceMemoryError, match=r"(?s)ran out of device memory.*6,400,000 bytes of "
                               r"device_memory_limit=6,000,000"):
                state.result()
            return None, [collect(r) for r in held], get_engine_session().summary()["held"]
        return collect(state.result()), [collect(r) for r in held], get_engine_session().summary()["held"]

    state = pipeline(return_state=True)
    got_big, tables, held = state.result()
    for i, got in enumerate(tables):
        assert_frame_equal(got, table(i).collect())
    spills = held["spills"]
    if spill == "off":
        assert got_big is None and spills["results"] == 0
    else:
        assert_frame_equal(got_big, big.collect())
        # table-0 moves out while the query runs; after it, the held budget moves table-1 too
        assert spills["on_demand"] == 1 and spills["results"] == spills["back"] == 2, spills
        [summary] = artifacts_of(flow_run_id=state.state_details.flow_run_id)  # the session's summary
        assert "1 on a running query's demand" in summary.data, summary.data
    assert held_partitions() == 0


def test_a_query_host_memory_cannot_make_room_for_fails_as_out_of_memory_and_the_held_results_stay_readable():
    """On demand, a move goes only where host_spill_limit leaves room: with none, nothing moves and the result
    that does not fit fails as out of memory."""
    big = pl.LazyFrame({"k": range(2 * ROWS), "v": [1.0] * (2 * ROWS)})  # 3,200,000 bytes

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu", device_memory_limit=LIMIT,
                                                            spill_results="host", host_spill_limit=1_100_000)))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(2)]
        with pytest.raises(DeviceMemoryError, match=r"(?s)ran out of device memory.*6,400,000 bytes of "
                           r"device_memory_limit=6,000,000"):
            execute(big, name="big")
        return [collect(r) for r in held], get_engine_session().summary()["held"]["spills"]

    tables, spills = pipeline()
    for i, got in enumerate(tables):
        assert_frame_equal(got, table(i).collect())
    assert spills["results"] == spills["on_demand"] == 0
    assert held_partitions() == 0


def test_concurrent_readers_under_spill_host_each_move_a_result_once_and_equal_polars():
    """Twelve tables loaded, most moved to host memory; six readers of two at once: every move counted once."""

    @gpu_task
    def pair_total(a: GPUResult, b: GPUResult) -> pl.LazyFrame:
        return pl.concat([a.lazy(), b.lazy()]).select(pl.col("v").sum(), pl.len())

    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        loads = [execute(table(i), name=f"table-{i}") for i in range(12)]
        pairs = [pair_total.submit(loads[i], loads[i + 1]) for i in range(10, -1, -2)]  # newest first
        sums = [collect(p.result()) for p in pairs]
        return sums, get_engine_session().summary()

    sums, summary = pipeline()
    assert [s.row(0) for s in sums] == [((2 * i + 1) * float(ROWS), 2 * ROWS) for i in range(10, -1, -2)]
    spills = summary["held"]["spills"]
    assert spills["results"] >= 9
    assert spills["bytes"] == spills["results"] * TABLE_BYTES and spills["back_bytes"] == spills["back"] * TABLE_BYTES
    assert spills["back"] <= spills["results"]  # a result comes back at most once per move
    assert summary["counts"]["released_unconsumed"] == 0
    assert held_partitions() == 0


def test_a_tee_of_a_result_in_host_memory_comes_back_as_the_copy():
    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(4)]  # table-0 moves to host memory
        first, second = tee(held[0], 2)
        out = collect(first), collect(second)
        return out, first.id, get_engine_session().flow_run_id

    (first, second), first_id, flow_run_id = pipeline()
    assert_frame_equal(first, table(0).collect())
    assert_frame_equal(second, table(0).collect())
    name = "prefect_cudf_polars.result.moved"
    # table-0, table-1 and table-2 move out as the next table is made; then the first copy comes back
    back = [e for e in events_of(flow_run_id, expect={name: 4}) if e.event == name and e.payload["to"] == "engine"]
    assert [e.resource.id for e in back] == [f"prefect-cudf-polars.result.{first_id}"]


def test_a_result_over_half_the_limit_stays_readable_with_spill_host():
    """A result the budget alone cannot hold is not moved when produced, and other results make room for it."""
    big = pl.LazyFrame({"k": range(2 * ROWS), "v": [1.0] * (2 * ROWS)})  # 3,200,000 bytes: over the budget left

    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        first = execute(table(0), name="table-0")
        large = execute(big, name="big")
        return collect(large), collect(first)

    got_big, got_first = pipeline()
    assert_frame_equal(got_big, big.collect())
    assert_frame_equal(got_first, table(0).collect())
    assert held_partitions() == 0


def test_a_deferred_step_over_a_result_in_host_memory_reads_it_back_in_its_readers_call():
    @gpu_task(defer=True)
    def doubled(r: GPUResult) -> pl.LazyFrame:
        return r.lazy().with_columns(pl.col("v") * 2)

    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(4)]  # table-1 in host memory
        out = collect(total(doubled(held[1])))
        return out, get_engine_session().summary()["held"]["spills"]

    out, spills = pipeline()
    assert out.row(0) == (2.0 * ROWS, ROWS)
    assert spills["back"] >= 1 and spills["back_bytes"] == spills["back"] * TABLE_BYTES
    assert held_partitions() == 0


def test_a_frame_a_query_already_read_is_refused_again_whether_the_result_moved_or_not():
    @flow(task_runner=CudfPolarsTaskRunner(block("host")))
    def pipeline():
        held = [execute(table(i), name=f"table-{i}") for i in range(3)]  # table-0 in host memory
        for result in (held[0], held[2]):
            frame = result.lazy()
            assert_frame_equal(collect(frame), table(int(result.name[-1])).collect())
            with pytest.raises(ResultConsumedError, match=rf"GPUResult '{result.name}' .* was already"):
                collect(frame)
        return get_engine_session().summary()["held"]["spills"]

    assert pipeline()["results"] >= 1
    assert held_partitions() == 0


def big_table(i: int) -> pl.LazyFrame:
    """Two 8-byte columns of 500,000 rows: 8,000,000 bytes."""
    return pl.LazyFrame({"k": range(5 * ROWS), "v": [float(i)] * (5 * ROWS)})


@pytest.mark.parametrize("spill", ["host", "off"])
def test_a_subflow_on_its_parents_block_keeps_the_parents_held_results_in_the_same_ledger(spill):
    """One engine host, one ledger: the parent's unread result is moved for the subflow's calls, or named."""
    parent_block = CudfPolarsEngine(backend="cpu", device_memory_limit=20_000_000, spill_results=spill)

    @flow(flow_run_name="child", task_runner=CudfPolarsTaskRunner(parent_block.model_copy()))
    def child() -> tuple:
        made = [execute(big_table(i), name=f"child-{i}") for i in (1, 2)]
        return collect(total(*made)).row(0), get_engine_session().summary()["held"]

    @flow(flow_run_name="parent", task_runner=CudfPolarsTaskRunner(parent_block))
    def parent() -> tuple:
        kept = execute(big_table(0), name="parent-table")
        state = child(return_state=True)
        return state, collect(kept), get_engine_session().summary()["held"]

    state, kept, held = parent()
    assert_frame_equal(kept, big_table(0).collect())
    if spill == "host":
        sums, child_held = state.result()
        assert sums == (3.0 * 5 * ROWS, 10 * ROWS)
        assert held["spills"]["results"] >= 1 and held["spills"]["back"] >= 1  # the parent's result moved, and back
        assert child_held["spills"]["results"] >= 1 and child_held["limit"] == held["limit"] == 20_000_000
    else:
        with pytest.raises(DeviceMemoryError, match=r"(?s)hold 16,000,000 bytes.*'parent-table' \(8,000,000 bytes, "
                           r"from task run 'parent-table'.*'child-1'"):
            state.result()
        assert held["spills"]["results"] == 0
    assert held_partitions() == 0


def test_each_rank_keeps_its_own_budget_so_a_skewed_rank_is_over_where_the_sum_fits():
    # Two ranks of 10,000 bytes each: a 9,000-byte partition on rank 0 leaves 1,000 bytes held there,
    # though the 9,500 bytes held over both ranks would fit twice the budget.
    assert over_budget(10_000, [9_000, 500], [1_000, 500]) == [(0, 9_000, 8_000)]
    assert over_budget(10_000, [8_000, 8_000], [1_000, 1_000]) == []
    assert over_budget(10_000, [7_500, 100], [3_000, 100]) == [(0, 7_500, 7_000)]
