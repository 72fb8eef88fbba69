"""Process-tree readings for the teardown tests (Linux /proc)."""

from __future__ import annotations

import os
from pathlib import Path


def child_pids(pid: int | None = None) -> set[int]:
    """Direct children of ``pid`` (default: this process), read from /proc."""
    pid = pid or os.getpid()
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:  # the thread ended while we looked
            continue
    return found


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status
