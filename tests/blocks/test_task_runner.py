"""CudfPolarsTaskRunner: a session per flow run (and attempt), found from task threads."""

from __future__ import annotations

import threading

import polars as pl
import pytest
from prefect import flow, task

from conftest import read_run_logs
from prefect_cudf_polars.blocks import (
    CudfPolarsEngine,
    CudfPolarsTaskRunner,
    NoEngineSessionError,
    get_engine_session,
)
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import collect, execute


def test_tasks_in_threads_find_the_flow_runs_session(orders):
    seen = {}

    @task
    def where_am_i():
        session = get_engine_session()
        return session.id, threading.current_thread().name

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        futures = [where_am_i.submit() for _ in range(4)]
        seen["flow"] = get_engine_session().id
        return [f.result() for f in futures]

    results = pipeline()
    assert {sid for sid, _ in results} == {seen["flow"]}
    assert all(thread != threading.current_thread().name for _, thread in results)


def test_results_chain_and_are_released_when_the_flow_run_ends(orders):
    sessions = []

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        sessions.append(get_engine_session())
        big = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 50), name="big orders")
        execute(pl.scan_parquet(orders), name="left behind")
        by_customer = execute.submit(big.lazy().group_by("customer").agg(pl.col("amount").sum()))
        return collect(by_customer.result().lazy().sort("customer"))

    before = held_partitions()
    report = pipeline()
    expected = (
        pl.read_parquet(orders).filter(pl.col("amount") > 50)
        .group_by("customer").agg(pl.col("amount").sum()).sort("customer")
    )
    assert report.equals(expected)
    (session,) = sessions
    assert session.closed
    assert session.summary()["counts"] == {"produced": 3, "consumed": 2, "released_unconsumed": 1}
    assert held_partitions() == before


def test_each_flow_run_gets_its_own_session_from_duplicate():
    runner = CudfPolarsTaskRunner("some-saved-block", max_workers=3)
    copy = runner.duplicate()
    assert copy is not runner and copy.engine == "some-saved-block" and copy.max_workers == 3
    assert copy.session is None
    ids = []

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def one():
        ids.append(get_engine_session().id)

    one()
    one()
    assert len(set(ids)) == 2


def test_engine_by_saved_block_name():
    CudfPolarsEngine(backend="cpu").save("runner-by-name", overwrite=True)

    @flow(task_runner=CudfPolarsTaskRunner("runner-by-name"))
    def named():
        return get_engine_session().backend

    assert named() == "cpu"


def test_flow_retry_gets_a_fresh_session_and_releases_the_failed_attempts_results(orders):
    attempts = []

    @flow(retries=1, task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def flaky():
        session = get_engine_session()
        result = execute(pl.scan_parquet(orders))
        attempts.append((session, result))
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        return collect(result)

    df = flaky()
    assert df.height == 1000
    (s1, r1), (s2, _) = attempts
    assert s1 is not s2 and s1.closed and s2.closed
    assert r1.state == "released"


def test_session_start_and_end_lines_reach_the_flow_run_log():
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def logged():
        get_engine_session()

    state = logged(return_state=True)
    messages = read_run_logs(state.state_details.flow_run_id, expect="session ended")
    started = [m for m in messages if "engine session started" in m]
    assert started and "backend=cpu" in started[0] and "without a GPU" in started[0]
    assert any("engine session ended" in m and "results produced 0" in m for m in messages)


def test_no_session_means_a_clear_error_in_the_task():
    @flow
    def no_session():
        return execute(pl.LazyFrame({"a": [1]}))

    with pytest.raises(NoEngineSessionError, match="active for this flow run.*CudfPolarsTaskRunner"):
        no_session()


def test_runner_refuses_a_non_block_engine():
    with pytest.raises(TypeError, match="CudfPolarsEngine block or the name"):
        CudfPolarsTaskRunner(engine=42)
