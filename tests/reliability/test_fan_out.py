"""Fan-out: ``tee`` splits one result into N independent ones; the default error points to it."""

from __future__ import annotations

import polars as pl
import pytest
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import (
    CannotRecomputeError,
    GPUResult,
    ResultConsumedError,
    collect,
    execute,
    gpu_task,
    tee,
)
from reliability_fixtures import engine_block  # noqa: F401 (pytest fixtures)



@gpu_task
def per_customer(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().group_by("customer").agg(pl.col("amount").sum()).sort("customer")


@gpu_task
def top_orders(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().sort("amount", "id", descending=True).head(5)


def test_tee_feeds_independent_downstream_tasks(engine_block, orders):
    store_before = held_partitions()
    seen = {}

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def fan_out():
        big = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 50), name="big")
        a, b, c = tee(big, 3)
        seen["states"] = (big.state, a.state, b.state, c.state)
        seen["ids"] = {a.id, b.id, c.id, big.id}
        futures = [per_customer.submit(a), top_orders.submit(b)]
        return [collect(f.result()) for f in futures] + [collect(c)]

    by_customer, top, everything = fan_out()
    source = pl.read_parquet(orders).filter(pl.col("amount") > 50)
    assert by_customer.equals(source.group_by("customer").agg(pl.col("amount").sum()).sort("customer"))
    assert top.equals(source.sort("amount", "id", descending=True).head(5))
    assert everything.sort("id").equals(source.sort("id"))
    assert seen["states"] == ("consumed", "live", "live", "live")
    assert len(seen["ids"]) == 4
    assert held_partitions() == store_before


def test_tee_of_a_result_two_steps_down_a_chain(engine_block, orders):
    calls = []

    @gpu_task
    def spenders(r: GPUResult) -> pl.LazyFrame:
        calls.append("spenders")
        return r.lazy().group_by("customer").agg(pl.col("amount").sum())

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def chain():
        s = spenders(execute(pl.scan_parquet(orders)))
        a, b = tee(s, 2)
        return collect(a).sort("customer"), collect(b).sort("customer")

    a, b = chain()
    assert a.equals(b) and a.height == 7
    assert calls == ["spenders"]  # the copy is a copy of the partitions: nothing ran again


def test_tee_of_a_deferred_result_replays_its_step_for_each_copy(engine_block, orders):
    calls = []

    @gpu_task(defer=True)
    def spenders(r: GPUResult) -> pl.LazyFrame:
        calls.append("spenders")
        return r.lazy().group_by("customer").agg(pl.col("amount").sum())

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def chain():
        a, b = tee(spenders(execute(pl.scan_parquet(orders))), 2)
        return collect(a).sort("customer"), collect(b).sort("customer")

    a, b = chain()
    assert a.equals(b) and a.height == 7
    assert calls == ["spenders", "spenders"]  # a deferred copy holds a plan: the step was built again, from the scan


def test_default_consumed_error_points_to_tee(engine_block, orders):
    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def reads_twice():
        r = execute(pl.scan_parquet(orders))
        per_customer(r)
        top_orders(r)

    with pytest.raises(ResultConsumedError, match=r"tee\(result, 2\)"):
        reads_twice()


def test_a_self_join_in_one_task_and_a_join_of_two_copies_from_tee_both_run(cpu_block, orders):
    @gpu_task
    def self_join(r: GPUResult) -> pl.LazyFrame:
        return r.lazy().join(r.lazy(), on="id")

    @gpu_task
    def join_copies(a: GPUResult, b: GPUResult) -> pl.LazyFrame:
        return a.lazy().join(b.lazy(), on="id")

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def joins():
        a, b = tee(execute(pl.scan_parquet(orders)), 2)
        return collect(self_join(execute(pl.scan_parquet(orders)))).height, collect(join_copies(a, b)).height

    assert joins() == (1000, 1000)


def test_tee_refuses_an_unreplayable_deferred_result_and_loses_nothing(engine_block, orders):
    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def built_in_the_body():
        r = execute(pl.scan_parquet(orders))
        derived = execute(r.lazy().filter(pl.col("customer") == 3), defer=True)  # built outside a GPU task
        with pytest.raises(CannotRecomputeError, match=r"\.lazy\(\) frame built outside a GPU task") as info:
            tee(derived, 2)
        assert derived.state == "live"  # nothing claimed
        return info.value, collect(derived).height

    error, rows = built_in_the_body()
    assert rows == 143 and error.reason
    assert "still live and unread" in str(error)


def test_tee_copies_the_partitions_of_a_result_its_lineage_cannot_replay(engine_block, orders):
    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def built_in_the_body():
        r = execute(pl.scan_parquet(orders))
        derived = execute(r.lazy().filter(pl.col("customer") == 3))  # built outside a GPU task: no replay
        assert derived.replay_problem is not None
        a, b = tee(derived, 2)
        return collect(a), collect(b), derived.state

    a, b, state = built_in_the_body()
    expected = pl.read_parquet(orders).filter(pl.col("customer") == 3)
    assert a.equals(expected) and b.equals(expected) and state == "consumed"


def test_tee_whose_replay_fails_keeps_the_original(engine_block, tmp_path):
    path = tmp_path / "once.parquet"
    pl.DataFrame({"x": [1, 2, 3]}).write_parquet(path)
    store_before = held_partitions()

    @gpu_task(defer=True)  # a deferred result's copies are its step built again: the scan too
    def loaded() -> pl.LazyFrame:
        return pl.scan_parquet(path)

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def file_gone():
        r = loaded()
        path.unlink()  # the replay cannot scan it again
        with pytest.raises(FileNotFoundError, match="No such file or directory"):
            tee(r, 2)
        state = r.state
        r.release()
        return state, get_engine_session().counts

    state, counts = file_gone()
    assert state == "live" and counts["produced"] == 1 and counts["released_unconsumed"] == 1
    assert held_partitions() == store_before


def test_tee_whose_later_replay_fails_releases_the_copies_already_made(cpu_block):
    calls = []

    @gpu_task(defer=True)  # a deferred result's copies are its step built again
    def third_call_fails(n: int) -> pl.LazyFrame:
        calls.append(n)
        if len(calls) == 3:
            raise OSError("the source is gone on the third build")
        return pl.LazyFrame({"x": list(range(n))})

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def split_three():
        r = third_call_fails(4)
        with pytest.raises(OSError, match="gone on the third build"):
            tee(r, 3)  # the first copy is made, the second fails
        session = get_engine_session()
        assert session.live_results == (r,)  # the first copy was released, not left for the session's end
        assert session.counts["produced"] == 2 and session.counts["released_unconsumed"] == 1
        assert r.state == "live"
        return collect(r).height

    assert split_three() == 4
    assert len(calls) == 3


def test_tee_argument_checks(engine_block, orders):
    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def bad():
        r = execute(pl.scan_parquet(orders))
        with pytest.raises(ValueError, match="at least 1"):
            tee(r, 0)
        with pytest.raises(TypeError, match="must be an int"):
            tee(r, 2.0)
        with pytest.raises(TypeError, match="tee takes a GPUResult, not LazyFrame"):
            tee(pl.scan_parquet(orders), 2)
        (only,) = tee(r, 1)
        return collect(only).height

    assert bad() == 1000
