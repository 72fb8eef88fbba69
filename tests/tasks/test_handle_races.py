"""
A ``GPUResult`` used from several threads at once (real Prefect API, cpu backend, real threads).

Each case starts its threads behind one ``threading.Barrier`` and repeats, so the threads
meet inside the handle's transitions:

* threads of one task run attempt (each in a copy of the task's context, as a thread pool
  that keeps Prefect's context does) that claim one result at once share that attempt's
  claim: one frame, the right rows, no error;
* a ``release()`` racing a claim gives either the right rows (the result then stays
  ``"consumed"``) or ``ResultReleasedError`` (``"released"``), and afterwards the handle
  holds nothing;
* a session's end racing a claim leaves a handle that keeps nothing of the engine alive, and a
  claim while the session ends is refused as released.

Threads switch every microsecond here, so they interleave inside the handle's calls.
"""

from __future__ import annotations

import contextvars
import gc
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import polars as pl
import pytest
from prefect import flow
from processes import wait_until

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import GPUResult, GPUResultError, ResultReleasedError, execute, gpu_task

THREADS = 8
ROUNDS = 12


@pytest.fixture(autouse=True)
def fine_thread_switching():
    """Switch threads every microsecond (CPython's default is 5 ms), so racing threads interleave inside calls."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def in_threads(*calls):
    """Run each call on its own thread, in a copy of this context, all released by one barrier; their outcomes."""
    barrier = threading.Barrier(len(calls))

    def started(call, ctx):
        barrier.wait(timeout=30)
        try:
            return ("value", ctx.run(call))
        except Exception as exc:  # the outcome under test
            return ("error", exc)

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(started, call, contextvars.copy_context()) for call in calls]
        return [f.result(timeout=60) for f in futures]


@gpu_task(name="summed")
def summed(r: GPUResult) -> pl.LazyFrame:
    outcomes = in_threads(*[r.lazy] * THREADS)
    errors = [value for kind, value in outcomes if kind == "error"]
    assert not errors, errors
    frames = {id(value) for _, value in outcomes}
    assert len(frames) == 1, f"{len(frames)} frames for one claim"
    return outcomes[0][1].select(pl.col("amount").sum())


def test_threads_of_one_task_attempt_that_claim_a_result_at_once_share_its_claim(orders):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        sums = [summed(execute(pl.scan_parquet(orders), name=f"orders-{i}")) for i in range(ROUNDS)]
        return [r.lazy().collect().item() for r in sums], get_engine_session().live_results

    totals, live = pipeline()
    assert totals == [pl.read_parquet(orders)["amount"].sum()] * ROUNDS
    assert live == ()


def test_a_release_racing_a_claim_gives_the_rows_or_result_released_error_and_the_handle_holds_nothing(orders):
    expected = pl.read_parquet(orders).height
    outcomes = []
    with CudfPolarsEngine(backend="cpu").session() as session:
        for _ in range(ROUNDS * 2):
            r = session.execute(pl.scan_parquet(orders), name="raced")
            probe = weakref.ref(r.persisted)
            (kind, value), released = in_threads(lambda: session.collect(r.lazy()).height, r.release)
            outcomes.append((kind, value if kind == "value" else (type(value), str(value))))
            del value  # a caught error's traceback keeps the query's frame
            assert released == ("value", None)
            assert r.state == ("consumed" if kind == "value" else "released"), (kind, r.state)  # what happened to it
            assert not r.holding and r.persisted is None
            with pytest.raises(GPUResultError, match="was released|already consumed"):
                r.lazy()  # nothing of the engine is reachable through it any more
            session.memory_in_use()  # a call behind the queued free: it has run
            gc.collect()
            assert probe() is None, "the handle keeps the engine's partition alive"
        assert session.live_results == ()
    for kind, value in outcomes:
        assert value == expected if kind == "value" else (value[0] is ResultReleasedError and "was released" in value[1])


def test_a_release_while_a_query_reads_the_result_leaves_it_consumed_and_the_query_gets_its_rows(orders):
    reading, go_on = threading.Event(), threading.Event()

    def held(ids: pl.Series) -> pl.Series:  # runs inside the engine call: the query has read the frame
        reading.set()
        go_on.wait(timeout=30)
        return ids

    with CudfPolarsEngine(backend="cpu", raise_on_fail=False).session() as session:  # a Python UDF: polars runs it
        r = session.execute(pl.scan_parquet(orders), name="read")
        query = lambda: session.collect(r.lazy().with_columns(pl.col("id").map_batches(held, return_dtype=pl.Int64)))  # noqa: E731
        with ThreadPoolExecutor(1) as pool:
            rows = pool.submit(contextvars.copy_context().run, query)
            assert reading.wait(timeout=30)
            r.release()
            go_on.set()
            assert rows.result(timeout=60).height == pl.read_parquet(orders).height
        assert r.state == "consumed" and not r.holding
        assert session.counts["consumed"] == 1 and session.counts["released_unconsumed"] == 0


def test_a_frame_whose_result_was_released_before_any_query_read_it_is_refused_as_released(orders):
    with CudfPolarsEngine(backend="cpu").session() as session:
        r = session.execute(pl.scan_parquet(orders), name="let-go")
        frame = r.lazy()
        r.release()
        with pytest.raises(ResultReleasedError, match="GPUResult 'let-go' .* was released"):
            session.collect(frame.select(pl.len()))
        assert r.state == "released" and session.counts["released_unconsumed"] == 0


def test_a_session_end_racing_a_claim_leaves_a_handle_that_keeps_nothing_of_the_engine(orders):
    for _ in range(ROUNDS):  # entered in a context of its own, so it is not left active here
        session = contextvars.copy_context().run(CudfPolarsEngine(backend="cpu").session().__enter__)
        r = session.execute(pl.scan_parquet(orders), name="raced")
        probe = weakref.ref(r.persisted)
        claimed, _ = in_threads(r.lazy, lambda: session.__exit__(None, None, None))
        assert session.closed and not r.holding and r.persisted is None and r.lineage is None
        if claimed[0] == "error":
            assert isinstance(claimed[1], ResultReleasedError), repr(claimed[1])
        del claimed
        gc.collect()
        assert probe() is None, "an ended handle keeps the engine's partition alive"


def test_a_claim_while_the_session_ends_is_refused_as_released_and_counted_once(orders):
    """The session's end marks its results released only after the engine's last call; a claim in between is
    refused as released (not served from a session that has ended), and the result is counted released once."""
    reading, go_on = threading.Event(), threading.Event()

    def held(ids: pl.Series) -> pl.Series:  # runs inside the engine call: the owner thread is busy until go_on
        reading.set()
        go_on.wait(timeout=30)
        return ids

    session = contextvars.copy_context().run(CudfPolarsEngine(backend="cpu", raise_on_fail=False).session().__enter__)
    kept = session.execute(pl.scan_parquet(orders), name="kept")
    query = pl.scan_parquet(orders).with_columns(pl.col("id").map_batches(held, return_dtype=pl.Int64))
    with ThreadPoolExecutor(2) as pool:
        rows = pool.submit(session.collect, query)
        assert reading.wait(timeout=30)
        ending = pool.submit(session.__exit__, None, None, None)  # waits for the engine call above
        try:
            wait_until(lambda: session.closed, 30, "the session's end beginning")
            with pytest.raises(ResultReleasedError, match="GPUResult 'kept' .* was released when its engine session ended"):
                kept.lazy()
        finally:
            go_on.set()
        assert rows.result(timeout=60).height == pl.read_parquet(orders).height
        ending.result(timeout=60)
    assert kept.state == "released" and not kept.holding
    assert session.counts == {"produced": 1, "consumed": 0, "released_unconsumed": 1}
