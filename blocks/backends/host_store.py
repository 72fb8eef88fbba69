"""
Process-local host store for the ``cpu`` backend's results.

It mirrors cudf-polars' ``cudf_polars.engine.rank_local_store``: one store per
engine (keyed by the engine's ``uid``), each holding one partition per query id,
moved out on read. The ``cpu`` backend has a single rank (rank 0), so a query
id maps straight to its partition.

The locks are re-entrant: a persisted result's ``weakref.finalize`` drops its
partition, and Python may run finalizers during any allocation, also on a
thread that already holds a store's lock.
"""

from __future__ import annotations

import threading
import uuid

import polars as pl

CONSUMED_MESSAGE = (
    "A persisted query result is consumed on read and cannot be scanned more "
    "than once (for example a self-join, or collecting the same LazyFrame "
    "twice). Call engine.execute() again for a fresh result."
)


class HostStore:
    """One engine's host-resident partitions, keyed by query id."""

    def __init__(self) -> None:
        self._partitions: dict[uuid.UUID, pl.DataFrame] = {}
        self._lock = threading.RLock()

    def put(self, query_id: uuid.UUID, df: pl.DataFrame) -> None:
        """Store the partition of ``query_id``."""
        with self._lock:
            self._partitions[query_id] = df

    def pop(self, query_id: uuid.UUID) -> pl.DataFrame:
        """
        Remove and return the partition of ``query_id``.

        Raises
        ------
        RuntimeError
            If the partition was already read or dropped (same text as
            cudf-polars' rank-local store).
        """
        with self._lock:
            try:
                return self._partitions.pop(query_id)
            except KeyError:
                raise RuntimeError(CONSUMED_MESSAGE) from None

    def drop(self, query_id: uuid.UUID) -> None:
        """Drop the partition of ``query_id`` (idempotent)."""
        with self._lock:
            self._partitions.pop(query_id, None)

    def nbytes(self) -> int:
        """Estimated bytes held by the stored partitions (polars' ``estimated_size``)."""
        with self._lock:
            return sum(df.estimated_size() for df in self._partitions.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._partitions)


_stores: dict[str, HostStore] = {}
_stores_lock = threading.RLock()


def open_store(uid: str) -> HostStore:
    """Return the store of engine ``uid``, creating it if absent."""
    with _stores_lock:
        return _stores.setdefault(uid, HostStore())


def require_store(uid: str) -> HostStore:
    """
    Return the store of engine ``uid``.

    Raises
    ------
    KeyError
        If the engine has been shut down (its store closed).
    """
    with _stores_lock:
        return _stores[uid]


def close_store(uid: str) -> None:
    """Drop the store of engine ``uid`` and everything in it (idempotent)."""
    with _stores_lock:
        _stores.pop(uid, None)


def total_partitions() -> int:
    """Partitions held by every store of this process (0 when all are released)."""
    with _stores_lock:
        stores = list(_stores.values())
    return sum(len(s) for s in stores)


def drop_if_open(uid: str, query_id: uuid.UUID) -> None:
    """Drop ``query_id`` from engine ``uid``'s store if the store still exists."""
    with _stores_lock:
        store = _stores.get(uid)
    if store is not None:
        store.drop(query_id)
