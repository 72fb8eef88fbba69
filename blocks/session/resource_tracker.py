"""
multiprocessing's resource tracker, stopped when a session is ended by SIGTERM.

A backend that starts processes with multiprocessing's spawn method (distributed's
``LocalCUDACluster``, on ``dask``) starts multiprocessing's resource tracker: a child of
the flow process, in the flow run's process group. Python 3.12 and 3.13 do not wait for it
at exit: it ends just after the flow process, orphaned, and stays in the group as a zombie
until the machine's PID 1 reaps it. A Prefect 3.9 process worker cancels a flow run with
SIGTERM to that group and then checks every 3 s whether the group is gone, so the zombie
can cost a cancelled run one more check before it is ``Cancelled``.

Python 3.14 stops the tracker itself at exit (CPython issue 88887, pull 130429). A
session ended by SIGTERM does the same once its engine has shut down
(:func:`stop_after_termination`): it closes the tracker's pipe and waits, at most
:data:`STOP_WAIT_S` seconds, for the tracker to end, so the flow process leaves nothing in
its group. The process is ending then, so the tracker's cleanup (unlinking what is still
registered with it) is what its exit would have done anyway. Nothing is done in a
process that started no tracker.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("prefect_cudf_polars.session")

#: Seconds a terminated session waits at most for the resource tracker to end.
STOP_WAIT_S = 2.0


def stop_after_termination(timeout: float = STOP_WAIT_S) -> bool:
    """
    Stop this process's multiprocessing resource tracker and wait for it, at most ``timeout`` seconds.

    For a process that is ending because of SIGTERM; never raises.

    Parameters
    ----------
    timeout : float
        Seconds to wait for the tracker to end (it ends once every process
        holding its pipe has exited).

    Returns
    -------
    bool
        True when no tracker of this process is left (none was started, or it ended and was reaped).
    """
    from multiprocessing import resource_tracker

    # CPython 3.12's ResourceTracker: ``_pid`` is set only in the process that started
    # the tracker, and ``_stop()`` closes its pipe and reaps it, what CPython 3.14 does
    # at exit (checked against CPython 3.12.1 and 3.12.3).
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    stop = getattr(tracker, "_stop", None)
    if stop is None or getattr(tracker, "_pid", None) is None:
        return True

    def run() -> None:
        try:
            stop()
        except Exception as exc:  # already reaped by someone else, or a reentrant call
            logger.debug("multiprocessing's resource tracker did not stop cleanly: %s", exc)

    thread = threading.Thread(target=run, name="cudf-polars-resource-tracker", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        logger.warning(
            "multiprocessing's resource tracker had not ended %g s after this session's engine "
            "shut down (a process started with multiprocessing still holds it); the process "
            "exits without waiting for it.",
            timeout,
        )
        return False
    return True
