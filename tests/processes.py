"""Child processes of the test process, to prove clusters leave none behind."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

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


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> float:
    """Poll ``predicate`` every 20 ms until true; return the seconds it took, or fail after ``timeout``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - started


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    """Start ``args`` with stdout and stderr going to the file ``log``."""
    with open(log, "w") as sink:
        return subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT)


def start_dask_scheduler(folder: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """
    A ``dask scheduler`` process on 127.0.0.1 (free port, no dashboard), logging to ``folder/scheduler.log``.

    Returns the process and the scheduler's address, read from its scheduler file.
    """
    scheduler_file = folder / "scheduler.json"
    proc = spawn(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file), *extra],
        folder / "scheduler.log",
    )
    try:
        wait_until(lambda: scheduler_file.exists() and scheduler_file.stat().st_size > 0, 60, "scheduler file")
        return proc, json.loads(scheduler_file.read_text())["address"]
    except BaseException:
        stop([proc])
        raise


def stop(procs: list[subprocess.Popen], timeout: float = 30.0) -> None:
    """SIGTERM each process we started, SIGKILL those still there after ``timeout`` seconds."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server process the test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_all(proc: subprocess.Popen, pids: list[int]) -> None:
    """SIGKILL ``proc`` if it still runs, and each of ``pids`` still alive (a failed test's leftovers)."""
    import os
    import signal

    if proc.poll() is None:
        proc.kill()
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
