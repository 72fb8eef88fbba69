"""
Run a command in a process group of its own and report when that group is gone (run as a file).

This process first becomes a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a
process the command leaves orphaned becomes this process's child, and once it ends it stays
in the command's group as a zombie until this process reaps it, whatever the machine's PID 1
does. Prints one JSON line last: the command's exit status and the seconds from its exit until
no process of its group was left (``null`` when some still were after ``WAIT_S``; those are
then killed with SIGKILL and reaped, at most ``REAP_S`` seconds).

Usage: ``python in_own_group.py COMMAND [ARG ...]``
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
WAIT_S = 5.0
REAP_S = 10.0


def group_alive(pgid: int) -> bool:
    """Whether any process (a zombie included) is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    proc = subprocess.Popen(sys.argv[1:], start_new_session=True)
    status = proc.wait()
    exited = time.monotonic()
    gone = None
    while time.monotonic() - exited < WAIT_S:
        if not group_alive(proc.pid):
            gone = time.monotonic() - exited
            break
        time.sleep(0.01)
    if gone is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + REAP_S
    while time.monotonic() < deadline:  # reap what the command left
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if not group_alive(proc.pid):
                break
            time.sleep(0.05)
    print(json.dumps({"returncode": status, "group_gone_after_s": gone}), flush=True)
