"""
Retries of GPU tasks whose failed attempt consumed its input.

The retry recomputes the input from its recorded lineage (down to the scans),
also two steps down a chain, or fails at once with CannotRecomputeError saying why.
"""

from __future__ import annotations

import polars as pl
import pytest
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import (
    CannotRecomputeError,
    GPUResult,
    ResultConsumedError,
    collect,
    execute,
    gpu_task,
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
