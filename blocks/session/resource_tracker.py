"""
multiprocessing's resource tracker, stopped when SIGTERM has ended the process's last session.

A backend that starts processes with multiprocessing's spawn method (distributed's
``LocalCUDACluster``, on ``dask``) starts multiprocessing's resource tracker: a child of
the flow process, in the flow run's process group. CPython 3.11 to 3.13 do not wait for it
at exit: it ends just after the flow process, orphaned, and stays in the group as a zombie
until the machine's PID 1 reaps it. A Prefect 3.9 process worker cancels a flow run with
SIGTERM to that group (the tracker ignores SIGTERM) and then checks every 3 s whether the
group is gone, so the zombie can cost a cancelled run one more check before it is
``Cancelled``. CPython 3.14 stops the tracker itself at exit (CPython issue 88887).

Prefect 3.9 ends a flow process that SIGTERM reached with ``exit(0)`` when a worker's
cancellation was acknowledged, and otherwise by signalling it again, when no exit hook of
the interpreter runs. So the last session that SIGTERM ends, on an engine of its own, stops
the tracker itself once that engine has shut down (:func:`stop_tracker`): after one
``gc.collect()`` (so semaphores nothing holds unregister first), it closes the tracker's pipe
and polls for the tracker's end, at most :data:`STOP_WAIT_S` seconds in all, so that nothing
of the flow process is left in its group. The tracker then unlinks whatever is still
registered with it (and warns about each), as it does when the flow process exits; a process
that uses multiprocessing after that starts a new tracker, which is left as before. Nothing is
done in a process that started no tracker.
"""

from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger("prefect_cudf_polars.session")

#: Seconds a terminated session waits at most for the resource tracker to end.
STOP_WAIT_S = 2.0


def stop_tracker(timeout: float = STOP_WAIT_S) -> bool:
    """
    Close this process's resource tracker's pipe and reap the tracker, within about ``timeout`` seconds.

    Never raises. One deadline bounds both the wait for the tracker's lock and
    the polling for its end (every 20 ms).

    Parameters
    ----------
    timeout : float
        Seconds to wait in all (the tracker ends once every process holding
        its pipe has exited).

    Returns
    -------
    bool
        True when no tracker started by this process is left running (none was
        started, or it ended and was reaped); False when the lock was busy or
        the tracker was still running at the deadline (a later call polls again).
    """
    from multiprocessing import resource_tracker

    # CPython's ResourceTracker (checked against CPython 3.11.7, 3.12.1, 3.12.3 and
    # 3.13.0): ``_lock`` (an RLock) guards ``_fd`` (the write end of the tracker's pipe)
    # and ``_pid`` (the tracker's pid, in the process that started it). Closing the pipe
    # ends the tracker once no other process holds it; CPython 3.14 does this at exit.
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    lock = getattr(tracker, "_lock", None)
    if tracker is None or lock is None:
        return True
    deadline = time.monotonic() + timeout
    if not lock.acquire(timeout=timeout):
        return False
    try:
        if getattr(lock, "_recursion_count", lambda: 1)() > 1:
            return False  # called from inside the tracker (a finalizer): leave it alone
        pid = getattr(tracker, "_pid", None)
        if pid is None:
            return True
        fd, tracker._fd = getattr(tracker, "_fd", None), None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child (a forked copy), or reaped already
                done = pid
            if done:
                tracker._pid = None
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
    except Exception as exc:  # never fail a session's end
        logger.debug("multiprocessing's resource tracker did not stop cleanly: %s", exc)
        return False
    finally:
        lock.release()
