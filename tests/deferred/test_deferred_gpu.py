"""
Deferred steps on a real GPU: SPMD backend, one rank, one GPU.

Skipped without an NVIDIA GPU and the RAPIDS packages (see conftest). Device
memory is read with rmm statistics (what rmm has allocated).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task

pytestmark = pytest.mark.gpu

ROWS = 2_000_000


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> str:
    """2M rows of real parquet (2 files, ~64 MB in GPU memory when loaded)."""
    folder = tmp_path_factory.mktemp("deferred-rows")
    rng = np.random.default_rng(0)
    for i in range(2):
        n = ROWS // 2
        pl.DataFrame(
            {"key": rng.integers(0, 1000, n), "x": rng.random(n), "y": rng.integers(0, 100, n)}
        ).write_parquet(folder / f"part-{i}.parquet")
    return str(folder / "*.parquet")


@pytest.fixture()
def spmd() -> CudfPolarsEngine:
    return CudfPolarsEngine(backend="spmd", raise_on_fail=True)


@gpu_task(name="low-y", defer=True)
def low_y(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().filter(pl.col("y") < 50)


@gpu_task(name="key-sums")
def key_sums(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().group_by("key").agg(pl.col("x").sum(), pl.len().alias("n"))


def test_a_fused_chain_on_the_gpu_equals_polars_and_device_memory_returns(spmd, rows):
    @flow(task_runner=CudfPolarsTaskRunner(spmd))
    def pipeline():
        session = get_engine_session()
        scanned = execute(pl.scan_parquet(rows), name="rows", defer=True)
        sums = key_sums(low_y(scanned))
        assert sums.backend == "spmd" and not sums.deferred
        assert [step.name for step in sums.fused] == ["rows", "low-y"]
        return collect(sums.lazy().sort("key")), session

    got, session = pipeline()
    expected = (
        pl.scan_parquet(rows).filter(pl.col("y") < 50)
        .group_by("key").agg(pl.col("x").sum(), pl.len().alias("n")).sort("key").collect()
    )
    assert_frame_equal(got, expected, check_exact=False, check_dtypes=False)
    summary = session.summary()
    assert summary["engine_calls"] == 2  # key-sums (with both deferred steps), then collect
    assert summary["counts"] == {"produced": 3, "consumed": 3, "released_unconsumed": 0}
    assert summary["memory"]["at_end"] == summary["memory"]["at_start"]


def test_a_deferred_result_released_unread_frees_its_inputs_device_memory(spmd, rows):
    with spmd.session() as session:
        start = session.memory_in_use()
        loaded = session.execute(pl.scan_parquet(rows), name="rows")
        held = session.memory_in_use()
        assert held - start > 20 * 2**20, (start, held)  # 2M rows x 3 cols of 8 bytes
        unread = session.defer(loaded.lazy().filter(pl.col("y") < 50), name="low-y", inputs=[loaded])
        assert unread.deferred and unread.held_inputs == (loaded,)
        assert session.memory_in_use() == held  # deferring ran nothing
        unread.release()
        assert session.memory_in_use() == start
    summary = session.summary()
    assert summary["counts"] == {"produced": 2, "consumed": 1, "released_unconsumed": 1}
    assert summary["engine_calls"] == 1


@gpu_task(name="doubled-by-python", defer=True)
def doubled_by_python(r: GPUResult) -> pl.LazyFrame:
    """A plan cudf-polars 26.10 refuses (a Python UDF); its schema resolves."""
    return r.lazy().select(pl.col("x").map_elements(lambda v: v * 2, return_dtype=pl.Float64))


@gpu_task(name="x-total")
def x_total(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().select(pl.col("x").sum())


@pytest.mark.filterwarnings("ignore::polars.exceptions.PolarsInefficientMapWarning")
def test_a_deferred_step_the_gpu_refuses_fails_in_its_reader_naming_the_step(spmd, rows):
    """On spmd the GPU-support check does not run ahead: the reader's engine call is refused, nothing leaks."""

    @flow(task_runner=CudfPolarsTaskRunner(spmd))
    def pipeline():
        session = get_engine_session()
        start = session.memory_in_use()
        deferred = doubled_by_python(execute(pl.scan_parquet(rows), name="rows"))
        accepted = deferred.deferred and deferred.state == "live"
        state = x_total(deferred, return_state=True)
        after = session.memory_in_use()
        # The session stays usable.
        again = collect(key_sums(execute(pl.scan_parquet(rows), name="rows-again")))
        return accepted, state, start, after, again.height, session

    accepted, state, start, after, groups, session = pipeline()
    assert accepted  # the deferred step's own task run completed
    assert state.is_failed(), state
    with pytest.raises(NotImplementedError, match="Query execution with GPU not possible") as raised:
        state.result()
    notes = getattr(raised.value, "__notes__", [])
    assert any("'doubled-by-python' (task run 'doubled-by-python'" in note for note in notes), notes
    assert after == start  # the refused call's claimed inputs were freed
    assert groups == 1000
    summary = session.summary()
    assert summary["memory"]["at_end"] == summary["memory"]["at_start"]
