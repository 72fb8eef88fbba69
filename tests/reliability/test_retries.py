"""
Retries of GPU tasks whose failed attempt consumed its input.

The retry recomputes the input from its recorded lineage (down to the scans),
also two steps down a chain, or fails at once with CannotRecomputeError saying why;
the same contract holds for each of the six tasks that call the engine (gpu_task,
execute, collect, tee, read_parquet, sink_parquet).
"""

from __future__ import annotations

import polars as pl
import pytest
from prefect import flow, task

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import (
    CannotRecomputeError,
    GPUResult,
    ResultConsumedError,
    collect,
    execute,
    gpu_task,
    read_parquet,
    sink_parquet,
    tee,
)
from reliability_fixtures import engine_block  # noqa: F401 (pytest fixtures)

RUNNER = lambda: CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu"))  # noqa: E731


def expected_totals(orders) -> pl.DataFrame:
    return (
        pl.read_parquet(orders).filter(pl.col("amount") > 10)
        .group_by("customer").agg(pl.col("amount").sum()).sort("customer")
    )


def test_retry_recomputes_the_input_its_first_attempt_consumed(engine_block, orders):
    attempts = []
    store_before = held_partitions()

    @gpu_task(retries=1, retry_delay_seconds=0)
    def totals(r: GPUResult) -> pl.LazyFrame:
        lf = r.lazy()  # claims r: the data is gone for a plain retry
        attempts.append(r.id)
        if len(attempts) == 1:
            raise OSError("transient failure after reading the input")
        return lf.group_by("customer").agg(pl.col("amount").sum()).sort("customer")

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def pipeline():
        r = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 10), name="filtered")
        out = collect(totals(r))
        return out, r

    out, original = pipeline()
    assert out.equals(expected_totals(orders))
    first, second = attempts
    assert first == original.id and second != original.id  # the retry read a recomputed result
    assert held_partitions() == store_before


@pytest.mark.parametrize("reader", ["plain task, result as argument", "gpu_task, result from a closure"])
def test_a_retry_that_reads_a_result_it_cannot_recompute_is_told_to_pass_it_to_a_gpu_task(reader, orders):
    attempts, given = [], {}

    @task(name="reader", retries=1, retry_delay_seconds=0)
    def plain_reader(r: GPUResult) -> int:
        r.lazy()  # claims r on each attempt
        attempts.append(1)
        raise OSError("transient failure after reading the input")

    @gpu_task(name="reader", retries=1, retry_delay_seconds=0)
    def closure_reader() -> pl.LazyFrame:
        lf = given["r"].lazy()  # not an argument: nothing to recompute on retry
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("transient failure after reading the input")
        return lf

    @flow(task_runner=RUNNER())
    def pipeline():
        given["r"] = r = execute(pl.scan_parquet(orders), name="trips")
        plain_reader(r) if reader.startswith("plain") else closure_reader()

    state = pipeline(return_state=True)
    assert state.is_failed() and len(attempts) == 1
    with pytest.raises(ResultConsumedError, match=(
        r"'trips'.*already read by an earlier attempt of this task run 'reader.*, which Prefect is retrying.*"
        r"a retry recomputes only the results given to a `gpu_task`.* as arguments.*Make the task a `gpu_task` "
        r"and pass it the result as an argument, or collect the result before this task"
    )) as info:
        state.result()
    assert "self-join" not in str(info.value) and "tee(" not in str(info.value)


def test_retry_two_steps_down_a_chain_recomputes_the_whole_chain(engine_block, orders):
    calls = {"filtered": 0, "totals": 0}

    @gpu_task
    def filtered(r: GPUResult) -> pl.LazyFrame:
        calls["filtered"] += 1
        return r.lazy().filter(pl.col("amount") > 10)

    @gpu_task(retries=2, retry_delay_seconds=0)
    def totals(r: GPUResult) -> pl.LazyFrame:
        calls["totals"] += 1
        lf = r.lazy()
        if calls["totals"] == 1:
            raise OSError("transient")
        return lf.group_by("customer").agg(pl.col("amount").sum()).sort("customer")

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def chain():
        scanned = execute(pl.scan_parquet(orders), name="scanned")
        return collect(totals(filtered(scanned))), scanned

    out, scanned = chain()
    assert out.equals(expected_totals(orders))
    # The retry replayed `filtered` (from a fresh scan, not from the consumed `scanned`).
    assert calls == {"filtered": 2, "totals": 2}
    assert scanned.state == "consumed"  # read once by the first `filtered`, never again


