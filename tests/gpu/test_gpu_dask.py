"""
The ``dask`` backend on every visible GPU (2 on the lent ``nvidia-h200-x2``, any N >= 2).

Skipped without a GPU (conftest) and with fewer than two GPUs (here).
``target_partition_size`` is set low (16 MB) so 20M rows spread over all ranks;
cudf-polars' default (1.5 GB on an H200) keeps such data in one partition on rank 0.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from processes import child_pids, wait_gone
from polars.testing import assert_frame_equal

from prefect_cudf_polars.blocks import CudfPolarsEngine, gpu_probe

GPUS = gpu_probe.count_gpus()[0]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS < 2, reason="needs two GPUs or more"),
]

ROWS = 20_000_000
SMALL_PARTITIONS = 16_000_000


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("spread")
    rng = np.random.default_rng(1)
    n = ROWS // 16
    for i in range(16):
        pl.DataFrame(
            {"key": rng.integers(0, 1000, n), "x": rng.random(n), "y": rng.integers(0, 100, n)}
        ).write_parquet(folder / f"part-{i:02d}.parquet")
    return str(folder / "*.parquet")


def _query(path: str) -> pl.LazyFrame:
    return pl.scan_parquet(path).filter(pl.col("y") < 50)


def _expected(path: str) -> pl.DataFrame:
    return _query(path).group_by("key").agg(pl.col("x").sum(), pl.len()).sort("key").collect()


def test_auto_with_several_gpus_is_dask_over_all_ranks_and_owned_cluster_goes_away(data):
    before = child_pids()
    block = CudfPolarsEngine(backend="auto", target_partition_size=SMALL_PARTITIONS)
    with block.session() as session:
        assert session.backend == "dask" and session.description["ranks"] == GPUS
        assert "owned" in session.description["cluster"] and session.description["dashboard"]
        start = session.run(session._running.memory_per_rank)
        r = session.execute(_query(data), name="filtered")
        assert sorted(r.ranks) == list(range(GPUS)) and r.partitions == GPUS
        held = session.run(session._running.memory_per_rank)
        assert all(h > s for h, s in zip(held, start)), (start, held)
        got = session.collect(r.lazy().group_by("key").agg(pl.col("x").sum(), pl.len()).sort("key"))
        assert session.run(session._running.memory_per_rank) == start
        live = session.execute(_query(data))
        assert sorted(live.ranks) == list(range(GPUS))
        cluster_pids = child_pids() - before
    assert live.state == "released"
    assert session.memory["before_shutdown"] == session.memory["at_start"]
    assert_frame_equal(got, _expected(data), check_dtypes=False, rel_tol=1e-9)
    assert wait_gone(cluster_pids) == set(), "owned cluster processes left behind"


def test_external_cluster_stays_up_and_holds_none_of_our_results(data):
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    def stored_partitions() -> int:
        from cudf_polars.engine import rank_local_store

        return sum(len(s._partitions) for s in rank_local_store._stores.values())

    with LocalCUDACluster(threads_per_worker=1) as cluster, Client(cluster) as ours:
        block = CudfPolarsEngine(
            backend="dask",
            dask_scheduler_address=cluster.scheduler_address,
            target_partition_size=SMALL_PARTITIONS,
        )
        with block.session() as session:
            assert "external" in session.description["cluster"]
            kept = session.execute(_query(data))
            assert sorted(kept.ranks) == list(range(GPUS))
            assert sum(ours.run(stored_partitions).values()) >= GPUS
        assert kept.state == "released"
        assert sum(ours.run(stored_partitions).values()) == 0
        assert len(ours.scheduler_info()["workers"]) == GPUS
        assert ours.submit(sum, [1, 2]).result(timeout=60) == 3
        assert session.memory["before_shutdown"] == session.memory["at_start"]
