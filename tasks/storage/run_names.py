"""
Readable names for the storage tasks' results and task runs: named after the data they move.

``read_parquet("s3://lake/trips/")`` runs as ``read-parquet-trips`` and returns a
result named ``trips``; ``sink_parquet(trips, ...)`` runs as ``sink-parquet-trips``.
Names are kept apart within a session as for every GPU task run
(:mod:`~prefect_cudf_polars.tasks.run_names`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import takewhile
from pathlib import PurePosixPath
from typing import Any

from prefect_cudf_polars.tasks.run_names import distinct_run_name, result_name
from prefect_cudf_polars.tasks.storage.location import GLOB

_PARQUET_SUFFIXES = (".parquet", ".pq")


def _one_name(source: str) -> str:
    path = PurePosixPath(source.removeprefix("s3://").rstrip("/"))
    # trips/*.parquet, trips/2024-*/part.parquet: the folder above the pattern
    parts = tuple(takewhile(lambda part: not GLOB.search(part), path.parts))
    if not parts:
        return "parquet"
    last = PurePosixPath(parts[-1])
    return last.stem if last.suffix in _PARQUET_SUFFIXES else parts[-1]


def source_name(source: str | Sequence[str]) -> str:
    """
    A readable name for parquet sources: the file's stem, or the folder or prefix's name.

    Parameters
    ----------
    source : str or sequence of str
        Local paths or ``s3://`` URLs, as :func:`~prefect_cudf_polars.tasks.read_parquet` takes them.

    Returns
    -------
    str
        ``"orders"`` for ``data/orders.parquet``, ``"trips"`` for ``s3://lake/trips/``
        or ``s3://lake/trips/*.parquet``; for several sources the first one's name
        and how many more (``"jan-and-2-more"``); ``"parquet"`` when nothing is left.
    """
    sources = [source] if isinstance(source, str) else [str(s) for s in source]
    first = _one_name(sources[0]) if sources else "parquet"
    return first if len(sources) <= 1 else f"{first}-and-{len(sources) - 1}-more"


def read_parquet_run_name(parameters: dict[str, Any]) -> str:
    """``read_parquet``: ``"read-parquet-<name>"``, the name being the ``name`` argument or the sources'."""
    return distinct_run_name(f"read-parquet-{parameters.get('name') or source_name(parameters.get('source') or [])}")


def sink_parquet_run_name(parameters: dict[str, Any]) -> str:
    """``sink_parquet``: ``"sink-parquet-<the result's name>"``."""
    return distinct_run_name(f"sink-parquet-{result_name(parameters.get('result')) or 'result'}")
