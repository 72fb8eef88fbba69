"""
A ``with block.session():`` that exits while task runs it is serving still run (cpu backend,
real Prefect API).

The session waits for the GPU task runs submitted inside it, bounded by the block's
``teardown_timeout``: a task run already in its engine call, and a chain submitted just
before the exit, both end Completed. A task run still working when the bound is spent gets
an error that names the session that ended, not the flow run (which goes on).
"""

from __future__ import annotations

import threading

import polars as pl
import pytest
from prefect import flow

from api_reads import final_task_run
from prefect_cudf_polars.blocks import CudfPolarsEngine, SessionError
from prefect_cudf_polars.tasks import collect, execute, gpu_task
from slow_queries import sleeping

#: Seconds the slow query sleeps inside its engine call.
SLOW_S = 2.0


def task_run_state(task_run_id):
    return final_task_run(task_run_id).state


def test_a_block_session_waits_for_a_task_run_in_its_engine_call(cpu_block, orders, unchecked_cpu_backend):
    started = threading.Event()

    @gpu_task
    def slow_orders(path: str) -> pl.LazyFrame:
        started.set()
        return sleeping(pl.scan_parquet(path), SLOW_S)

    @flow
    def exits_early():
        with cpu_block.session() as session:
            future = slow_orders.submit(str(orders))
            assert started.wait(60)
        # Prefect resolves futures in a flow's return value to states: return the id too.
        return session, future.task_run_id, future.wait() or future.state

    session, task_run_id, state = exits_early()
    assert state.is_completed(), state
    assert task_run_state(task_run_id).is_completed(), task_run_state(task_run_id)
    summary = session.summary()
    assert summary["counts"] == {"produced": 1, "consumed": 0, "released_unconsumed": 1}
    assert summary["teardown"] == "complete"
    assert state.result().state == "released"  # its session has ended since


def test_a_block_session_waits_for_a_chain_submitted_just_before_it_exits(cpu_block, orders):
    @flow
    def exits_at_once():
        with cpu_block.session() as session:
            produced = execute.submit(pl.scan_parquet(orders), name="produced")
            counted = collect.submit(produced)
        return session, [produced.task_run_id, counted.task_run_id], counted.result().height

    session, task_run_ids, rows = exits_at_once()
    assert rows == 1000
    assert all(task_run_state(i).is_completed() for i in task_run_ids), [task_run_state(i) for i in task_run_ids]
    assert session.summary()["counts"] == {"produced": 1, "consumed": 1, "released_unconsumed": 0}


def test_a_task_run_still_working_past_the_bound_gets_an_error_naming_the_ended_session(orders):
    block = CudfPolarsEngine(backend="cpu", teardown_timeout=1.0)
    go_on = threading.Event()

    @gpu_task
    def waits_for_the_test(path: str) -> pl.LazyFrame:
        go_on.wait(60)
        return pl.scan_parquet(path)

    @flow
    def exits_while_a_task_waits():
        with block.session() as session:
            future = waits_for_the_test.submit(str(orders))
        ended = session.closed
        go_on.set()
        state = future.wait() or future.state
        return session, ended, state, "still running"

    session, ended, state, after = exits_while_a_task_waits()
    assert ended and session.summary()["teardown"] == "complete"
    assert state.is_failed(), state
    with pytest.raises(SessionError, match=session.id) as raised:
        state.result()
    assert "flow run is over" not in str(raised.value), str(raised.value)
    assert after == "still running"  # the flow run itself went on
