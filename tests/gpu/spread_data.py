"""
Data spread over every rank, for the multi-GPU tests (Dask and Ray backends).

``target_partition_size`` is set low (16 MB) so 20M rows spread over all ranks;
cudf-polars' default (min(1.5 GB, 2.5 % of GPU memory)) keeps such data in one
partition on rank 0.
Test modules import the fixture (``from spread_data import data``).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

ROWS = 20_000_000
SMALL_PARTITIONS = 16_000_000


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """A glob of 16 parquet files, 20M rows of ``key``, ``x``, ``y`` in all."""
    folder = tmp_path_factory.mktemp("spread")
    rng = np.random.default_rng(1)
    n = ROWS // 16
    for i in range(16):
        pl.DataFrame(
            {"key": rng.integers(0, 1000, n), "x": rng.random(n), "y": rng.integers(0, 100, n)}
        ).write_parquet(folder / f"part-{i:02d}.parquet")
    return str(folder / "*.parquet")


def query(path: str) -> pl.LazyFrame:
    """The step that keeps a result on every rank: half of the rows."""
    return pl.scan_parquet(path).filter(pl.col("y") < 50)


def summary(lf: pl.LazyFrame) -> pl.LazyFrame:
    """The step that reads it: sums and counts per key, sorted."""
    return lf.group_by("key").agg(pl.col("x").sum(), pl.len()).sort("key")


def expected(path: str) -> pl.DataFrame:
    """Both steps on polars' CPU engine."""
    return summary(query(path)).collect()


def check_results_on_every_rank(session, path: str, ranks: int) -> None:
    """
    Run both steps in ``session``; check the result's partitions and memory on each rank.

    The kept result has a partition on every one of ``ranks`` ranks and holds
    memory on each (rmm statistics per rank, bytes); reading it brings every
    rank back to its figure before, and the summary equals polars' CPU engine.
    """
    start = session.run(lambda: list(session.running_engine.read().per_rank))
    r = session.execute(query(path), name="filtered")
    assert sorted(r.ranks) == list(range(ranks)) and r.partitions == ranks
    held = session.run(lambda: list(session.running_engine.read().per_rank))
    assert all(h > s for h, s in zip(held, start)), (start, held)
    got = session.collect(summary(r.lazy()))
    assert session.run(lambda: list(session.running_engine.read().per_rank)) == start
    assert_frame_equal(got, expected(path), check_dtypes=False, rel_tol=1e-9)
