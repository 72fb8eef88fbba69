"""
The ``cpu`` backend: polars' CPU engine with cudf-polars' result semantics.

This backend exists so flows can be developed and tested on machines without a
GPU. It runs the same queries on polars' CPU engine and keeps results in a
process-local host store with exactly the rules of cudf-polars' persisted
results (``cudf_polars.engine.rank_local_store``, one rank): ``execute``
returns a one-shot result whose ``lazy()`` scan moves the data out of the
store, a second read raises cudf-polars' own message, and ``release()`` (or
the engine's shutdown, which closes its store) drops it. A result's frame
keeps the result alive until the frame is dropped, as cudf-polars' frames do.
With cudf-polars installed, each plan is also checked the way cudf-polars
would check it (:mod:`~prefect_cudf_polars.blocks.backends.gpu_support`).
Nothing here touches a GPU.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import polars as pl
from polars.io.plugins import register_io_source

from prefect_cudf_polars.blocks.backends.base import Reading, RunningEngine
from prefect_cudf_polars.blocks.backends.gpu_support import GPUSupportCheck
from prefect_cudf_polars.blocks.backends.plans import ZERO_COLUMN_MESSAGE, prepare
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import RUN_PRODUCER_AGAIN


#: cudf-polars 26.10's message for a second read of a persisted result (``rank_local_store``).
CONSUMED_MESSAGE = ("A persisted query result is consumed on read and cannot be scanned more than once (for example "
                    "a self-join, or collecting the same LazyFrame twice). Call engine.execute() again for a fresh "
                    "result.")

# One store per engine (its uid), each holding one partition per query id. Re-entrant:
# a result's weakref.finalize drops its partition, and Python may run finalizers during
# any allocation, also on a thread that holds the lock.
_stores: dict[str, dict[uuid.UUID, pl.DataFrame]] = {}
_lock = threading.RLock()


def held_partitions() -> int:
    """Partitions the ``cpu`` backend's engines of this process hold now (0 when every result is released)."""
    with _lock:
        return sum(len(store) for store in _stores.values())


def _drop(uid: str, query_id: uuid.UUID) -> None:
    with _lock:
        _stores.get(uid, {}).pop(query_id, None)


class HostPersistedResult:
    """
    Host-resident counterpart of cudf-polars' ``PersistedQueryResult``.

    Attributes
    ----------
    schema : polars.Schema
        Output schema.
    ranks : list of int
        ``[0]``: the ``cpu`` backend has one rank.
    rows, bytes : int
        Rows of the stored partition and its size (polars' ``estimated_size``).
    """

    #: The host store is where it stays (a move to host memory collects it to a host frame).
    moved_out = False

    def __init__(self, uid: str, df: pl.DataFrame) -> None:
        self._uid, self._query_id = uid, uuid.uuid4()
        self.schema, self.ranks = df.schema, [0]
        self.rows, self.bytes = df.height, df.estimated_size()
        with _lock:
            _stores[uid][self._query_id] = df
        self._finalizer = weakref.finalize(self, _drop, uid, self._query_id)

    def release(self) -> None:
        """Drop the stored partition now (idempotent)."""
        self._finalizer()

    def forget(self) -> None:
        """Let go without touching the store (its engine closed it)."""
        self._finalizer.detach()

    def clone(self) -> HostPersistedResult:
        """A new stored result holding a copy of this one's partition (which stays), as a device copy on a GPU."""
        with _lock:
            df = _stores.get(self._uid, {}).get(self._query_id)
        if df is None:
            raise RuntimeError("the result's partition has left the cpu backend's store (read or released)")
        return HostPersistedResult(self._uid, df.clone())

    @property
    def frame_source(self) -> HostPersistedResult:
        """This result: its frame's scan holds it."""
        return self

    def lazy(self) -> pl.LazyFrame:
        """A LazyFrame whose scan moves the partition out of the store; it keeps this result alive."""

        def source(with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None,
                   batch_size: int | None) -> Iterator[pl.DataFrame]:
            if with_columns is not None and len(with_columns) == 0:
                # cudf-polars 26.10's PersistedSource refuses this before it reads the partition.
                raise NotImplementedError(ZERO_COLUMN_MESSAGE)
            with _lock:
                store = _stores.get(self._uid)
                if store is None:
                    raise RuntimeError("The persisted query result's store no longer exists (its engine was shut "
                                       f"down since it produced the result): {RUN_PRODUCER_AGAIN}.")
                if self._query_id not in store:
                    raise RuntimeError(CONSUMED_MESSAGE)
                df = store.pop(self._query_id)
            if with_columns is not None:
                df = df.select(with_columns)
            if predicate is not None:
                df = df.filter(predicate)
            yield df if n_rows is None else df.head(n_rows)

        return register_io_source(source, schema=self.schema)


