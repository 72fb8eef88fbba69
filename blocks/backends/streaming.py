"""
The adapter over cudf-polars' streaming engines (``SPMDEngine``, ``DaskEngine``, ``RayEngine``), and the ``spmd`` backend.

The ``spmd`` backend is cudf-polars' ``SPMDEngine`` in this process: started
without ``rrun`` (cudf-polars 26.10) it runs one rank on one GPU. ``dask/`` and
``ray/`` build their engines in their own modules and wrap them here. The
cudf-polars internals all three share are reached through
:mod:`~prefect_cudf_polars.blocks.backends.compat`.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

import polars as pl

from prefect_cudf_polars.blocks.backends import compat
from prefect_cudf_polars.blocks.backends.base import Reading, RunningEngine
from prefect_cudf_polars.blocks.backends.environment import apply_environment_on_rank, restore_environment_on_rank
from prefect_cudf_polars.blocks.backends.probe import gpu_memory_bytes, host_memory_per_gpu
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.memory_demand import listen


def rapids_versions() -> dict[str, str]:
    """Versions of polars and the RAPIDS packages in use."""
    from importlib.metadata import PackageNotFoundError, version

    import cudf_polars

    versions = {"polars": pl.__version__, "cudf-polars": cudf_polars.__version__}
    for dist in ("rmm-cu13", "rmm-cu12", "rapidsmpf-cu13", "rapidsmpf-cu12", "dask-cuda"):
        with contextlib.suppress(PackageNotFoundError):
            versions[dist] = version(dist)
    return versions


def silence_unstable_warning() -> None:
    """
    Ignore cudf-polars' ``UnstableWarning`` for ``engine.execute()`` in this process.

    This package is built on ``execute()``; the warning says nothing a flow's
    user can act on, and its stack level points into Prefect.
    """
    from cudf_polars.unstable import UnstableWarning

    warnings.filterwarnings("ignore", category=UnstableWarning)


#: Pack a moved partition into device memory, then copy it to pinned memory with one DMA copy; else (the default)
#: pack straight into pinned memory, which needs no second device copy of the partition.
PACK_VIA_DEVICE = False
#: rmm pool sizes are multiples of this (bytes).
PINNED_ALIGNMENT = 256
#: The pinned pool's first size (bytes); it grows by its own size as moves need
#: (:meth:`StreamingRunningEngine.pinned_pool`).
PINNED_FIRST = 2**30
#: rapidsmpf runs a higher priority's spill function first; cudf-polars 26.10 registers a query's buffers at 0.
HELD_RESULTS_SPILL_PRIORITY = 1


class StreamingPersistedResult:
    """
    cudf-polars' ``PersistedQueryResult`` as the session sees it.

    Attributes
    ----------
    query_result : PersistedQueryResult
        What ``engine.execute(lf)`` returned.
    schema : polars.Schema
    ranks : list of int
    key : tuple of (str, str)
        Its store uid and query id, as :func:`~prefect_cudf_polars.blocks.backends.compat.rank_reading` takes them.
    """

    __slots__ = ("key", "packed", "query_result", "ranks", "schema")

    def __init__(self, query_result: Any) -> None:
        self.query_result = query_result
        self.schema, self.ranks, self.key = compat.persisted_layout(query_result)
        self.packed: list[compat.PackedPartition] | None = None  # its partitions while in pinned host memory

    @property
    def moved_out(self) -> bool:
        return self.packed is not None

    @property
    def frame_source(self) -> Any:
        return self.query_result  # cudf-polars 26.10: each rank's loader in the frame's scan holds it

    def lazy(self) -> pl.LazyFrame:
        return self.query_result.lazy()

    def release(self) -> None:
        # cudf-polars 26.10: idempotent, never raises (weakref.finalize). Pinned buffers go back to their pool.
        self.packed = None
        self.query_result.release()

    def forget(self) -> None:
        self.packed = None
        compat.forget_persisted(self.query_result)


class StreamingRunningEngine(RunningEngine):
    """
    A started cudf-polars streaming engine; its shutdown is in the host's exit stack.

    Build it before the engine (it goes on the host's exit stack first, so it
    acts last), then :meth:`enter` the engine. Every persisted result the engine
    produces is known here, also one only a LazyFrame or a lineage still holds:

    * after the engine's shutdown (which closes every persisted partition's
      store, cudf-polars 26.10.2), their finalizers are detached on the owner
      thread, so no finalizer calls the shut-down engine and nothing of ours
      keeps its backend (on ``spmd``, the rapidsmpf ``Context`` and its memory
      resource) alive past it;
    * on ``ray``, they are released before the shutdown: a release after it
      calls an actor, which starts a new local Ray (Ray 2.60).

    Building it also silences cudf-polars' ``UnstableWarning`` (:func:`silence_unstable_warning`).

    Parameters
    ----------
    backend : str
        ``"spmd"``, ``"dask"`` or ``"ray"``.
    stack : contextlib.ExitStack
        The host's exit stack.
    memory_limit : int, optional
        ``device_memory_limit`` in bytes, which the engine is held to.

    Attributes
    ----------
    extra : dict
        Backend facts for logs and artifacts (the Dask dashboard, the cluster); empty until the backend sets them.
    """

    def __init__(self, backend: str, stack: ExitStack, memory_limit: int | None = None) -> None:
        silence_unstable_warning()
        self.backend, self.memory_limit = backend, memory_limit
        self.engine: Any = None
        self._pinned: Any = None  # the pinned host memory pool of moved results, made at the first move
        self._pinned_lock = threading.Lock()
        self.extra: dict[str, Any] = {}
        self._produced: weakref.WeakSet[Any] = weakref.WeakSet()
        stack.callback(lambda: [compat.forget_persisted(qr) for qr in list(self._produced)])

    def enter(self, engine: Any, stack: ExitStack) -> StreamingRunningEngine:
        """Take ``engine`` (created on the owner thread) and put its shutdown on ``stack``; returns self."""
        self.engine = stack.enter_context(engine)
        if self.backend == "ray":
            stack.callback(lambda: [qr.release() for qr in list(self._produced)])
        return self

    def execute(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> StreamingPersistedResult:
        if not (flags.slice_pushdown and flags.comm_subplan_elim):  # execute() takes no flags: carry them
            lf = compat.with_optimizations(lf, flags)
        return self._produced_result(self.engine.execute(lf))

    def collect(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> pl.DataFrame:
        return lf.collect(engine=self.engine, optimizations=flags)

    def move_out(self, persisted: Any, pool_bytes: int) -> bool:
        # spmd's one rank is this process; on dask and ray the partitions live in the ranks' processes.
        if self.backend != "spmd" or persisted.packed is not None:
            return False
        persisted.packed = compat.pack_partitions(persisted.query_result, self.pinned_pool(pool_bytes), take=True,
                                                  via_device=PACK_VIA_DEVICE)
        return True

    def move_back(self, persisted: Any) -> None:
        if (packed := persisted.packed) is not None:
            compat.unpack_partitions(persisted.query_result, packed, device_copy=True)
            persisted.packed = None  # its pinned buffers go back to the pool

    def copy(self, persisted: Any) -> StreamingPersistedResult | None:
        if self.backend != "spmd" or persisted.packed is not None:
            return None
        return self._produced_result(compat.copy_persisted(persisted.query_result))

    def _produced_result(self, query_result: Any) -> StreamingPersistedResult:
        """``query_result``, which this engine just produced, as the session sees it; its shutdown knows it too."""
        self._produced.add(query_result)
        return StreamingPersistedResult(query_result)

    def pinned_pool(self, pool_bytes: int) -> Any:
        """
        The engine's pool of pinned host memory for moved results, made at the first move: an
        ``rmm.mr.PoolMemoryResource`` over ``PinnedHostMemoryResource`` (``cudaHostAlloc``) under a
        ``LimitingResourceAdaptor`` at ``pool_bytes``. rmm 26.10's pool with no maximum grows by its own size (or the
        request); a growth past the limit fails and the pool tries half as much, down to the request. So the pool
        pins about twice the most that moved results held at once, never more than ``pool_bytes``, and keeps it
        (a pool with a maximum would pin half of what is left below it at its first growth).
        """
        with self._pinned_lock:  # a move on a running query's demand may come from any of the engine's threads
            if self._pinned is None:
                import rmm.mr

                most = max(pool_bytes // PINNED_ALIGNMENT * PINNED_ALIGNMENT, PINNED_ALIGNMENT)
                pinned = rmm.mr.LimitingResourceAdaptor(rmm.mr.PinnedHostMemoryResource(), allocation_limit=most)
                self._pinned = rmm.mr.PoolMemoryResource(pinned, initial_pool_size=min(PINNED_FIRST, most))
            return self._pinned

    def read(self, persisted: Any = None) -> Reading:
        key = persisted.key if persisted is not None else ()
        per_rank = ([compat.rank_reading(*key)] if self.backend == "spmd"  # one rank, this process: no collective
                    else compat.run_on_ranks(self.engine, compat.rank_reading, *key))
        memory = [r[0] for r in per_rank]
        total = None if None in memory else sum(memory)
        if persisted is None:
            return Reading(total, per_rank=tuple(memory))
        sizes = tuple(r[2] or 0 for r in per_rank)
        return Reading(total, sum(r[1] for r in per_rank), sum(sizes), tuple(memory), sizes)

    def set_rank_environment(self, env: Mapping[str, str | None]) -> None:
        if self.backend != "spmd":  # spmd's one rank is this process
            compat.run_on_ranks(self.engine, apply_environment_on_rank, dict(env))

    def restore_rank_environment(self) -> None:
        if self.backend != "spmd":
            compat.run_on_ranks(self.engine, restore_environment_on_rank)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "gpus": compat.run_on_ranks(self.engine, compat.rank_device_name),
                "ranks": self.engine.nranks, "versions": rapids_versions(),
                "note": f"cudf-polars {type(self.engine).__name__}, results stay in GPU memory", **self.extra}


def limited_engine_kwargs(block: CudfPolarsEngine, limit: int | None, demand: str | None = None) -> dict[str, Any]:
    """``block.engine_kwargs`` with ``limit`` (bytes), the GPU's memory and the host memory per GPU read here, and
    the ``demand`` key of the listener an allocation past the limit asks for room."""
    if limit is None:  # nothing to size: no probe at the engine's start
        return block.engine_kwargs()
    return block.engine_kwargs(limit, device_total=gpu_memory_bytes(), host_total=host_memory_per_gpu("spmd"),
                               demand=demand)


def start(block: CudfPolarsEngine, stack: ExitStack, limit: int | None = None) -> StreamingRunningEngine:
    """
    Create an ``SPMDEngine`` from the block's options (call on the owner thread); its shutdown goes on ``stack``.

    With a ``limit`` and ``spill_results="host"``, an allocation that would pass the limit asks the running
    engine's :attr:`~prefect_cudf_polars.blocks.backends.base.RunningEngine.room_wanted` for room first
    (:mod:`~prefect_cudf_polars.blocks.memory_demand`), and so does rapidsmpf's spill manager when a reservation
    passes ``spill_device_limit``, before it spills the running query's own buffers (rapidsmpf 26.10's
    ``engine.context.br().spill_manager.add_spill_function``).
    """
    from cudf_polars.engine.spmd import SPMDEngine

    running = StreamingRunningEngine("spmd", stack, limit)
    demand = listen(running.ask_room, stack) if limit is not None and block.spill_results == "host" else None
    running.enter(SPMDEngine(**limited_engine_kwargs(block, limit, demand)), stack)
    if demand is not None:  # rapidsmpf's reservations ask too, held results before a query's own buffers
        spill_manager = running.engine.context.br().spill_manager
        stack.callback(spill_manager.remove_spill_function,
                       spill_manager.add_spill_function(running.ask_room, HELD_RESULTS_SPILL_PRIORITY))
    return running
