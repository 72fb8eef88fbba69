"""
The ``cpu`` backend: polars' CPU engine with cudf-polars' result semantics.

This backend exists so flows can be developed and tested on machines without a
GPU. It runs the same queries on polars' CPU engine and keeps results in host
memory (:mod:`prefect_cudf_polars.blocks.backends.host_store`) with exactly the rules of
cudf-polars' persisted results: ``execute`` returns a one-shot result whose
``lazy()`` scan moves the data out of the store, a second read raises, and
``release()`` (or engine shutdown) drops it. Nothing here touches a GPU.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import polars as pl
from polars.io.plugins import register_io_source

from prefect_cudf_polars.blocks.backends import host_store
from prefect_cudf_polars.blocks.backends.base import RunningEngine

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine


class HostPersistedResult:
    """
    Host-resident counterpart of cudf-polars' ``PersistedQueryResult``.

    Parameters
    ----------
    uid
        Id of the producing engine's host store.
    query_id
        Id of the query; keys the stored partition.
    schema
        Output schema.

    Attributes
    ----------
    schema : polars.Schema
        Output schema.
    ranks : list of int
        ``[0]``: the ``cpu`` backend has one rank.
    """

    def __init__(self, uid: str, query_id: uuid.UUID, schema: pl.Schema) -> None:
        self._uid = uid
        self._query_id = query_id
        self.schema = schema
        self.ranks = [0]
        self._finalizer = weakref.finalize(self, host_store.drop_if_open, uid, query_id)

    def release(self) -> None:
        """Drop the stored partition now (idempotent)."""
        self._finalizer()

    def lazy(self) -> pl.LazyFrame:
        """Return a LazyFrame whose scan moves the partition out of the store."""
        uid, query_id, schema = self._uid, self._query_id, self.schema

        def source(
            with_columns: list[str] | None,
            predicate: pl.Expr | None,
            n_rows: int | None,
            batch_size: int | None,
        ) -> Iterator[pl.DataFrame]:
            try:
                store = host_store.require_store(uid)
            except KeyError:
                raise RuntimeError(
                    "The persisted query result's store no longer exists: the engine "
                    "was shut down since it produced the result."
                ) from None
            df = store.pop(query_id)
            if with_columns is not None:
                df = df.select(with_columns)
            if predicate is not None:
                df = df.filter(predicate)
            if n_rows is not None:
                df = df.head(n_rows)
            yield df

        return register_io_source(source, schema=schema)


class CpuEngine:
    """
    polars' CPU engine with an ``execute`` that returns a host persisted result.

    Each instance owns one host store (``uid``), closed by :meth:`shutdown`.
    """

    def __init__(self) -> None:
        self.uid = uuid.uuid4().hex
        host_store.open_store(self.uid)

    def execute(self, lf: pl.LazyFrame) -> HostPersistedResult:
        """Run ``lf`` on the CPU and keep the result in this engine's host store."""
        df = lf.collect()
        query_id = uuid.uuid4()
        host_store.require_store(self.uid).put(query_id, df)
        return HostPersistedResult(self.uid, query_id, df.schema)

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        """Run ``lf`` on the CPU and return the DataFrame."""
        return lf.collect()

    def shutdown(self) -> None:
        """Drop every stored result of this engine (idempotent)."""
        host_store.close_store(self.uid)


class CpuRunningEngine(RunningEngine):
    """A running ``cpu`` backend."""

    backend = "cpu"

    def __init__(self, engine: CpuEngine) -> None:
        self.engine = engine

    def execute(self, lf: pl.LazyFrame) -> Any:
        return self.engine.execute(lf)

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        return self.engine.collect(lf)

    def memory_in_use(self) -> int | None:
        try:
            return host_store.require_store(self.engine.uid).nbytes()
        except KeyError:
            return 0

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "cpu",
            "gpus": [],
            "ranks": 1,
            "versions": {"polars": pl.__version__},
            "note": (
                "polars CPU engine, host memory only: for developing and testing "
                "flows on machines without a GPU"
            ),
        }

    def shutdown(self) -> None:
        self.engine.shutdown()


def start(block: CudfPolarsEngine) -> CpuRunningEngine:
    """Start the ``cpu`` backend (no GPU needed)."""
    return CpuRunningEngine(CpuEngine())
