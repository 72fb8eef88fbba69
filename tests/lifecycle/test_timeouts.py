"""
``timeout_seconds`` on a GPU task (real Prefect API; cpu backend, and spmd marked ``gpu``).

What a timed-out GPU task does:

* its task run ends ``TimedOut`` at its timeout: its thread stops waiting for the engine.
  The engine call itself, on the session's owner thread, cannot be interrupted and runs
  to its end;
* the result that call produces later is released when it arrives: never live, never
  leaked (the engine's memory is back to its figure before);
* task runs queued behind it on the owner thread run, with correct results;
* the session's teardown still completes.

The cpu backend's slow query sleeps inside the engine call; on the GPU the slow query is a
high-cardinality group-by grown until one engine call takes at least 2 s, and the timeout
is a quarter of that call's time.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import polars as pl
import pytest
from prefect import flow
from prefect.client.orchestration import get_client

from api_reads import final_task_run
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import collect, execute, gpu_task
from slow_queries import heavy_group_by, sleeping

TIMEOUT_S = 1.0
#: Seconds the cpu backend's slow query spends in its engine call.
SLOW_S = 6.0
#: Set on the owner thread when the slow query's engine call is under way.
in_engine_call = threading.Event()


def slow_query(path: str) -> pl.LazyFrame:
    """A query whose engine call takes ``SLOW_S`` seconds, marking when it is under way."""

    def mark(s: pl.Series) -> pl.Series:
        in_engine_call.set()
        return s

    marked = pl.scan_parquet(path).with_columns(pl.col("id").map_batches(mark, return_dtype=pl.Int64))
    return sleeping(marked, SLOW_S)


times_out = gpu_task(name="times-out", timeout_seconds=TIMEOUT_S)(slow_query)


def span(task_run_id):
    """A task run's final state and its seconds from start to end, from the API."""
    run = final_task_run(task_run_id)
    return run.state, (run.end_time - run.start_time).total_seconds()


def check_timed_out(session, task_run_id, live, before, after, engine_s: float, slack: int = 0) -> float:
    """
    The checks of a timed-out GPU task (see the module docstring).

    ``slack``: bytes the engine may hold above its figure before (rmm's figure on a GPU
    may differ by a few bytes of allocator bookkeeping; the cpu backend's is exact).
    Returns the task run's seconds from its start to TimedOut, from the API.
    """
    state, seconds = span(task_run_id)
    assert state.name == "TimedOut", state
    assert seconds < engine_s * 0.75, (
        f"the task run ended {seconds:.1f} s after it started: it waited for the engine call "
        f"(~{engine_s:.1f} s) instead of ending at its timeout"
    )
    assert live == (), f"the late result is still live: {live}"
    assert after - before <= slack, f"the engine holds {after} bytes, {before} before the timed-out task"
    assert session.summary()["teardown"] == "complete"
    return seconds


def test_a_submitted_gpu_task_past_its_timeout_ends_timed_out_and_its_late_result_is_released(
    cpu_block, orders, unchecked_cpu_backend
):
    in_engine_call.clear()

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def pipeline():
        session = get_engine_session()
        before = session.memory_in_use()
        late = times_out.submit(str(orders))
        assert in_engine_call.wait(60)
        behind = collect.submit(pl.scan_parquet(orders))  # queued behind the slow call
        rows = behind.result().height
        late.wait()
        return session, late.task_run_id, rows, session.live_results, before, session.memory_in_use()

    session, run_id, rows, live, before, after = pipeline()
    assert rows == 1000
    check_timed_out(session, run_id, live, before, after, SLOW_S)


@pytest.mark.timeout(300, method="thread")  # leaves SIGALRM to Prefect: a task in the main thread times out by alarm
def test_a_gpu_task_called_in_the_flow_body_past_its_timeout_ends_timed_out(cpu_block, orders, unchecked_cpu_backend):
    in_engine_call.clear()

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def pipeline():
        session = get_engine_session()
        before = session.memory_in_use()
        state = times_out(str(orders), return_state=True)
        rows = collect(pl.scan_parquet(orders)).height  # queued behind the slow call
        return session, state, rows, session.live_results, before, session.memory_in_use()

    session, state, rows, live, before, after = pipeline()
    assert rows == 1000
    check_timed_out(session, state.state_details.task_run_id, live, before, after, SLOW_S)


