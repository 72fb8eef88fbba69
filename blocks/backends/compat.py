"""
Every private attribute of polars, cudf-polars, Ray, Prefect and CPython that this package reaches, in one place.

Each function names the version it was checked against. Nothing else in the
package touches a third party's private names; when one of these versions
changes, this module is where to look.

The ``rank_*`` functions run on every rank of an engine (in this process for
``spmd``, on Dask workers and Ray actors otherwise), so they are module-level
and import only what they use.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

import polars as pl


# ---- polars 1.44.2 -------------------------------------------------------------------
def with_optimizations(lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> pl.LazyFrame:
    """
    ``lf`` carrying ``flags``, for an engine call that takes no optimization flags.

    cudf-polars 26.10's ``engine.execute(lf)`` translates ``lf._ldf.visit()``,
    which plans with the flags stored in the frame; polars 1.44.2's private
    ``LazyFrame._ldf.with_optimizations`` sets them, as its own ``collect`` does.
    """
    return pl.LazyFrame._from_pyldf(lf._ldf.with_optimizations(flags._pyoptflags))


def plan_visitor(lf: pl.LazyFrame) -> Any:
    """polars 1.44.2's ``lf._ldf.visit()``: the optimized plan as cudf-polars' ``Translator`` reads it."""
    return lf._ldf.visit()


# ---- cudf-polars 26.10.2 ---------------------------------------------------------------
def persisted_layout(query_result: Any) -> tuple[pl.Schema, list[int], tuple[str, str]]:
    """
    A ``PersistedQueryResult``'s output schema, producing ranks, and store uid and query id (for :func:`rank_reading`).

    ``_schema``, ``_ranks``, ``_uid``, ``_query_id``: no public accessor.
    """
    return pl.Schema(query_result._schema), list(query_result._ranks), (query_result._uid, str(query_result._query_id))


def forget_persisted(query_result: Any) -> None:
    """
    Detach a ``PersistedQueryResult``'s finalizer without running it (``_finalizer.detach()``).

    For results whose engine has shut down: ``shutdown`` already closed every
    store (SPMD ``_drop_persisted``, Dask ``_teardown_worker``, Ray
    ``close_all``), and the finalizer would call the shut-down engine (Ray's
    would start a new local Ray). Detaching also drops the finalizer's
    reference to the engine's backend, so the engine can be freed.
    """
    query_result._finalizer.detach()


class PackedPartition(NamedTuple):
    """One rank's partition of a persisted result, packed into one buffer (:func:`pack_partitions`)."""

    rank: int
    duplicated: bool
    names: list[str]
    dtypes: list[Any]
    metadata: memoryview
    data: Any  # a pylibcudf gpumemoryview over the buffer (pinned host or device memory)


def _store_of(query_result: Any) -> Any:
    """This process's ``RankLocalStore`` of a ``PersistedQueryResult`` (``_uid``); ``KeyError`` once it closed."""
    from cudf_polars.engine import rank_local_store

    return rank_local_store.require_store(query_result._uid)


def pack_partitions(query_result: Any, mr: Any = None, *, take: bool, via_device: bool = False) -> list[PackedPartition]:
    """
    This process's partitions of a ``PersistedQueryResult``, each packed into one buffer from ``mr``.

    cudf-polars 26.10.2 keeps a partition as ``RankLocalStore._partitions[query_id][rank] = (DataFrame,
    duplicated)`` (``engine/rank_local_store.py``; ``_query_id``, ``_partitions``: no public accessor).
    pylibcudf's ``contiguous_split.pack(table, stream, mr)`` writes the columns into one allocation of ``mr``
    (``None``: the current device resource). With a pinned host resource it packs straight into pinned memory;
    ``via_device`` packs into device memory first and copies that buffer out with one DMA copy
    (``rmm.DeviceBuffer(ptr=, size=, mr=)``). With ``take`` the partitions leave the store (their device memory is
    freed once packed); else they stay, as they do when a pack fails. Call on the rank's process (``spmd``: this
    one), on the engine's owner thread or, while a query runs, on the thread it allocates on.
    """
    import pylibcudf as plc
    import rmm

    store = _store_of(query_result)
    packed = []
    for rank, (df, duplicated) in sorted(store._partitions.get(query_result._query_id, {}).items()):
        metadata, data = plc.contiguous_split.pack(df.table, stream=df.stream, mr=None if via_device else mr).release()
        if via_device and mr is not None:
            data = plc.gpumemoryview(rmm.DeviceBuffer(ptr=data.ptr, size=data.nbytes, stream=df.stream, mr=mr))
        df.stream.synchronize()
        packed.append(PackedPartition(rank, duplicated, list(df.column_names), list(df.dtypes), metadata, data))
    if take:
        for part in packed:
            store.pop(query_result._query_id, part.rank)
    return packed


