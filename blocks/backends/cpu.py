"""
The ``cpu`` backend: polars' CPU engine with cudf-polars' result semantics.

This backend exists so flows can be developed and tested on machines without a
GPU. It runs the same queries on polars' CPU engine and keeps results in host
memory (:mod:`prefect_cudf_polars.blocks.backends.host_store`) with exactly the rules of
cudf-polars' persisted results: ``execute`` returns a one-shot result whose
``lazy()`` scan moves the data out of the store, a second read raises, and
``release()`` (or engine shutdown) drops it. A result's frame keeps the result
alive until the frame is dropped, as cudf-polars' frames do. Each plan is
prepared as the GPU engines prepare theirs
(:mod:`~prefect_cudf_polars.blocks.backends.result_scans`), and with cudf-polars
installed it is also checked the way cudf-polars would check it
(:mod:`~prefect_cudf_polars.blocks.backends.gpu_support`). Nothing here touches
a GPU.
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
from prefect_cudf_polars.blocks.backends.gpu_support import GPUSupportCheck
from prefect_cudf_polars.blocks.backends.result_scans import ZERO_COLUMN_MESSAGE, prepare

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
        """
        Return a LazyFrame whose scan moves the partition out of the store.

        The frame holds this result, so the partition stays until the frame is
        read or dropped (cudf-polars 26.10's ``PersistedQueryResult.lazy`` frames
        hold their result the same way).
        """
        owner = self

        def source(
            with_columns: list[str] | None,
            predicate: pl.Expr | None,
            n_rows: int | None,
            batch_size: int | None,
        ) -> Iterator[pl.DataFrame]:
            if with_columns is not None and len(with_columns) == 0:
                # cudf-polars 26.10's PersistedSource refuses this before it reads the partition.
                raise NotImplementedError(ZERO_COLUMN_MESSAGE)
            try:
                store = host_store.require_store(owner._uid)
            except KeyError:
                raise RuntimeError(
                    "The persisted query result's store no longer exists: the engine "
                    "was shut down since it produced the result. Run the task that "
                    "produced it again, in an open engine session."
                ) from None
            df = store.pop(owner._query_id)
            if with_columns is not None:
                df = df.select(with_columns)
            if predicate is not None:
                df = df.filter(predicate)
            if n_rows is not None:
                df = df.head(n_rows)
            yield df

        return register_io_source(source, schema=self.schema)


class CpuEngine:
    """
    polars' CPU engine with an ``execute`` that returns a host persisted result.

    Each instance owns one host store (``uid``), closed by :meth:`shutdown`.
    """

    def __init__(self) -> None:
        self.uid = uuid.uuid4().hex
        host_store.open_store(self.uid)

    def execute(
        self, lf: pl.LazyFrame, optimizations: pl.QueryOptFlags | None = None
    ) -> HostPersistedResult:
        """Run ``lf`` on the CPU (polars' ``optimizations``, default all) and keep the result in this engine's host store."""
        df = lf.collect(optimizations=pl.QueryOptFlags() if optimizations is None else optimizations)
        query_id = uuid.uuid4()
        host_store.require_store(self.uid).put(query_id, df)
        return HostPersistedResult(self.uid, query_id, df.schema)

    def collect(self, lf: pl.LazyFrame, optimizations: pl.QueryOptFlags | None = None) -> pl.DataFrame:
        """Run ``lf`` on the CPU (polars' ``optimizations``, default all) and return the DataFrame."""
        return lf.collect(optimizations=pl.QueryOptFlags() if optimizations is None else optimizations)

    def shutdown(self) -> None:
        """Drop every stored result of this engine (idempotent)."""
        host_store.close_store(self.uid)


class CpuRunningEngine(RunningEngine):
    """
    A running ``cpu`` backend.

    Parameters
    ----------
    engine : CpuEngine
    gpu_support : GPUSupportCheck
        Checks each plan the way cudf-polars would (where it can run here).
    raise_on_fail : bool
        The block's ``raise_on_fail``: as on the GPU, ``execute`` refuses what
        cudf-polars cannot run whatever it is, ``collect`` only when it is True.
    """

    backend = "cpu"

    def __init__(self, engine: CpuEngine, gpu_support: GPUSupportCheck, raise_on_fail: bool) -> None:
        self.engine = engine
        self.gpu_support = gpu_support
        self.raise_on_fail = raise_on_fail

    def execute(self, lf: pl.LazyFrame) -> Any:
        flags = prepare(lf)
        self.gpu_support.check(lf, flags)
        return self.engine.execute(lf, flags)

    def check_plan(self, lf: pl.LazyFrame) -> None:
        # A deferred step's plan: checked as collect checks it (with raise_on_fail=False
        # a collect reader may fall back to the CPU; an execute reader refuses it then).
        flags = prepare(lf)
        if self.raise_on_fail:
            self.gpu_support.check(lf, flags)

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        flags = prepare(lf)
        if self.raise_on_fail:
            self.gpu_support.check(lf, flags)
        return self.engine.collect(lf, flags)

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
                f"flows on machines without a GPU; {self.gpu_support.status}"
            ),
        }

    def shutdown(self) -> None:
        self.engine.shutdown()


def start(block: CudfPolarsEngine) -> CpuRunningEngine:
    """Start the ``cpu`` backend (no GPU needed), with the GPU-support check where it can run."""
    return CpuRunningEngine(CpuEngine(), GPUSupportCheck.open(block), block.raise_on_fail)
