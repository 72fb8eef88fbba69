"""execute, collect and gpu_task on a real local Prefect API with the cpu backend."""

from __future__ import annotations

import polars as pl
import pytest
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import (
    GPUResult,
    ResultConsumedError,
    ResultReleasedError,
    collect,
    execute,
    gpu_task,
    tee,
)

RUNNER = lambda: CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu"))  # noqa: E731


@gpu_task
def big_spenders(orders_result: GPUResult) -> pl.LazyFrame:
    return orders_result.lazy().group_by("customer").agg(pl.col("amount").sum()).filter(pl.col("amount") > 6700)


@gpu_task(collect=True, name="ranked", tags=["report"])
def ranked(spenders: GPUResult) -> pl.LazyFrame:
    return spenders.lazy().sort("amount", descending=True)


def test_three_step_chain_equals_polars_on_the_cpu(orders):
    @flow(task_runner=RUNNER())
    def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        s = big_spenders(r)
        assert isinstance(s, GPUResult) and s.name == "big_spenders"
        assert r.state == "consumed"
        return ranked(s)

    expected = (
        pl.read_parquet(orders).group_by("customer").agg(pl.col("amount").sum())
        .filter(pl.col("amount") > 6700).sort("amount", descending=True)
    )
    assert pipeline().equals(expected)
    assert ranked.tags == {"report"} and ranked.name == "ranked"


def test_gpu_task_accepts_prefect_options_and_retries(orders):
    calls = []

    @gpu_task(retries=2, retry_delay_seconds=0)
    def flaky(path: str) -> pl.LazyFrame:
        calls.append(1)
        if len(calls) < 3:
            raise OSError("transient")
        return pl.scan_parquet(path)

    @flow(task_runner=RUNNER())
    def pipeline():
        return collect(flaky(str(orders))).height

    assert pipeline() == 1000 and len(calls) == 3
    assert flaky.retries == 2


def test_non_lazyframe_inputs_and_returns_get_clear_errors(orders):
    @gpu_task
    def eager(path: str):
        return pl.read_parquet(path)

    @flow(task_runner=RUNNER())
    def bad_return():
        return eager(str(orders))

    with pytest.raises(TypeError, match="must return a polars LazyFrame.*returned DataFrame"):
        bad_return()

    @flow(task_runner=RUNNER())
    def bad_input():
        return execute(pl.read_parquet(orders))

    with pytest.raises(TypeError, match=r"LazyFrame or a GPUResult, not DataFrame; call .lazy\(\) on the DataFrame"):
        bad_input()


def test_a_self_join_on_one_result_runs(orders):
    @gpu_task
    def self_join(r: GPUResult) -> pl.LazyFrame:
        lf = r.lazy()
        return lf.join(lf, on="id")

    @flow(task_runner=RUNNER())
    def pipeline():
        return collect(self_join(execute(pl.scan_parquet(orders))))

    joined = pipeline()
    assert joined.height == 1000 and joined["amount"].equals(joined["amount_right"])


def test_a_failing_step_frees_the_input_it_claimed(orders):
    before = held_partitions()
    seen = {}

    @gpu_task
    def breaks(r: GPUResult) -> pl.LazyFrame:
        r.lazy()
        seen["store"] = held_partitions()
        raise ValueError("bug in the user's step")

    @flow(task_runner=RUNNER())
    def pipeline():
        r = execute(pl.scan_parquet(orders))
        try:
            breaks(r)
        except ValueError:
            pass
        get_engine_session().run(lambda: None)  # the free is queued on the owner thread: let it run first
        seen["after"] = held_partitions()
        return r.state

    assert pipeline() == "consumed"
    assert seen["store"] == before + 1 and seen["after"] == before


def test_a_consumed_input_fails_before_the_users_function_runs(orders):
    ran = []

    @gpu_task
    def step(r: GPUResult) -> pl.LazyFrame:
        ran.append(1)
        return r.lazy()

    @flow(task_runner=RUNNER())
    def pipeline():
        r = execute(pl.scan_parquet(orders))
        step(r)
        step(r)

    with pytest.raises(ResultConsumedError, match="a GPU result is read once"):
        pipeline()
    assert len(ran) == 1


def test_gpu_task_in_a_flow_with_block_session_in_the_body(orders):
    @flow
    def pipeline():
        with CudfPolarsEngine(backend="cpu").session() as session:
            r = execute(pl.scan_parquet(orders))
            out = ranked(big_spenders(r))
            return out.height, session

    height, session = pipeline()
    assert height > 0 and session.closed and session.counts["produced"] == 2


def test_reading_a_result_returned_from_its_flow_says_it_was_released(orders):
    @flow(task_runner=RUNNER())
    def leaks():
        return execute(pl.scan_parquet(orders), name="orders")

    r = leaks()
    assert isinstance(r, GPUResult) and r.state == "released"
    released = r"(?s)GPUResult 'orders' .* was released when its engine session ended.*collect it inside the flow run"
    # After the flow run, with no session anywhere: the result is named, not the session.
    with pytest.raises(ResultReleasedError, match=released):
        collect(r)
    with pytest.raises(ResultReleasedError, match=released):
        execute(r)
    with pytest.raises(ResultReleasedError, match=released):
        big_spenders(r)
    with pytest.raises(ResultReleasedError, match=released):
        tee(r, 2)

    # Inside another flow run with its own session: the same, and that run fails with it.
    @flow(task_runner=RUNNER())
    def reads_it_later():
        return collect(r)

    with pytest.raises(ResultReleasedError, match=released):
        reads_it_later()


def test_one_gpu_task_decorator_names_every_function_it_decorates(orders):
    step = gpu_task(name="step", retries=1)

    @step
    def first(path: str) -> pl.LazyFrame:
        return pl.scan_parquet(path)

    @step
    def second(r: GPUResult) -> pl.LazyFrame:
        return r.lazy().select(pl.len())

    assert (first.name, second.name) == ("step", "step")
    assert (first.retries, second.retries) == (1, 1)

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        return collect(second(first(str(orders)))), get_engine_session().summary()["counts"]

    counted, counts = pipeline()
    assert counted.item() == 1000
    assert counts == {"produced": 2, "consumed": 2, "released_unconsumed": 0}


def test_a_task_that_lost_the_race_for_a_result_leaves_the_winners_read_alone(orders):
    """Two task runs get one result; the one whose claim comes second fails, and the first still reads it all."""
    import threading

    checked, claimed, refused = threading.Event(), threading.Event(), threading.Event()

    @gpu_task(name="first")
    def first(r: GPUResult) -> pl.LazyFrame:
        assert checked.wait(60)  # both task runs found the result live
        lf = r.lazy()
        claimed.set()
        assert refused.wait(60)  # the other task run has failed (and cleaned up) before this one runs
        return lf.select(pl.len())

    @gpu_task(name="second")
    def second(r: GPUResult) -> pl.LazyFrame:
        checked.set()
        assert claimed.wait(60)
        try:
            return r.lazy().select(pl.len())
        finally:
            refused.set()

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        a, b = first.submit(r), second.submit(r)
        return collect(a.result()).item(), b.wait() or b.state

    rows, lost = pipeline()
    assert rows == 1000
    assert lost.is_failed()
    with pytest.raises(ResultConsumedError, match="already consumed by task run 'first"):
        lost.result()
