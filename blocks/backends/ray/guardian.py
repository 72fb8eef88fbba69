"""
The guardian of a session's own Ray head: run as a file, it leads the head's session and ends it with its parent.

``python guardian.py PARENT_PID RAY_ARGS...``, started in a new session by
:mod:`~prefect_cudf_polars.blocks.backends.ray.head`. It asks Linux to send it
SIGTERM when the thread that started it ends (``PR_SET_PDEATHSIG``), starts
``ray RAY_ARGS...`` (``ray start --head --block``) as its child and waits. On
SIGTERM (its parent died, however: SIGKILL included) it SIGKILLs every process
of its session and exits. Ray's processes do not all end with ``ray start``:
with Ray 2.60 its dashboard and runtime-env agents outlive a killed head.

Only the standard library: it must start fast and import nothing of ours.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _session_of(pid: str) -> int | None:
    """The session id of process ``pid`` (``os.getsid``), or ``None`` once it has ended."""
    try:
        return os.getsid(int(pid))
    except OSError:
        return None


def session_members(sid: int) -> list[int]:
    """Pids of the processes in session ``sid`` (Linux ``/proc``)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _session_of(entry) == sid]


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``, its leader (pid ``sid``) included, but this one."""
    for pid in {sid, *session_members(sid)} - {os.getpid()}:
        with contextlib.suppress(OSError):  # ended already
            os.kill(pid, signal.SIGKILL)


def end_session(*_: object) -> None:
    """SIGKILL every other process of this session, then exit."""
    kill_session(os.getpid())
    os._exit(0)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, end_session)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(argv[0]):  # the parent ended before the signal was armed
        end_session()
    return subprocess.Popen([sys.executable, "-c", "from ray.scripts.scripts import main; main()", *argv[1:]]).wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
