"""
What machine the benchmark ran on: GPUs, driver, CUDA, CPU, memory, package versions.

Every probe is best effort: a missing tool or package leaves its field out (or
``None``) and never fails the benchmark.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PACKAGES = (
    "prefect",
    "polars",
    "pyarrow",
    "cudf-polars-cu13",
    "cudf-polars-cu12",
    "libcudf-cu13",
    "libcudf-cu12",
    "rmm-cu13",
    "rmm-cu12",
    "rapidsmpf-cu13",
    "rapidsmpf-cu12",
    "dask-cuda",
    "distributed",
    "tpchgen-cli",
    "matplotlib",
    "prefect-cudf-polars",
)


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def gpus() -> dict[str, Any]:
    """
    GPUs as ``nvidia-smi`` reports them.

    Returns
    -------
    dict
        ``gpus`` (list of {name, driver_version, memory_total_mib}) and
        ``cuda_driver_version`` (the CUDA version of the driver, from the header
        of ``nvidia-smi``); empty lists / ``None`` without ``nvidia-smi``.
    """
    listed = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader,nounits",
        ]
    )
    found = []
    for line in (listed or "").strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            found.append(
                {
                    "name": parts[0],
                    "driver_version": parts[1],
                    "memory_total_mib": int(float(parts[2])),
                }
            )
    header = _run(["nvidia-smi"]) or ""
    match = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return {"gpus": found, "cuda_driver_version": match.group(1) if match else None}


def cuda_runtime_version() -> str | None:
    """The CUDA runtime cuda-bindings loads (``"13.0"``), or ``None``."""
    try:
        from cuda.bindings import runtime

        err, value = runtime.cudaRuntimeGetVersion()
        return f"{value // 1000}.{(value % 1000) // 10}"
    except Exception:
        return None


def cpu_and_memory() -> dict[str, Any]:
    """CPU model, logical CPUs, host memory (GiB) from ``/proc`` where present."""
    model = platform.processor() or None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem_gib = round(int(line.split()[1]) / 2**20, 1)
                    break
    except OSError:
        pass
    return {"cpu_model": model, "logical_cpus": os.cpu_count(), "memory_gib": mem_gib}


def packages() -> dict[str, str]:
    """Versions of the packages that matter here (installed ones only)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def describe() -> dict[str, Any]:
    """Everything above plus Python and the OS, as one JSON-ready dict."""
    return {
        **gpus(),
        "cuda_runtime_version": cuda_runtime_version(),
        **cpu_and_memory(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "packages": packages(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
