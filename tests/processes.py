"""Child processes of the test process, to prove clusters leave none behind."""

from __future__ import annotations

import time

import psutil


def child_pids(pid: int | None = None) -> set[int]:
    """
    Descendants of ``pid`` (default: this process), less multiprocessing's resource tracker.

    The tracker ends with the process that started it, so it is never an orphan.
    """
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    pids = set()
    for p in children:
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                pids.add(p.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: set[int], timeout: float = 30.0) -> set[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to exit; return those still alive."""
    deadline = time.monotonic() + timeout

    def alive() -> set[int]:
        return {pid for pid in pids if pid_alive(pid)}

    left = alive()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = alive()
    return left
