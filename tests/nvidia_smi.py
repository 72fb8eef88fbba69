"""Device memory as ``nvidia-smi`` reports it: every process's, the CUDA driver's view."""

from __future__ import annotations

import subprocess

#: MiB of device memory (``nvidia-smi`` memory.used) a GPU may differ from its figure before.
TOLERANCE_MIB = 16


def device_memory_used_mib() -> list[int]:
    """``nvidia-smi``'s memory.used of every visible GPU, MiB, in index order."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    return [int(line) for line in out.split()]


def back_to(before: list[int]) -> bool:
    """Whether every GPU's memory.used is within :data:`TOLERANCE_MIB` of ``before``."""
    return all(abs(a - b) <= TOLERANCE_MIB for a, b in zip(device_memory_used_mib(), before))
