"""
Sessions still open when the interpreter exits, and the monitor's last writes.

A script that opens a session and exits without closing it (or a process that
ends while a ``with block.session():`` is open) still gets its teardown: one
exit hook closes every open session, after one ``RuntimeWarning`` naming the results that
were still live, and then drains the monitor's writer
(:mod:`~prefect_cudf_polars.blocks.monitoring.writer`) at most
:data:`EXIT_DRAIN_S` seconds (:data:`TERMINATED_DRAIN_S` after a session was
ended by SIGTERM, so a cancelled flow run's process ends quickly). Then the
writer stops: what is still unsent is dropped, with one warning giving the count.

Order at exit (Prefect 3.9): ``threading._shutdown`` runs the callbacks
registered with ``threading._register_atexit`` last-registered first, before
it joins threads and before :mod:`atexit` runs. Prefect's events worker and log
worker register theirs when they start
(``prefect/_internal/concurrency/services.py``, ``QueueService.start``). The
hook here is registered at the first session's open, after Prefect's events
worker is started (:func:`~prefect_cudf_polars.blocks.monitoring.writer.ensure_events_worker`),
so it runs while Prefect's workers still send: the ``engine.stopped`` and
``result.released`` events and the last artifacts reach the API, and nothing
tries to start a worker after shutdown (``can't register atexit after
shutdown``). Lines a session writes from the hook go to Python logging only,
not to a flow run's log.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import TYPE_CHECKING, Any

from prefect_cudf_polars.blocks.monitoring.writer import WRITER, ensure_events_worker

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.session.session import EngineSession

#: Seconds the exit hook waits at most for the monitor's pending writes.
EXIT_DRAIN_S = 30.0
#: The same after a session was ended by a termination signal.
TERMINATED_DRAIN_S = 1.0

_lock = threading.Lock()
_open: dict[str, EngineSession] = {}
_state = {"registered": False, "terminated": False}


def console_logger() -> logging.Logger:
    """Prefect's console logger for lines that belong to no flow run (never sent to the API)."""
    from prefect.logging import get_logger

    return get_logger("prefect_cudf_polars")


def is_termination(exc: BaseException | None) -> bool:
    """Whether ``exc`` is Prefect's ``TerminationSignal`` (SIGTERM, a cancellation)."""
    from prefect.exceptions import TerminationSignal

    return isinstance(exc, TerminationSignal)


def opened(session: EngineSession) -> None:
    """Track an open session (the first one registers the exit hook)."""
    with _lock:
        _open[session.id] = session
        if _state["registered"]:
            return
        _state["registered"] = True
    ensure_events_worker()
    threading._register_atexit(_at_exit)  # type: ignore[attr-defined]  # Prefect uses the same hook


def closed(session: EngineSession, *, terminating: bool = False) -> None:
    """Stop tracking a session that has closed."""
    with _lock:
        _open.pop(session.id, None)
        if terminating:
            _state["terminated"] = True


def _at_exit() -> None:
    with _lock:
        sessions = list(_open.values())
    for session in sessions:
        try:
            _close_at_exit(session)
        except Exception as exc:  # pragma: no cover - the engine failed at exit
            console_logger().warning("cudf-polars engine session %s: teardown at exit failed: %s", session.id, exc)
    limit = TERMINATED_DRAIN_S if _state["terminated"] else EXIT_DRAIN_S
    try:
        WRITER.drain(limit)
    except KeyboardInterrupt:
        pass  # a Ctrl-C at exit ends the drain: what is left is dropped below, and Prefect's own drains still run
    finally:
        # Prefect's events worker stops next: nothing of ours may send after it, so the
        # writer stops sending here whether or not the drain sent everything.
        dropped = WRITER.abandon()
    if dropped:
        console_logger().warning(
            "%d cudf-polars monitoring records (events, artifacts) were not sent within the "
            "%g s exit drain (some may have reached the API). The flow runs' states and logs "
            "are not affected; for flow runs with many results on a slow API, switch parts of "
            "the monitoring off (prefect_cudf_polars.blocks.monitoring.monitor.DEFAULT_OPTIONS).",
            dropped, limit,
        )


def _close_at_exit(session: EngineSession) -> None:
    live = session.live_results
    named = ", ".join(f"{r.name!r} (id {r.id})" for r in live)
    warnings.warn(
        f"cudf-polars engine session {session.id} ({session.backend}) was still open when "
        f"the interpreter exited; its teardown now releases {len(live)} live result(s)"
        f"{': ' + named if named else ''}. Close the session (leave `with block.session():`, "
        "or use CudfPolarsTaskRunner) so results are released when the flow run ends.",
        RuntimeWarning,
        stacklevel=1,
    )
    session.detach_log()
    session.close()


def open_sessions() -> list[Any]:
    """The sessions open now (for diagnostics and tests)."""
    with _lock:
        return list(_open.values())
