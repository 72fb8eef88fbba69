"""Queries that keep the engine busy for a known time, for the lifecycle tests."""

from __future__ import annotations

import time

import polars as pl


def sleeping(lf: pl.LazyFrame, seconds: float, column: str = "amount") -> pl.LazyFrame:
    """
    ``lf`` whose ``column`` is computed by a Python function that sleeps ``seconds``.

    The sleep happens inside the engine call, on whichever thread runs the query
    (the session's owner thread). polars runs the function on the CPU, so this is
    for the ``cpu`` backend only.
    """

    def sleepy(s: pl.Series) -> pl.Series:
        time.sleep(seconds)
        return s

    return lf.with_columns(pl.col(column).map_batches(sleepy, return_dtype=lf.collect_schema()[column]))


def heavy_group_by(rows: int) -> pl.LazyFrame:
    """
    A high-cardinality group-by over ``rows`` random rows (``rows // 4`` distinct keys).

    The data is built on the host here, so a task that runs the returned frame
    spends its time in the engine call (on a GPU: transfer, shuffle, hash
    aggregation), which grows with ``rows``.
    """
    import numpy as np

    rng = np.random.default_rng(rows)
    data = pl.LazyFrame({"k": rng.integers(0, max(rows // 4, 1), rows), "x": rng.random(rows)})
    return data.group_by("k").agg(pl.col("x").sum().alias("total"), pl.col("x").max().alias("top"), pl.len())