def test_retry_of_an_unreplayable_input_fails_at_once_with_the_reason(engine_block, orders):
    calls = []

    @gpu_task(retries=3, retry_delay_seconds=0)
    def step(r: GPUResult) -> pl.LazyFrame:
        calls.append(1)
        r.lazy()
        raise OSError("transient")

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def pipeline():
        base = execute(pl.scan_parquet(orders))
        # A query built from base.lazy() in the flow body: its lineage cannot be replayed.
        derived = execute(base.lazy().filter(pl.col("customer") == 1), name="derived")
        state = step(derived, return_state=True)
        return state.is_failed(), state.result(raise_on_failure=False)

    failed, error = pipeline()
    assert failed and isinstance(error, CannotRecomputeError)
    with pytest.raises(CannotRecomputeError) as info:
        raise error
    assert len(calls) == 1  # no more attempts after the one that could not recompute
    assert "consumed by an earlier attempt" in str(info.value)
    assert ".lazy() frame built outside a GPU task" in info.value.reason
    assert info.value.result_name == "derived"


def test_retry_does_not_recompute_an_input_another_task_consumed(engine_block, orders):
    calls = []

    @gpu_task
    def reader(r: GPUResult) -> pl.LazyFrame:
        return r.lazy()

    @gpu_task(retries=2, retry_delay_seconds=0)
    def late(r: GPUResult) -> pl.LazyFrame:
        calls.append(1)
        return r.lazy()

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def pipeline():
        r = execute(pl.scan_parquet(orders))
        reader(r)
        return late(r, return_state=True).result(raise_on_failure=False)

    error = pipeline()
    with pytest.raises(ResultConsumedError, match=r"already consumed by task run 'reader'.*tee\(result, 2\)"):
        raise error
    assert calls == []  # refused before the user's function, on every attempt


def test_retry_before_the_input_was_read_uses_the_original(engine_block, orders):
    seen = []

    @gpu_task(retries=1, retry_delay_seconds=0)
    def step(r: GPUResult) -> pl.LazyFrame:
        seen.append(r.id)
        if len(seen) == 1:
            raise OSError("fails before reading its input")
        return r.lazy()

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def pipeline():
        r = execute(pl.scan_parquet(orders))
        return collect(step(r)).height, r.id

    rows, original = pipeline()
    assert rows == 1000 and seen == [original, original]


def test_execute_and_collect_with_retries_recompute_too(orders, monkeypatch):
    from prefect_cudf_polars.blocks.backends.cpu import CpuRunningEngine

    failures = {"execute": 1, "collect": 1}
    armed = []
    for name in failures:
        original = getattr(CpuRunningEngine, name)

        def flaky(self, lf, flags, _original=original, _name=name):
            if armed and failures[_name] and "PYTHON SCAN" in lf.explain(optimized=False):
                failures[_name] -= 1  # fail once, after the input was claimed
                raise OSError(f"transient {_name} failure")
            return _original(self, lf, flags)

        monkeypatch.setattr(CpuRunningEngine, name, flaky)

    @gpu_task
    def passthrough(r: GPUResult) -> pl.LazyFrame:
        return r.lazy()

    @flow(task_runner=RUNNER())
    def pipeline():
        r = passthrough(execute(pl.scan_parquet(orders)))
        armed.append(True)
        again = execute.with_options(retries=1, retry_delay_seconds=0)(r)
        return collect.with_options(retries=1, retry_delay_seconds=0)(again).height

    assert pipeline() == 1000
    assert failures == {"execute": 0, "collect": 0}


# ---- the contract, over every task that calls the engine -----------------------------------
@gpu_task(name="passthrough")
def passthrough(r: GPUResult) -> pl.LazyFrame:
    return r.lazy()


def _sink_rows(summary) -> int:
    return summary.rows


#: Each task that calls the engine, given the flow run's result (or, for read_parquet, the
#: file's path), with retries=1: what it returns, as a row count.
SIX = {
    "gpu_task": lambda r, path, out: collect(passthrough.with_options(retries=1, retry_delay_seconds=0)(r)).height,
    "execute": lambda r, path, out: collect(execute.with_options(retries=1, retry_delay_seconds=0)(r)).height,
    "collect": lambda r, path, out: collect.with_options(retries=1, retry_delay_seconds=0)(r).height,
    "tee": lambda r, path, out: sum(collect(c).height for c in tee.with_options(retries=1, retry_delay_seconds=0)(r, 2)),
    "read_parquet": lambda r, path, out: (
        r.release(), collect(read_parquet.with_options(retries=1, retry_delay_seconds=0)(path)).height
    )[1],
    "sink_parquet": lambda r, path, out: _sink_rows(
        sink_parquet.with_options(retries=1, retry_delay_seconds=0)(r, str(out), overwrite=True)
    ),
}
EXPECTED_ROWS = {"tee": 2000}


