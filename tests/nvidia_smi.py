"""Device memory as ``nvidia-smi`` reports it: every process's, the CUDA driver's view."""

from __future__ import annotations

import subprocess

from processes import wait_until

#: MiB of device memory (``nvidia-smi`` memory.used) a GPU may stay above its figure before.
TOLERANCE_MIB = 16


def _query(*args: str) -> str:
    return subprocess.run(
        ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout


def gpus() -> list[tuple[str, int]]:
    """Name and memory.total (MiB) of every GPU ``nvidia-smi`` lists, in index order."""
    rows = [line.rsplit(",", 1) for line in _query("--query-gpu=name,memory.total").splitlines() if line.strip()]
    return [(name.strip(), int(total)) for name, total in rows]


def device_memory_used_mib() -> list[int]:
    """``nvidia-smi``'s memory.used of every visible GPU, MiB, in index order."""
    return [int(line) for line in _query("--query-gpu=memory.used").split()]


def compute_apps() -> list[str]:
    """``pid, process name, used MiB, GPU bus id`` of every process holding device memory."""
    return [line.strip() for line in _query(
        "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id"
    ).splitlines() if line.strip()]


def at_most(before: list[int]) -> bool:
    """
    Whether no GPU's memory.used is more than :data:`TOLERANCE_MIB` above ``before``.

    Lower is fine: a process from an earlier test may still be handing its
    memory back when ``before`` is read.
    """
    return all(a <= b + TOLERANCE_MIB for a, b in zip(device_memory_used_mib(), before))


def wait_back_to(before: list[int], timeout: float, what: str) -> float:
    """
    Wait until :func:`at_most` ``before``; return the seconds it took.

    Raises
    ------
    AssertionError
        After ``timeout`` seconds, with the figures and the processes still
        holding device memory.
    """
    try:
        return wait_until(lambda: at_most(before), timeout, what)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; MiB before {before}, now {device_memory_used_mib()}; "
            f"processes holding device memory: {compute_apps()}"
        ) from None
