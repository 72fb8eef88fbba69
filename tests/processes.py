"""Child processes of the test process, to prove clusters leave none behind."""

from __future__ import annotations

import time

import psutil


def child_pids() -> set[int]:
    """Our child processes, less multiprocessing's resource tracker (it ends with this process)."""
    pids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                pids.add(p.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def wait_gone(pids: set[int], timeout: float = 30.0) -> set[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to exit; return those still alive."""
    deadline = time.monotonic() + timeout

    def alive() -> set[int]:
        left = set()
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.add(pid)
            except psutil.NoSuchProcess:
                continue
        return left

    left = alive()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = alive()
    return left
