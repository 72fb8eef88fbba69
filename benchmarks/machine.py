"""
What machine the benchmark ran on: GPUs, driver, CUDA, CPU, memory, package versions.

Every probe is best effort: a missing tool or package leaves its field empty
(or ``None``) and never fails the benchmark.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGES = (
    "prefect", "polars", "pyarrow", "cudf-polars-cu13", "cudf-polars-cu12", "rmm-cu13", "rmm-cu12",
    "rapidsmpf-cu13", "rapidsmpf-cu12", "dask-cuda", "distributed", "tpchgen-cli", "matplotlib", "prefect-cudf-polars",
)


def gpus() -> list[dict[str, Any]]:
    """GPUs as ``nvidia-smi`` lists them: ``name``, ``driver_version``, ``memory_total_mib``; none without it."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[p.strip() for p in line.split(",")] for line in listed.strip().splitlines()]
    return [{"name": r[0], "driver_version": r[1], "memory_total_mib": int(float(r[2]))} for r in rows if len(r) == 3]


def cuda_runtime_version() -> str | None:
    """The CUDA runtime cuda-bindings loads (``"13.0"``), or ``None``."""
    try:
        from cuda.bindings import runtime

        _, value = runtime.cudaRuntimeGetVersion()
        return f"{value // 1000}.{(value % 1000) // 10}"
    except Exception:
        return None


def _proc_field(path: str, key: str) -> str | None:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(key)), None)


def describe() -> dict[str, Any]:
    """GPUs, CUDA runtime, CPU model and count, memory (GiB), Python, platform and package versions, as one dict."""
    memory_kib = _proc_field("/proc/meminfo", "MemTotal")
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            continue
    return {
        "gpus": gpus(),
        "cuda_runtime_version": cuda_runtime_version(),
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
        "logical_cpus": os.cpu_count(),
        "memory_gib": round(int(memory_kib.split()[0]) / 2**20, 1) if memory_kib else None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