@pytest.fixture()
def fails_once_after_reading(monkeypatch):
    """
    Make the next armed engine call that reads a result's frame, or tee's hand-over, fail once.

    A transient failure inside the engine call: the task has claimed its input by then. For
    ``read_parquet``, whose input is a file, the next armed engine call fails once.
    """
    from prefect_cudf_polars.blocks import EngineSession
    from prefect_cudf_polars.blocks.backends.cpu import CpuRunningEngine

    state = {"armed": False, "failed": 0, "any_call": False}

    def fail_now(reads_result: bool) -> bool:
        if state["armed"] and not state["failed"] and (reads_result or state["any_call"]):
            state["failed"] += 1
            return True
        return False

    for name in ("execute", "collect"):
        original = getattr(CpuRunningEngine, name)

        def flaky(self, lf, flags, _original=original):
            if fail_now("PYTHON SCAN" in lf.explain(optimized=False)):
                raise OSError("transient engine failure after the input was read")
            return _original(self, lf, flags)

        monkeypatch.setattr(CpuRunningEngine, name, flaky)
    original_adopt = EngineSession.adopt

    def flaky_adopt(self, handed, *, like):
        result = original_adopt(self, handed, like=like)
        if fail_now(True):  # after the hand-over claimed the input
            result.release()
            raise OSError("transient failure after tee read its input")
        return result

    monkeypatch.setattr(EngineSession, "adopt", flaky_adopt)
    return state


@pytest.mark.parametrize("kind", sorted(SIX))
def test_every_task_that_calls_the_engine_recomputes_its_input_on_retry(kind, orders, tmp_path, fails_once_after_reading):
    """A retry of any of the six GPU tasks whose attempt failed after reading its input runs on a recomputed input."""
    state = fails_once_after_reading
    state["any_call"] = kind == "read_parquet"
    before = held_partitions()

    @flow(task_runner=RUNNER())
    def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        state["armed"] = True
        return SIX[kind](r, str(orders), tmp_path / "sunk")

    assert pipeline() == EXPECTED_ROWS.get(kind, 1000)
    assert state["failed"] == 1  # the first attempt failed, the retry completed
    assert held_partitions() == before


@pytest.mark.parametrize("kind", sorted(set(SIX) - {"read_parquet"}))
def test_every_task_that_calls_the_engine_fails_at_once_when_its_input_cannot_be_recomputed(
    kind, orders, tmp_path, fails_once_after_reading
):
    """An input built from a result's frame in the flow body has no replayable lineage: one attempt, then CannotRecomputeError."""
    state = fails_once_after_reading
    before = held_partitions()

    @flow(task_runner=RUNNER())
    def pipeline():
        base = execute(pl.scan_parquet(orders), name="orders")
        r = execute(base.lazy().head(500), name="first-half")  # lineage reads a frame: not replayable
        state["armed"] = True
        if kind == "tee":  # a split into two needs the lineage first: one copy reads the input itself
            return collect(tee.with_options(retries=1, retry_delay_seconds=0)(r, 1)[0]).height
        return SIX[kind](r, str(orders), tmp_path / "sunk")

    state_ = pipeline(return_state=True)
    assert state_.is_failed(), state_
    with pytest.raises(CannotRecomputeError, match="this retry cannot recompute it.*in-process source"):
        state_.result()
    assert state["failed"] == 1  # one attempt failed; Prefect did not retry the recompute failure
    assert held_partitions() == before


@pytest.mark.parametrize("kind", ["gpu_task", "execute", "sink_parquet"])
def test_a_retry_condition_given_with_options_runs_after_the_recompute_check(kind, orders, tmp_path, fails_once_after_reading):
    """
    ``.with_options(retry_condition_fn=...)`` keeps the check: the user's condition is asked after the
    transient failure, and not after the retry's CannotRecomputeError, which ends the run despite retries=2.
    """
    state = fails_once_after_reading
    asked = []

    def always_retry(task, task_run, run_state) -> bool:
        asked.append(task_run.name)
        return True

    options = {"retries": 2, "retry_delay_seconds": 0, "retry_condition_fn": always_retry}
    tasks = {"gpu_task": passthrough, "execute": execute, "sink_parquet": sink_parquet}
    args = {"sink_parquet": (str(tmp_path / "sunk"),)}

    @flow(task_runner=RUNNER())
    def pipeline():
        base = execute(pl.scan_parquet(orders), name="orders")
        r = execute(base.lazy().head(500), name="first-half")  # lineage reads a frame: not replayable
        state["armed"] = True
        return tasks[kind].with_options(**options)(r, *args.get(kind, ()))

    outcome = pipeline(return_state=True)
    assert outcome.is_failed(), outcome
    with pytest.raises(CannotRecomputeError, match="this retry cannot recompute it"):
        outcome.result()
    assert state["failed"] == 1 and len(asked) == 1
