"""
The names cudf-polars' streaming executor accepts as ``executor_options``, for the engine block's checks.

cudf-polars 26.10 passes a GPU engine's executor options to
``StreamingExecutor(**options)`` (``cudf_polars/utils/config.py``), a
dataclass whose init fields are the option names. Where cudf-polars can be
imported they are read from it; elsewhere (a laptop without the CUDA wheels)
from :data:`STREAMING_EXECUTOR_FIELDS`, the same fields of cudf-polars 26.10.
"""

from __future__ import annotations

import dataclasses
import functools

#: ``StreamingExecutor``'s init fields in cudf-polars 26.10.
STREAMING_EXECUTOR_FIELDS = frozenset(
    {
        "broadcast_limit",
        "client_device_threshold",
        "cluster",
        "dask_context",
        "dynamic_planning",
        "fallback_mode",
        "join_filter_pushdown",
        "kvikio_bounce_buffer_bytes",
        "kvikio_nthreads",
        "kvikio_reactor_count",
        "kvikio_reactor_dispatch",
        "kvikio_remote_io_backend",
        "kvikio_request_ceiling",
        "kvikio_statistics",
        "kvikio_task_size",
        "max_concurrent_io_tasks",
        "max_rows_per_partition",
        "min_device_size",
        "num_py_executors",
        "quent_context",
        "ray_context",
        "sink_to_directory",
        "spmd_context",
        "target_partition_size",
    }
)

#: Keys cudf-polars sets itself for the backend (``cudf_polars.engine.core._RESERVED_EXECUTOR_KEYS``, 26.10).
RESERVED_EXECUTOR_KEYS = frozenset({"cluster", "spmd_context", "ray_context", "dask_context"})


@functools.cache
def streaming_executor_fields() -> tuple[frozenset[str], str]:
    """
    ``StreamingExecutor``'s option names, and where they were read.

    Returns
    -------
    (names, source) : tuple of frozenset of str and str
        ``source`` is ``"cudf-polars 26.10.02"`` (the installed version) when
        cudf-polars can be imported, else ``"cudf-polars 26.10"`` with
        :data:`STREAMING_EXECUTOR_FIELDS`.
    """
    try:
        import cudf_polars
        from cudf_polars.utils.config import StreamingExecutor
    except Exception:  # not installed, or its CUDA wheels cannot load here
        return STREAMING_EXECUTOR_FIELDS, "cudf-polars 26.10"
    names = frozenset(f.name for f in dataclasses.fields(StreamingExecutor) if f.init)
    return names, f"cudf-polars {cudf_polars.__version__}"