@gpu_task(name="async-times-out", timeout_seconds=TIMEOUT_S)
async def async_times_out(path: str) -> pl.LazyFrame:
    return slow_query(path)


def test_an_async_gpu_task_past_its_timeout_releases_its_late_result_when_the_engine_call_returns(
    cpu_block, orders, unchecked_cpu_backend
):
    in_engine_call.clear()

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    async def pipeline():
        session = get_engine_session()
        before = session.memory_in_use()
        state = await async_times_out(str(orders), return_state=True)
        # Queued behind the engine call that is still running: when it returns, the late result has arrived.
        rows = collect(pl.scan_parquet(orders)).height
        return session, state, rows, session.live_results, before, session.memory_in_use(), session.counts

    session, state, rows, live, before, after, counts = asyncio.run(pipeline())
    assert rows == 1000
    check_timed_out(session, state.state_details.task_run_id, live, before, after, SLOW_S)
    assert counts == {"produced": 1, "consumed": 0, "released_unconsumed": 1}  # released when the call returned


def test_the_engine_start_is_not_charged_to_the_first_gpu_task_runs_timeout(orders):
    """The first GPU task of a flow run starts no engine: its flow run did, before the task run began."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency

    name, admitted = f"start-{uuid.uuid4().hex[:12]}", threading.Event()
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=6))

    @gpu_task(name="quick", timeout_seconds=TIMEOUT_S)
    def quick(path: str) -> pl.LazyFrame:
        return pl.scan_parquet(path)

    block = CudfPolarsEngine(backend="cpu", device_memory_limit=4 * 2**30, admission_limit=name)

    @flow(task_runner=CudfPolarsTaskRunner(block))
    def pipeline():
        state = quick(str(orders), return_state=True)
        return state, get_engine_session().timings["admission_wait_s"]

    holder = concurrency(name, occupy=4, strict=True)  # another holder takes 4 of the 6 slots ...
    holder.__enter__()
    release = threading.Timer(TIMEOUT_S * 3, lambda: (holder.__exit__(None, None, None), admitted.set()))
    release.start()  # ... and gives them back after three times the task's timeout
    state, waited = pipeline()
    release.join()
    assert admitted.is_set() and waited >= TIMEOUT_S * 2
    assert state.is_completed(), state
    assert span(state.state_details.task_run_id)[1] < TIMEOUT_S


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_on_the_gpu_a_timed_out_task_ends_at_its_timeout_and_its_late_result_is_released(figure):
    block = CudfPolarsEngine(backend="spmd", raise_on_fail=True)

    @flow(task_runner=CudfPolarsTaskRunner(block))
    def pipeline():
        session = get_engine_session()
        rows, seconds = 25_000_000, 0.0
        while True:  # grow the query until one engine call takes >= 2 s
            query = heavy_group_by(rows)
            calibration = execute(query, name="calibration")
            seconds = calibration.engine_seconds
            calibration.release()
            if seconds >= 2.0 or rows >= 800_000_000:
                break
            rows *= 2
        assert seconds >= 2.0, f"no query of at most {rows:,} rows took 2 s ({seconds:.2f} s)"
        before = session.memory_in_use()
        late = execute.with_options(timeout_seconds=seconds / 4).submit(query, name="times out")
        alongside = collect.submit(pl.LazyFrame({"a": list(range(10))}))
        late.wait()
        # Queued behind the engine call that is still running: when it returns, the late result has arrived.
        behind = collect(pl.LazyFrame({"a": list(range(20))})).height
        rows = (alongside.result().height, behind)
        return session, late.task_run_id, rows, seconds, session.live_results, before, session.memory_in_use()

    session, run_id, rows, seconds, live, before, after = pipeline()
    assert rows == (10, 20)
    ended_after = check_timed_out(session, run_id, live, before, after, seconds, slack=2**20)
    figure("engine_call_seconds", round(seconds, 2))
    figure("timeout_seconds", round(seconds / 4, 2))
    figure("task_run_seconds_to_timed_out", round(ended_after, 2))
