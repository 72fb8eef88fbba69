"""The cpu backend's host store: a finalizer that runs while a store's lock is held does not deadlock."""

from __future__ import annotations

import gc
import threading
import uuid

import polars as pl

from prefect_cudf_polars.blocks.backends import host_store
from prefect_cudf_polars.blocks.backends.cpu import CpuEngine


def test_a_garbage_collection_inside_open_store_frees_results_without_deadlock(monkeypatch):
    engine = CpuEngine()
    persisted = engine.execute(pl.LazyFrame({"a": [1, 2, 3]}))

    class Cycle:
        pass

    cycle = Cycle()
    cycle.me, cycle.persisted = cycle, persisted  # only the garbage collector frees it
    del persisted, cycle

    original = host_store.HostStore.__init__

    def init_then_collect(self):  # Python may collect during any allocation under the lock
        original(self)
        gc.collect()

    monkeypatch.setattr(host_store.HostStore, "__init__", init_then_collect)
    done = threading.Event()

    def open_another():
        host_store.open_store(uuid.uuid4().hex)
        done.set()

    gc.disable()
    try:
        threading.Thread(target=open_another, daemon=True).start()
        assert done.wait(10), "open_store deadlocked on the finalizer of a collected result"
    finally:
        gc.enable()
    assert len(host_store.require_store(engine.uid)) == 0  # the finalizer dropped the partition
    engine.shutdown()