def unpack_partitions(query_result: Any, packed: list[PackedPartition], *, device_copy: bool) -> None:
    """
    Put ``packed`` (:func:`pack_partitions`) into the store under the result's query id, as each partition was.

    With ``device_copy`` each buffer is first copied into device memory from the current device resource
    (``rmm.DeviceBuffer(ptr=, size=)``: from pinned host memory, one DMA copy). pylibcudf's
    ``unpack_from_memoryviews`` rebuilds the table on the buffer without a copy; cudf-polars 26.10.2's
    ``DataFrame.from_table`` gives it the partition's names and dtypes, and ``RankLocalStore.put`` its
    ``duplicated`` flag: the result's ``lazy()`` frames read it as before.
    """
    import pylibcudf as plc
    import rmm
    from cudf_polars.containers import DataFrame
    from cudf_polars.utils.cuda_stream import get_cuda_stream

    store, stream = _store_of(query_result), get_cuda_stream()
    for part in packed:
        data = plc.gpumemoryview(rmm.DeviceBuffer(ptr=part.data.ptr, size=part.data.nbytes, stream=stream)) \
            if device_copy else part.data
        table = plc.contiguous_split.unpack_from_memoryviews(part.metadata, data, stream)
        store.put(query_result._query_id, part.rank, DataFrame.from_table(table, part.names, part.dtypes, stream),
                  duplicated=part.duplicated)
    stream.synchronize()


def copy_persisted(query_result: Any) -> Any:
    """
    A new ``PersistedQueryResult`` of the same engine holding deep device copies of this process's partitions.

    cudf-polars 26.10.2: the result's ``_finalizer`` (``weakref.finalize(self, backend.drop_persisted,
    query_id)``) names its engine's ``PersistedBackend``; the copy gets a new query id in the same store
    (``_uid``), the same ``_ranks`` and ``_schema``, and a finalizer of its own. Each partition is one
    ``contiguous_split.pack`` into device memory, unpacked in place (one device-to-device copy).
    """
    import uuid

    from cudf_polars.engine.persisted_result import PersistedQueryResult

    copy = PersistedQueryResult(query_result._finalizer.peek()[1].__self__, query_result._uid, uuid.uuid4(),
                                list(query_result._ranks), dict(query_result._schema))
    unpack_partitions(copy, pack_partitions(query_result, take=False), device_copy=False)
    return copy


