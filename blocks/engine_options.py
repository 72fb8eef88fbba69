"""
The engine block's fields as cudf-polars' and dask-cuda's options: the one translation.

:class:`EngineOptions` is a base of :class:`~prefect_cudf_polars.blocks.CudfPolarsEngine`
that reads the block's fields; it is checked against cudf-polars 26.10
(``StreamingOptions``, ``StreamingExecutor``, ``MemoryResourceConfig``) and
dask-cuda 26.10 (``LocalCUDACluster``). The block's fields and their checks are
in :mod:`~prefect_cudf_polars.blocks.engine_block`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

#: Executor option keys the block owns through its named fields.
NAMED_EXECUTOR_KEYS = frozenset({"target_partition_size", "max_rows_per_partition"})

#: ``StreamingExecutor``'s init fields in cudf-polars 26.10, for machines where it cannot be imported.
STREAMING_EXECUTOR_FIELDS = frozenset({
    "broadcast_limit", "client_device_threshold", "cluster", "dask_context", "dynamic_planning", "fallback_mode",
    "join_filter_pushdown", "kvikio_bounce_buffer_bytes", "kvikio_nthreads", "kvikio_reactor_count",
    "kvikio_reactor_dispatch", "kvikio_remote_io_backend", "kvikio_request_ceiling", "kvikio_statistics",
    "kvikio_task_size", "max_concurrent_io_tasks", "max_rows_per_partition", "min_device_size", "num_py_executors",
    "quent_context", "ray_context", "sink_to_directory", "spmd_context", "target_partition_size",
})

#: Keys cudf-polars sets itself for the backend (``cudf_polars.engine.core._RESERVED_EXECUTOR_KEYS``, 26.10).
RESERVED_EXECUTOR_KEYS = frozenset({"cluster", "spmd_context", "ray_context", "dask_context"})

#: rmm memory resources a user picks by name (``device_memory_resource``).
MEMORY_RESOURCES: dict[str, str] = {"async": "rmm.mr.CudaAsyncMemoryResource", "pool": "rmm.mr.PoolMemoryResource",
                                    "managed": "rmm.mr.ManagedMemoryResource", "cuda": "rmm.mr.CudaMemoryResource"}


def bytes_of(value: int | str, total: int) -> int:
    """A limit field's value in bytes: a percentage (``"40%"``) of ``total`` bytes, else its bytes."""
    text = str(value)
    return int(total * float(text[:-1]) / 100) if text.endswith("%") else int(text)


@functools.cache
def streaming_executor_fields() -> tuple[frozenset[str], str]:
    """
    ``StreamingExecutor``'s option names, and where they were read.

    cudf-polars 26.10 passes a GPU engine's executor options to
    ``StreamingExecutor(**options)``, a dataclass whose init fields are the
    option names. Where cudf-polars can be imported they are read from it;
    elsewhere from :data:`STREAMING_EXECUTOR_FIELDS`.

    Returns
    -------
    (names, source) : tuple of frozenset of str and str
        ``source`` is ``"cudf-polars 26.10.02"`` (the installed version), or
        ``"cudf-polars 26.10"`` for the built-in list.
    """
    try:
        import cudf_polars
        from cudf_polars.utils.config import StreamingExecutor
    except Exception:  # not installed, or its CUDA wheels cannot load here
        return STREAMING_EXECUTOR_FIELDS, "cudf-polars 26.10"
    names = frozenset(f.name for f in dataclasses.fields(StreamingExecutor) if f.init)
    return names, f"cudf-polars {cudf_polars.__version__}"


