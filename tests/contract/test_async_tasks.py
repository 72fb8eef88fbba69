"""
``async def`` GPU tasks, and ``execute``/``collect`` in async flows, on a real Prefect API.

An async ``gpu_task`` awaits the user's function for its LazyFrame, then awaits
the engine call: the flow's event loop keeps running while the engine works
(the engine's calls still run one at a time on the session's owner thread).
"""

from __future__ import annotations

import asyncio
import threading
import time

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task


def runner() -> CudfPolarsTaskRunner:
    return CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu"))


@gpu_task(name="async-big-orders")
async def big_orders(r: GPUResult) -> pl.LazyFrame:
    await asyncio.sleep(0)  # an async step may await before it builds its query
    return r.lazy().filter(pl.col("amount") > 50)


@gpu_task(name="async-per-customer", collect=True)
async def per_customer(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().group_by("customer").agg(pl.len()).sort("customer")


def expected(orders) -> pl.DataFrame:
    return (
        pl.scan_parquet(orders).filter(pl.col("amount") > 50)
        .group_by("customer").agg(pl.len()).sort("customer").collect()
    )


def test_async_gpu_tasks_chain_in_an_async_flow(orders):
    @flow(task_runner=runner())
    async def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        big = await big_orders(r)
        assert isinstance(big, GPUResult) and r.state == "consumed"
        return await per_customer(big)

    assert_frame_equal(asyncio.run(pipeline()), expected(orders))


def test_execute_and_collect_run_in_an_async_flow(orders):
    @flow(task_runner=runner())
    async def pipeline():
        r = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 50), name="orders")
        submitted = execute.submit(pl.scan_parquet(orders), name="submitted")
        height = collect(submitted.result()).height
        return collect(r.lazy().group_by("customer").agg(pl.len()).sort("customer")), height

    df, height = asyncio.run(pipeline())
    assert_frame_equal(df, expected(orders))
    assert height == 1000


def test_async_gpu_tasks_submitted_from_a_sync_flow(orders):
    """A sync flow runs async tasks through its task runner (Prefect: ``.submit()``)."""

    @flow(task_runner=runner())
    def pipeline():
        big = big_orders.submit(execute(pl.scan_parquet(orders))).result()
        return per_customer.submit(big).result()

    assert_frame_equal(pipeline(), expected(orders))


def test_awaiting_the_engine_call_does_not_block_the_event_loop(orders):
    """While the engine is busy (another call holds it for 1.5 s), the flow's loop keeps ticking."""
    busy_seconds = 1.5

    @flow(task_runner=runner())
    async def pipeline():
        session = get_engine_session()
        r = execute(pl.scan_parquet(orders), name="orders")
        held = threading.Event()

        def hold_the_engine():
            held.set()
            time.sleep(busy_seconds)

        busy = threading.Thread(target=session.run, args=(hold_the_engine,))
        busy.start()
        held.wait()
        busy_until = time.monotonic() + busy_seconds
        ticks: list[float] = []

        async def ticker():
            while time.monotonic() < busy_until + 0.3:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.05)

        async def step():
            big = await big_orders(r)
            return big, time.monotonic()

        (big, finished), _ = await asyncio.gather(step(), ticker())
        busy.join()
        return collect(big).height, ticks, finished, busy_until

    height, ticks, finished, busy_until = asyncio.run(pipeline())
    assert height == expected(orders)["len"].sum()
    assert finished >= busy_until - 0.05  # the engine call waited for the engine
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert max(gaps) < 0.5, f"the event loop stalled {max(gaps):.2f} s while the engine call waited"


@gpu_task(name="async-eager")
async def eager(r: GPUResult) -> pl.DataFrame:
    return r.lazy().collect()  # a mistake: the task must return the query, not run it


def test_an_async_gpu_task_returning_no_lazyframe_fails_and_frees_its_input(orders):
    seen = {}

    @flow(task_runner=runner())
    async def pipeline():
        seen["session"] = session = get_engine_session()
        r = execute(pl.scan_parquet(orders), name="orders")
        await eager(r)
        return session

    state = asyncio.run(pipeline(return_state=True))
    assert state.is_failed(), state
    with pytest.raises(TypeError, match="must return a polars LazyFrame"):
        state.result()
    session = seen["session"]
    assert session.live_results == ()
    assert session.summary()["memory"]["at_end"] == 0  # the claimed input was freed
