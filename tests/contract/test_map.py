"""
``.map()`` of GPU tasks: results mapped, futures passed on, nothing leaked, runs named apart.

Each mapped task run gets its own name in the UI, as Prefect names its own
mapped runs (the task's run name, then ``-<n>``).
"""

from __future__ import annotations

import re

import polars as pl
from polars.testing import assert_frame_equal
from prefect import flow, unmapped

from api_reads import task_run_list
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task

PARTS = 4


@gpu_task(name="doubled")
def doubled(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().with_columns(pl.col("amount") * 2)


def part(orders, i: int) -> pl.LazyFrame:
    return pl.scan_parquet(orders).filter(pl.col("customer") == i)


def run_mapped(orders, *, name=None):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        session = get_engine_session()
        lfs = [part(orders, i) for i in range(PARTS)]
        executed = execute.map(lfs) if name is None else execute.map(lfs, name=unmapped(name))
        frames = collect.map(doubled.map(executed)).result()
        return frames, session

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    frames, session = state.result()
    return frames, session, [run.name for run in task_run_list(state.state_details.flow_run_id, expect=3 * PARTS)]


def assert_named_apart(names: list[str], base: str) -> None:
    """``PARTS`` runs named ``base`` or ``base-<n>``, no two alike."""
    mine = [n for n in names if re.fullmatch(rf"{re.escape(base)}(-\d+)?", n)]
    assert len(mine) == PARTS, (base, sorted(names))
    assert len(set(mine)) == PARTS, f"mapped runs share names: {sorted(mine)}"


def test_mapped_gpu_tasks_pass_futures_on_and_leak_nothing(orders):
    frames, session, _ = run_mapped(orders)
    for i, got in enumerate(frames):
        expected = part(orders, i).with_columns(pl.col("amount") * 2).collect()
        assert_frame_equal(got, expected)
    assert session.closed and session.live_results == ()
    assert session.summary()["counts"] == {
        "produced": 2 * PARTS, "consumed": 2 * PARTS, "released_unconsumed": 0,
    }


def test_mapped_task_runs_are_named_apart(orders):
    _, _, names = run_mapped(orders)
    assert_named_apart(names, "execute-query")
    assert_named_apart(names, "doubled")
    assert_named_apart(names, "collect-doubled")


def test_mapped_runs_with_a_given_result_name_are_named_apart(orders):
    _, _, names = run_mapped(orders, name="part")
    assert_named_apart(names, "part")
    assert_named_apart(names, "collect-doubled")
