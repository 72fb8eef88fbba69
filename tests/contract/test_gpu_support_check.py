"""
What works on the laptop works on the GPU: the cpu backend refuses what cudf-polars would refuse.

With ``raise_on_fail=True`` the cpu backend checks each query the way cudf-polars
26.10 does before it runs anything: it translates the query's plan with a fixed
configuration (no device is touched) and refuses it with cudf-polars' own reason.
The check needs ``import cudf_polars`` (the CUDA wheels, not a GPU); where that
import fails, nothing is checked and the session's start line says so.
"""

from __future__ import annotations

import sys

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from conftest import read_run_logs
from cudf_polars_import import cudf_polars_or_skip
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import collect, execute

START_LINE = "cudf-polars engine session started"


def doubled(path) -> pl.LazyFrame:
    """A query cudf-polars cannot run on the GPU: a Python function per element."""
    return pl.scan_parquet(path).select(
        pl.col("amount").map_elements(lambda v: v * 2, return_dtype=pl.Float64)
    )


def start_line(state) -> str:
    messages = read_run_logs(state.state_details.flow_run_id, expect=START_LINE)
    [line] = [m for m in messages if START_LINE in m]
    return line


def run_refused_query(engine: CudfPolarsEngine, orders):
    """A flow run that executes the refused query; returns its state and the session's live results."""
    seen = {}

    @flow(task_runner=CudfPolarsTaskRunner(engine))
    def pipeline():
        seen["session"] = get_engine_session()
        return execute(doubled(orders))

    state = pipeline(return_state=True)
    return state, seen["session"]


def test_without_cudf_polars_the_start_line_says_gpu_support_is_not_checked(orders, monkeypatch):
    monkeypatch.setitem(sys.modules, "cudf_polars", None)  # import cudf_polars raises ImportError

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu", raise_on_fail=True)))
    def pipeline():
        return collect(execute(doubled(orders))).height

    state = pipeline(return_state=True)
    assert state.is_completed(), state  # not checked: polars runs it, as before
    line = start_line(state)
    assert "GPU support" in line and "not checked" in line, line


def test_with_cudf_polars_the_cpu_backend_refuses_what_the_gpu_refuses(orders):
    cudf_polars_or_skip()
    state, session = run_refused_query(CudfPolarsEngine(backend="cpu", raise_on_fail=True), orders)
    assert state.is_failed(), state
    with pytest.raises(NotImplementedError, match=r"(?s)GPU.*anonymousfunction"):
        state.result()
    # Refused before the engine ran: nothing was produced, nothing is held.
    assert session.summary()["counts"]["produced"] == 0
    assert session.live_results == ()
    line = start_line(state)
    assert "GPU support" in line and "not checked" not in line, line


def test_with_cudf_polars_a_supported_query_runs_on_the_cpu_backend(orders):
    cudf_polars_or_skip()

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu", raise_on_fail=True)))
    def pipeline():
        r = execute(pl.scan_parquet(orders).filter(pl.col("amount") > 50), name="big")
        return collect(r.lazy().group_by("customer").agg(pl.len()).sort("customer"))

    expected = (
        pl.scan_parquet(orders).filter(pl.col("amount") > 50)
        .group_by("customer").agg(pl.len()).sort("customer").collect()
    )
    assert_frame_equal(pipeline(), expected)


def test_with_cudf_polars_and_raise_on_fail_false_a_collect_falls_back_to_polars(orders):
    """As on the GPU: ``raise_on_fail=False`` lets polars' CPU engine run what cudf-polars cannot."""
    cudf_polars_or_skip()

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu", raise_on_fail=False)))
    def pipeline():
        return collect(doubled(orders))

    assert_frame_equal(pipeline(), doubled(orders).collect())


@pytest.mark.gpu
def test_the_gpu_and_the_checked_cpu_backend_refuse_with_the_same_reason(orders):
    refusals = {}
    for backend in ("spmd", "cpu"):
        state, session = run_refused_query(CudfPolarsEngine(backend=backend, raise_on_fail=True), orders)
        assert state.is_failed(), (backend, state)
        with pytest.raises(NotImplementedError) as info:
            state.result()
        refusals[backend] = str(info.value)
        assert session.live_results == ()
    assert "anonymousfunction" in refusals["spmd"], refusals
    assert "anonymousfunction" in refusals["cpu"], refusals


def test_with_cudf_polars_but_no_gpu_auto_falls_back_to_the_checked_cpu_backend(orders):
    """Importable RAPIDS packages without a GPU still mean "no GPU": auto with cpu_fallback runs on cpu, checked."""
    cudf_polars_or_skip()
    from prefect_cudf_polars.blocks.backends import probe

    found = probe.probe()
    if found.gpus:
        pytest.skip("a GPU is visible here")
    assert found.rapids and found.problem is not None, found

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="auto", cpu_fallback=True)))
    def pipeline():
        return get_engine_session().backend, collect(execute(pl.scan_parquet(orders))).height

    state = pipeline(return_state=True)
    assert state.result() == ("cpu", 1000)
    line = start_line(state)
    assert "GPU support checked" in line, line