def run_on_ranks(engine: Any, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """``StreamingEngine._run(fn, *args)``: ``fn`` on every rank, results in rank order (JSON values)."""
    return list(engine._run(fn, *args))


def dask_worker_teardown(engine: Any) -> tuple[str, Callable[..., Any]]:
    """A ``DaskEngine``'s id on its workers (``_dask_ctx.rapidsmpf_id``) and what its shutdown runs on each (``_teardown_worker``)."""
    from cudf_polars.engine.dask import _teardown_worker

    uid = engine._dask_ctx.rapidsmpf_id
    return uid, functools.partial(_teardown_worker, uid=uid)


def rank_reading(uid: str | None = None, query_id: str | None = None) -> list[int | None]:
    """
    On a rank: bytes rmm has allocated now, and the rows and bytes of one persisted partition.

    The allocated bytes come from the first resource in the current device
    resource's chain that tracks ``current_allocated`` (rapidsmpf's
    ``RmmResourceAdaptor``, which cudf-polars installs on every rank). The
    partition is read from ``cudf_polars.engine.rank_local_store._stores[uid]``
    (its ``_partitions``, no public accessor), without consuming it; its bytes
    are pylibcudf's ``Column.device_buffer_size`` summed over its columns.

    Returns
    -------
    list
        ``[allocated, rows, bytes]``; ``None`` where unreadable (rows and bytes
        are 0 on a rank without a partition of ``query_id``).
    """
    import uuid

    import rmm.mr

    allocated, mr = None, rmm.mr.get_current_device_resource()
    for _ in range(8):  # at most 8 resources down the chain (past its end ``mr`` is None and has neither)
        if (value := getattr(mr, "current_allocated", None)) is not None:
            allocated = int(value() if callable(value) else value)
            break
        mr = getattr(mr, "upstream_mr", None) or getattr(mr, "get_upstream", lambda: None)()
    if query_id is None:
        return [allocated, None, None]
    from cudf_polars.engine import rank_local_store

    store = rank_local_store._stores.get(uid)
    entries = store._partitions.get(uuid.UUID(query_id), {}) if store is not None else {}
    frames = [df for df, _duplicated in entries.values()]
    size = sum(column.device_buffer_size() for df in frames for column in df.table.columns())
    return [allocated, sum(df.num_rows for df in frames), size]


def rank_device_name() -> str:
    """Name and memory of this rank's GPU, e.g. ``"NVIDIA H200 (139.8 GiB)"`` (cudf-polars 26.10's own reading)."""
    import cuda.core
    from cudf_polars.utils.config import get_total_device_memory

    total = get_total_device_memory()
    name = cuda.core.Device().name
    return f"{name} ({total / 2**30:.1f} GiB)" if total else name


# ---- Ray 2.60 ------------------------------------------------------------------------
def reload_ray_auth_token() -> None:
    """
    Make Ray read its authentication token and ``RAY_AUTH_MODE`` again before the next ``ray.init()``.

    Ray 2.60 loads both once per process; ``ray._raylet.Config.initialize("")``
    re-reads the mode (what Ray's own ``_enable_token_auth`` calls) and
    ``AuthenticationTokenLoader.reset_cache`` the token (what ``ray.init()``
    calls after writing a new one). Nothing happens with a Ray without them.
    """
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def disable_ray_failure_signal_handler() -> None:
    """
    Keep Ray's C++ failure signal handler out of this driver (before ``ray.init``).

    With it, a SIGTERM to the driver arms an abort 3 s later, which would end
    the flow process in the middle of its teardown. Ray 2.60 reads
    ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` into
    ``ray._private.ray_constants`` when that module is imported; both are set.
    """
    os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = "1"
    if "ray._private.ray_constants" in sys.modules:
        sys.modules["ray._private.ray_constants"].RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


# ---- Prefect 3.9.1 ---------------------------------------------------------------------
def without_prefect_run_context(fn: Callable[[], Any]) -> Any:
    """
    Run ``fn`` with Prefect's flow-run and task-run contexts set to none (``ContextModel.__var__``).

    Prefect's ``EventsWorker`` captures the caller's context when an event is
    queued and attaches the runs it finds there; where the caller has no run
    context, its own thread's, which keeps the context the worker started in
    (the first flow run that sent an event), would be used. An event sent
    after a flow run's context is gone names its runs explicitly instead.
    """
    import contextvars

    from prefect.context import FlowRunContext, TaskRunContext

    context = contextvars.copy_context()
    for var in (FlowRunContext.__var__, TaskRunContext.__var__):
        context.run(var.set, None)
    return context.run(fn)


def send_run_log(flow_run_id: Any, task_run_id: Any, message: str, at: datetime.datetime | None = None) -> None:
    """
    Queue one INFO line for a run's log in the Prefect UI, as Prefect's ``APILogHandler`` does, without the console.

    Prefect 3.9.1: ``prefect.logging.handlers.emit_api_log`` takes the ``LogCreate`` form the handler's
    ``prepare`` builds (JSON values) and queues it for the ``APILogWorker``, which sends it in batches
    from its own thread; logging through a run logger would cost the caller about four times as much
    (the console handler, pydantic's ``LogCreate``). Nothing is sent without a flow run id or with
    ``PREFECT_LOGGING_TO_API_ENABLED`` off. ``at``: the line's time (default now).
    """
    from prefect.logging.handlers import emit_api_log
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED

    if flow_run_id is None or not PREFECT_LOGGING_TO_API_ENABLED.value():
        return
    emit_api_log({"name": "prefect.task_runs" if task_run_id else "prefect.flow_runs", "level": logging.INFO,
                  "message": message, "timestamp": (at or datetime.datetime.now(datetime.timezone.utc)).isoformat(),
                  "flow_run_id": str(flow_run_id), "task_run_id": str(task_run_id) if task_run_id else None})


#: The logger of Prefect 3.9.1's queue services (``prefect._internal.concurrency.logger``).
PREFECT_SERVICES_LOGGER = "prefect._internal.concurrency"


def _keep_unless_timed_out_slot_request(record: logging.LogRecord) -> bool:
    """
    A logging filter that drops the ERROR Prefect logs when one request for concurrency slots times out.

    ``concurrency(..., timeout_seconds=...)`` queues its request on a
    ``ConcurrencySlotAcquisitionWithLeaseService``; in Prefect 3.9.1 a request
    that times out raises ``TimeoutError`` in the service's ``acquire``, which
    ``FutureQueueService._handle`` sets on the caller's future (the item's last
    element; the caller gets it as ``AcquireConcurrencySlotTimeoutError``) and
    re-raises, and ``_main_loop`` then logs ``"Service %r failed to process item
    %r"`` (the service's class name, the item) at ERROR on
    :data:`PREFECT_SERVICES_LOGGER`. The request's caller gets the
    ``TimeoutError`` itself; any other failure of the service, or of another
    service, is kept.
    """
    match record.msg, record.args:
        case ("Service %r failed to process item %r",
              tuple(("ConcurrencySlotAcquisitionWithLeaseService", tuple((*_, Future() as future))))):
            return not (future.done() and not future.cancelled() and isinstance(future.exception(), TimeoutError))
    return True


def quiet_timed_out_slot_requests() -> None:
    """
    Keep Prefect from logging an ERROR for each request for concurrency slots that times out (idempotent).

    An admission wait asks in requests of ``REQUEST_SLICE_S`` seconds
    (:mod:`~prefect_cudf_polars.blocks.admission`), so every ordinary wait
    longer than one request timed out one; the wait's own lines say what it
    waits for.
    """
    # Filterer.addFilter adds a filter once.
    logging.getLogger(PREFECT_SERVICES_LOGGER).addFilter(_keep_unless_timed_out_slot_request)


# ---- CPython 3.11-3.13 ---------------------------------------------------------------
def register_before_thread_shutdown(fn: Callable[[], None]) -> None:
    """
    ``threading._register_atexit(fn)``: run ``fn`` at exit before non-daemon threads are joined.

    These callbacks run last-registered first, before :mod:`atexit` (where
    distributed closes the clusters it started). Prefect 3.9's events and log
    workers register theirs when they start, so they may already have stopped.
    """
    threading._register_atexit(fn)  # type: ignore[attr-defined]


def stop_resource_tracker(timeout: float) -> bool:
    """
    Close this process's pipe to multiprocessing's resource tracker and reap the tracker, within ``timeout`` seconds.

    A backend that spawns processes (distributed's ``LocalCUDACluster`` on
    ``dask``) starts the tracker as a child in the flow run's process group.
    CPython 3.11-3.13 do not wait for it at exit (CPython 3.14 does, issue
    88887): it ends just after the flow process, orphaned, and stays in the
    group as a zombie until PID 1 reaps it, which a container's PID 1 may never
    do, while a Prefect process worker counts a cancelled run ``Cancelled`` only
    once the group is gone. Checked against CPython 3.11-3.13's
    ``ResourceTracker``: ``_lock`` guards ``_fd`` (the pipe's write end) and
    ``_pid``. Never raises.

    Returns
    -------
    bool
        True when no tracker this process started is left running; False when
        the lock was busy, or the tracker still ran at the deadline.
    """
    import time
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    lock = getattr(tracker, "_lock", None)
    deadline = time.monotonic() + timeout
    if lock is None or not lock.acquire(timeout=timeout):
        return lock is None
    try:
        if getattr(lock, "_recursion_count", lambda: 1)() > 1 or tracker._pid is None:  # inside its own call; none started
            return tracker._pid is None
        fd, tracker._fd = tracker._fd, None
        if fd is not None:
            os.close(fd)
        while time.monotonic() < deadline:
            try:
                done = os.waitpid(tracker._pid, os.WNOHANG)[0]
            except ChildProcessError:  # not our child (a forked copy), or reaped already
                done = tracker._pid
            if done:
                tracker._pid = None
                return True
            time.sleep(0.02)
        return False
    except Exception:  # never fail a session's end
        return False
    finally:
        lock.release()
