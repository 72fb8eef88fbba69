"""
The result rules on a real GPU: SPMD backend, one rank, one GPU.

Skipped without an NVIDIA GPU and the RAPIDS packages (see conftest). Device
memory is read with rmm statistics (what rmm has allocated), not nvidia-smi,
whose figure includes the pool's cached memory.
"""

from __future__ import annotations

import pickle
import re
import threading

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

import nvidia_smi

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import (
    GPUResult,
    HostPersistenceError,
    ResultConsumedError,
    ResultReleasedError,
    WrongEngineError,
    collect,
    execute,
    gpu_task,
)

pytestmark = pytest.mark.gpu

ROWS = 5_000_000


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> str:
    """5M rows of real parquet (4 files, ~100 MB in GPU memory when loaded)."""
    folder = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(0)
    for i in range(4):
        n = ROWS // 4
        pl.DataFrame(
            {
                "key": rng.integers(0, 1000, n),
                "x": rng.random(n),
                "y": rng.integers(0, 100, n),
                "z": rng.random(n),
            }
        ).write_parquet(folder / f"part-{i}.parquet")
    return str(folder / "*.parquet")


@pytest.fixture()
def spmd() -> CudfPolarsEngine:
    return CudfPolarsEngine(backend="spmd", raise_on_fail=True)


@gpu_task
def summarise(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().group_by("key").agg(pl.col("x").sum(), pl.len().alias("n"))


def test_chain_on_the_gpu_equals_polars_on_the_cpu(spmd, big):
    @flow(task_runner=CudfPolarsTaskRunner(spmd))
    def pipeline():
        session = get_engine_session()
        r = execute(pl.scan_parquet(big).filter(pl.col("y") < 50), name="filtered")
        from cudf_polars.engine.persisted_result import PersistedQueryResult

        assert isinstance(r.persisted.query_result, PersistedQueryResult)
        assert r.backend == "spmd" and r.ranks == [0]
        s = summarise(r)
        return collect(s.lazy().sort("key")), session

    got, session = pipeline()
    expected = (
        pl.scan_parquet(big).filter(pl.col("y") < 50).group_by("key")
        .agg(pl.col("x").sum(), pl.len().alias("n")).sort("key").collect()
    )
    assert_frame_equal(got, expected, check_dtypes=False, rel_tol=1e-9)
    assert session.backend == "spmd" and session.closed
    # One rank, one GPU: its name and memory as nvidia-smi lists one of the GPUs.
    [gpu] = session.description["gpus"]
    name, gib = re.fullmatch(r"(.+) \((\d+\.\d) GiB\)", gpu).groups()
    listed = nvidia_smi.gpus()
    assert any(name == n and abs(float(gib) - mib / 1024) <= 0.06 for n, mib in listed), (gpu, listed)


def test_release_brings_rmm_allocation_back(spmd, big):
    with spmd.session() as session:
        start = session.memory_in_use()
        r = session.execute(pl.scan_parquet(big))
        held = session.memory_in_use()
        assert held - start > 50 * 2**20, (start, held)  # 5M rows x 4 cols of 8 bytes
        r.release()
        assert session.memory_in_use() == start
        assert r.state == "released"


def test_session_end_releases_live_results_and_the_drivers_figure_returns(spmd, big):
    with spmd.session() as warm_up:  # the CUDA context and the kernels a query loads stay with the process
        warm_up.execute(pl.scan_parquet(big)).release()
    before = nvidia_smi.device_memory_used_mib()
    with spmd.session() as session:
        live = [session.execute(pl.scan_parquet(big)) for _ in range(2)]
        assert session.memory_in_use() > session.memory["at_start"]
    summary = session.summary()
    held = sum(r.bytes for r in live)
    assert held > 100 * 2**20 and summary["memory"]["at_end"] - summary["memory"]["at_start"] >= held
    assert summary["peak_memory"] > summary["memory"]["at_start"] + 100 * 2**20
    # The engine and its memory resource are gone once the session has ended: the driver has it back.
    nvidia_smi.wait_back_to(before, 10, "the driver's figure after the session's end")
    assert summary["counts"]["released_unconsumed"] == 2
    assert [r.state for r in live] == ["released", "released"]
    with pytest.raises(ResultReleasedError, match="was released"):
        live[0].lazy()


def test_engine_lives_and_dies_on_the_owner_thread(spmd, big, monkeypatch):
    from cudf_polars.engine.spmd import SPMDEngine

    threads = []
    original = SPMDEngine.shutdown

    def spy(self):
        threads.append(threading.current_thread().name)
        original(self)

    monkeypatch.setattr(SPMDEngine, "shutdown", spy)

    @flow(task_runner=CudfPolarsTaskRunner(spmd))
    def pipeline():
        return collect(summarise(execute(pl.scan_parquet(big)))).height

    assert pipeline() == 1000
    assert len(threads) == 1 and threads[0].startswith("cudf-polars-engine-owner")


def test_a_frame_collected_twice_is_refused_with_result_consumed_error(spmd, big):
    with spmd.session() as session:
        r = session.execute(pl.scan_parquet(big).head(10))
        lf = r.lazy()
        session.collect(lf)
        with pytest.raises(ResultConsumedError, match=r"The query reads a GPU result that was already read by an "
                           r"earlier query: .*split it first with `tee\(result, 2\)`"):
            session.collect(lf)  # the store no longer holds its partitions
        with pytest.raises(ResultConsumedError, match="already read by a query that ran in this same thread"):
            r.lazy()


def test_pickling_a_gpu_result_is_refused(spmd, big):
    with spmd.session() as session:
        r = session.execute(pl.scan_parquet(big).head(10), name="ten")
        with pytest.raises(HostPersistenceError, match="GPU memory"):
            pickle.dumps(r)
        assert session.collect(r.lazy()).height == 10


def test_another_sessions_result_is_refused(spmd, big):
    errors = {}
    with spmd.session() as first:
        r = first.execute(pl.scan_parquet(big).head(10))

        def other():
            with CudfPolarsEngine(backend="spmd").session():
                try:
                    r.lazy()
                except WrongEngineError as exc:
                    errors["e"] = exc

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert r.state == "live"
        assert first.collect(r.lazy()).height == 10
    assert errors["e"].producer_session == first.id


def test_unsupported_query_fails_with_raise_on_fail(spmd, big):
    with spmd.session() as session:
        start = session.memory_in_use()
        query = pl.scan_parquet(big).select(pl.col("x").map_elements(lambda v: v * 2, return_dtype=pl.Float64))
        # cudf-polars 26.10 refuses the query while translating it, before anything runs.
        with pytest.raises(NotImplementedError, match="Query execution with GPU not possible: unsupported operations"):
            session.execute(query)
        assert session.memory_in_use() == start
        assert session.live_results == ()


def test_main_job_on_the_gpu_equals_plain_polars(nyc_paths, tmp_path):
    from pathlib import Path

    from prefect_cudf_polars.flows import flight_delay_report
    from prefect_cudf_polars.flows.report_queries import flight_delay_report_cpu

    CudfPolarsEngine(backend="spmd", raise_on_fail=True).save("main-job-gpu", overwrite=True)
    report = flight_delay_report(
        engine_block="main-job-gpu",
        output_dir=str(tmp_path),
        top=20,
        data_dir=str(Path(nyc_paths["flights"]).parent),
    )
    expected = flight_delay_report_cpu(nyc_paths, top=20)
    assert_frame_equal(report, expected, check_dtypes=False, rel_tol=1e-9)
