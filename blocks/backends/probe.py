"""
Is there a usable NVIDIA GPU and a RAPIDS stack here? Answered without importing RAPIDS.

The GPU count comes from the CUDA driver API (``libcuda.so.1``: ``cuInit`` and
``cuDeviceGetCount``) through :mod:`ctypes`, so it honours
``CUDA_VISIBLE_DEVICES`` and needs no CUDA package. The RAPIDS check only looks
for the ``cudf_polars`` and ``rmm`` modules (:func:`importlib.util.find_spec`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os

from prefect_cudf_polars.blocks.errors import INSTALL_RAPIDS

# CUDA driver API status codes (cuda.h, CUresult).
_CUDA_ERRORS = {35: "CUDA_ERROR_INSUFFICIENT_DRIVER: the NVIDIA driver is older than the CUDA runtime",
                100: "CUDA_ERROR_NO_DEVICE: the driver sees no GPU (check CUDA_VISIBLE_DEVICES)",
                999: "CUDA_ERROR_UNKNOWN"}


@dataclasses.dataclass(frozen=True)
class GPUProbe:
    """
    What this process can use.

    Attributes
    ----------
    gpus
        Number of visible NVIDIA GPUs (0 when there is no driver or device).
    rapids
        Whether ``cudf_polars`` and ``rmm`` can be imported.
    problem
        Why no GPU backend can run here, or ``None`` when one can.
    """

    gpus: int
    rapids: bool
    problem: str | None


def count_gpus() -> tuple[int, str | None]:
    """
    Count visible NVIDIA GPUs through the CUDA driver.

    Returns
    -------
    (count, problem)
        ``problem`` says why the count is 0, or is ``None``.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no NVIDIA driver: libcuda.so.1 was not found"
    if status := cuda.cuInit(0):
        return 0, f"cuInit failed with {_CUDA_ERRORS.get(status, f'CUresult {status}')}"
    count = ctypes.c_int(0)
    if status := cuda.cuDeviceGetCount(ctypes.byref(count)):
        return 0, f"cuDeviceGetCount failed with CUresult {status}"
    if count.value == 0:
        return 0, "the NVIDIA driver sees no GPU (check CUDA_VISIBLE_DEVICES)"
    return count.value, None


def gpu_memory_bytes() -> int | None:
    """The memory of the smallest visible GPU in bytes (``cuDeviceTotalMem_v2``), or ``None`` without one."""
    count, problem = count_gpus()
    if problem is not None:
        return None
    cuda, totals = ctypes.CDLL("libcuda.so.1"), []
    for ordinal in range(count):
        device, total = ctypes.c_int(0), ctypes.c_size_t(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) or cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device):
            return None
        totals.append(total.value)
    return min(totals)


def memory_total(backend: str) -> int | None:
    """Bytes a ``device_memory_limit`` percentage is of: the smallest GPU's memory, on ``cpu`` the machine's."""
    if backend != "cpu":
        return gpu_memory_bytes()
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def host_memory_per_gpu(backend: str) -> int | None:
    """Bytes of host memory per visible GPU (the machine's divided by its GPUs; on ``cpu``, the machine's)."""
    host = memory_total("cpu")
    return host if backend == "cpu" or host is None else host // max(count_gpus()[0], 1)


def rapids_installed() -> bool:
    """Whether the RAPIDS packages cudf-polars needs (``cudf_polars``, ``rmm``) are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("cudf_polars", "rmm"))


def probe() -> GPUProbe:
    """Probe GPUs and RAPIDS packages; see :class:`GPUProbe`."""
    gpus, problem = count_gpus()
    rapids = rapids_installed()
    if problem is None and not rapids:
        problem = f"the RAPIDS packages are not installed: install them {INSTALL_RAPIDS}"
    return GPUProbe(gpus=gpus, rapids=rapids, problem=problem)