class CpuRunningEngine(RunningEngine):
    """
    A running ``cpu`` backend: one host store, and the GPU-support check where it can run.

    Parameters
    ----------
    gpu_support : GPUSupportCheck
        Checks each plan the way cudf-polars would.
    raise_on_fail : bool
        The block's ``raise_on_fail``: as on the GPU, ``execute`` refuses what
        cudf-polars cannot run whatever it is, ``collect`` only when it is True.
    """

    backend = "cpu"

    def __init__(self, gpu_support: GPUSupportCheck, raise_on_fail: bool) -> None:
        self.uid = uuid.uuid4().hex
        self.gpu_support, self.raise_on_fail = gpu_support, raise_on_fail
        with _lock:
            _stores[self.uid] = {}

    @property
    def engine(self) -> CpuRunningEngine:
        """The engine itself (a property: no reference cycle keeps an ended engine alive)."""
        return self

    def execute(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> HostPersistedResult:
        self.gpu_support.check(lf, flags)
        df = lf.collect(optimizations=flags)
        if self.memory_limit is not None and (need := self._need(df.estimated_size())) > self.memory_limit:
            # As rmm's LimitingResourceAdaptor refuses an allocation past the limit on a GPU backend.
            raise MemoryError(f"std::bad_alloc: out_of_memory: Exceeded memory limit (cpu backend: the held results "
                              f"and this one would take {need:,} bytes of device_memory_limit={self.memory_limit:,})")
        return HostPersistedResult(self.uid, df)

    def _need(self, size: int) -> int:
        """Bytes the store holds with ``size`` more, once :meth:`ask_room` was asked for what passes the limit (as the
        adaptor over the limit asks on ``spmd``)."""
        need = self.read().memory + size
        if need > self.memory_limit and self.ask_room(need - self.memory_limit):
            need = self.read().memory + size
        return need

    def copy(self, persisted: Any) -> HostPersistedResult:
        return persisted.clone()

    def check_plan(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags | None = None) -> None:
        # A deferred step's plan is checked as collect checks it (with raise_on_fail=False a
        # collect reader may fall back to the CPU; an execute reader refuses it then).
        flags = prepare(lf)[0] if flags is None else flags
        if self.raise_on_fail:
            self.gpu_support.check(lf, flags)

    def collect(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> pl.DataFrame:
        self.check_plan(lf, flags)
        return lf.collect(optimizations=flags)

    def read(self, persisted: Any = None) -> Reading:
        with _lock:
            held = sum(df.estimated_size() for df in _stores.get(self.uid, {}).values())
        rows, size = (None, None) if persisted is None else (persisted.rows, persisted.bytes)
        return Reading(held, rows, size, (held,), () if size is None else (size,))

    def describe(self) -> dict[str, Any]:
        note = ("polars CPU engine, host memory only: for developing and testing flows on machines without a GPU; "
                f"{self.gpu_support.status}")
        return {"backend": "cpu", "gpus": [], "ranks": 1, "versions": {"polars": pl.__version__}, "note": note}

    def shutdown(self) -> None:
        """Drop every stored result of this engine (idempotent)."""
        with _lock:
            _stores.pop(self.uid, None)


def start(block: CudfPolarsEngine, stack: ExitStack, limit: int | None = None) -> CpuRunningEngine:
    """Start the ``cpu`` backend (no GPU needed), with the GPU-support check where it can run; ``limit`` in bytes."""
    running = CpuRunningEngine(GPUSupportCheck.open(block), block.raise_on_fail)
    running.memory_limit = limit
    stack.callback(running.shutdown)
    return running