class EngineOptions:
    """
    The block's fields as cudf-polars' and dask-cuda's options: a base class of ``CudfPolarsEngine``.

    Its methods read the block's fields (``raise_on_fail``, ``target_partition_size``,
    ``max_rows_per_partition``, ``spill_device_limit``, ``device_memory_resource``,
    ``device_memory_pool_size``, ``executor_options``, ``device_memory_limit``, ``host_spill_limit``) and
    are called on the block: ``block.engine_kwargs(limit)``, ``block.local_cluster_kwargs()``.
    """

    def memory_limit_bytes(self, total: int | None) -> int | None:
        """
        ``device_memory_limit`` in bytes (``None`` when unset).

        Parameters
        ----------
        total : int or None
            Bytes a percentage is of: the smallest GPU's memory (on ``cpu``, the machine's memory).

        Raises
        ------
        ValueError
            The limit is a percentage and ``total`` is unknown.
        """
        value = self.device_memory_limit
        if value is None:
            return None
        if total is None and str(value).endswith("%"):
            raise ValueError(f"device_memory_limit={value!r} is a percentage, but this machine's memory could not be "
                             "read; give the limit in bytes on the CudfPolarsEngine block.")
        return bytes_of(value, total or 0)

    def host_spill_limit_bytes(self, host_total: int | None) -> int:
        """
        ``host_spill_limit`` in bytes: what results moved out of the engine may hold in host memory.

        Parameters
        ----------
        host_total : int or None
            Bytes a percentage is of: the host memory per GPU (the machine's divided by its GPUs; on ``cpu``, the
            machine's). Unknown, a percentage counts as 0 bytes (no result moves out).
        """
        return bytes_of(self.host_spill_limit, host_total or 0)

    def memory_resource_config(self) -> dict[str, Any] | None:
        """
        The block's rmm choice as cudf-polars' ``memory_resource_config``.

        Returns
        -------
        dict or None
            ``{"qualname": ..., "options": {...}}``, or ``None`` for cudf-polars'
            own default (``"async"`` with no pool size: ``CudaAsyncMemoryResource``
            with a release threshold of 90 % of GPU memory).
        """
        kind, size = self.device_memory_resource, self.device_memory_pool_size
        if kind == "async" and size is None:
            return None
        options: dict[str, Any] = {"upstream_mr": {"qualname": MEMORY_RESOURCES["cuda"]}} if kind == "pool" else {}
        if size is not None:
            options["initial_pool_size"] = size
        return {"qualname": MEMORY_RESOURCES[kind], "options": options}

    def executor_settings(self) -> dict[str, Any]:
        """
        The streaming executor options the block sets: its named fields, then ``executor_options``.

        Unset fields stay unset, so cudf-polars' environment variables
        (``CUDF_POLARS__*``) and defaults apply to them.
        """
        named = {key: getattr(self, key) for key in sorted(NAMED_EXECUTOR_KEYS) if getattr(self, key) is not None}
        return {**named, **self.executor_options}

    def engine_kwargs(self, limit: int | None = None, *, device_total: int | None = None,
                      host_total: int | None = None, demand: str | None = None) -> dict[str, Any]:
        """
        The block as the keyword arguments of ``SPMDEngine``, ``DaskEngine`` and ``RayEngine``.

        The one translation of the block's fields into cudf-polars 26.10's
        ``StreamingOptions`` (``engine/options.py``), constructed by keyword:
        ``rapidsmpf_options``, ``executor_options`` and ``engine_options``.
        Imports cudf-polars.

        With a device memory ``limit`` (bytes, :meth:`memory_limit_bytes`) that
        is three settings in cudf-polars 26.10.2: the memory resource becomes an
        ``rmm.mr.LimitingResourceAdaptor`` at ``limit`` over the block's resource
        (the default ``CudaAsyncMemoryResource`` with ``release_threshold=limit``);
        rapidsmpf's ``spill_device_limit`` is given in bytes below it (its
        percentages are of the whole device: a percentage here is of the limit,
        80 % when unset); and ``pinned_max_pool_size`` is the share of 80 % of
        ``host_total`` that the limit is of ``device_total`` (rapidsmpf's default
        lets each engine pin 80 % of its GPU's share of host memory), when both are known.
        With ``demand`` too, rmm's ``FailureCallbackResourceAdaptor`` wraps the
        limit's adaptor: an allocation past the limit asks the listener of
        that key for room (:mod:`~prefect_cudf_polars.blocks.memory_demand`).

        Parameters
        ----------
        limit : int, optional
            ``device_memory_limit`` in bytes.
        device_total, host_total : int, optional
            The GPU's memory and the host memory per GPU (the machine's divided by the visible GPUs), in bytes.
        demand : str, optional
            A :func:`~prefect_cudf_polars.blocks.memory_demand.listen` key (used with ``limit``).

        Returns
        -------
        dict
        """
        from cudf_polars.engine.options import StreamingOptions
        from cudf_polars.utils.config import MemoryResourceConfig

        from prefect_cudf_polars.blocks.memory_demand import resource_config

        named: dict[str, Any] = {"raise_on_fail": self.raise_on_fail}
        if self.spill_device_limit is not None:
            # cudf-polars 26.10's StreamingOptions.spill_device_limit is a str ("80%" or bytes).
            named["spill_device_limit"] = str(self.spill_device_limit)
        mr = self.memory_resource_config()
        if limit is not None:
            named["spill_device_limit"] = str(min(bytes_of(self.spill_device_limit or "80%", limit), limit))
            upstream = mr or {"qualname": MEMORY_RESOURCES["async"], "options": {}}
            if upstream["qualname"] == MEMORY_RESOURCES["async"]:
                upstream["options"]["release_threshold"] = limit
            mr = {"qualname": "rmm.mr.LimitingResourceAdaptor",
                  "options": {"upstream_mr": upstream, "allocation_limit": limit}}
            if demand is not None:
                mr = resource_config(mr, demand)
            if device_total and host_total:
                named["pinned_max_pool_size"] = str(int(0.8 * host_total * limit / device_total))
        if mr is not None:
            named["memory_resource_config"] = MemoryResourceConfig(**mr)
        options = StreamingOptions(**named)
        return {"rapidsmpf_options": options.to_rapidsmpf_options(), "engine_options": options.to_engine_options(),
                "executor_options": {**options.to_executor_options(), **self.executor_settings()}}

    def local_cluster_kwargs(self) -> dict[str, Any]:
        """
        The block as ``dask_cuda.LocalCUDACluster`` keyword arguments (one thread per worker).

        ``device_memory_pool_size`` becomes ``rmm_pool_size`` (bytes) and
        ``spill_device_limit`` dask-cuda's ``device_memory_limit`` (a fraction of
        GPU memory, or bytes).
        """
        kwargs: dict[str, Any] = {"threads_per_worker": 1}
        if self.device_memory_pool_size is not None:
            kwargs["rmm_pool_size"] = self.device_memory_pool_size
        if self.spill_device_limit is not None:
            limit = str(self.spill_device_limit)
            kwargs["device_memory_limit"] = float(limit[:-1]) / 100 if limit.endswith("%") else int(limit)
        return kwargs
