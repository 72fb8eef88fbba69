"""
Device memory in use on a rank, read from rmm statistics.

cudf-polars' streaming engines install rapidsmpf's tracking
``RmmResourceAdaptor`` as the current rmm device resource on each rank; its
``current_allocated`` is the memory allocated through rmm now, in bytes. That is
the figure to compare before and after a result is released: ``nvidia-smi``
shows the pool's size, which stays up after a free because the pool keeps freed
memory for reuse.
"""

from __future__ import annotations


def rank_allocated_bytes() -> int | None:
    """
    Bytes allocated through rmm on this rank's current device, or ``None``.

    Walks the current device resource and its upstreams for the first one that
    tracks ``current_allocated``. Runs on a rank (module-level, so Dask and Ray
    workers import it by name).
    """
    import rmm.mr

    mr = rmm.mr.get_current_device_resource()
    seen = 0
    while mr is not None and seen < 8:
        value = getattr(mr, "current_allocated", None)
        if value is not None:
            return int(value() if callable(value) else value)
        mr = getattr(mr, "upstream_mr", None) or getattr(mr, "get_upstream", lambda: None)()
        seen += 1
    return None


def rank_device_name() -> str:
    """Name and memory of this rank's GPU, e.g. ``"NVIDIA H200 (139.8 GiB)"``."""
    import cuda.core
    # cudf-polars 26.10: its own reading of a device's total memory (what its partition defaults use).
    from cudf_polars.utils.config import get_total_device_memory

    name = cuda.core.Device().name
    total = get_total_device_memory()
    return f"{name} ({total / 2**30:.1f} GiB)" if total else name
