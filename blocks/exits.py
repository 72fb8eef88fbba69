"""
Sessions still open when the interpreter exits: closed then, with one warning each.

A script that opens a session and exits without closing it (or a process that
ends while a ``with block.session():`` is open) still gets its teardown: the
engine is shut down on its owner thread and the warning names the results
that were still live. The hook runs before the interpreter joins its threads
and before :mod:`atexit` (so before distributed's own exit handler closes an
owned cluster under the engine); Prefect's services may already have stopped,
so what the session says then goes to Python logging only.
"""

from __future__ import annotations

import logging
import threading
import warnings
import weakref
from typing import Any, Protocol

from prefect_cudf_polars.blocks.backends.compat import register_before_thread_shutdown


class ClosableSession(Protocol):
    """What the exit hook needs of a session."""

    id: str
    backend: str | None

    @property
    def live_results(self) -> tuple[Any, ...]: ...

    def close_at_exit(self) -> None: ...


_open: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_registered = [False]


def opened(session: ClosableSession) -> None:
    """Track an open session (the first one registers the exit hook)."""
    with _lock:
        if not _registered[0]:
            register_before_thread_shutdown(_close_open_sessions)
            _registered[0] = True
        _open.add(session)


def closed(session: ClosableSession) -> bool:
    """Stop tracking a session that has closed; returns whether no session of this process is open now."""
    with _lock:
        _open.discard(session)
        return not _open


def _close_open_sessions() -> None:
    with _lock:
        sessions = list(_open)
    for session in sessions:
        live = session.live_results
        named = ", ".join(f"{r.name!r} (id {r.id})" for r in live)
        warnings.warn(f"cudf-polars engine session {session.id} ({session.backend}) was still open when the "
                      f"interpreter exited; its teardown now releases {len(live)} live "
                      f"result(s){': ' + named if named else ''}. Close the session (leave `with block.session():`, or "
                      "use CudfPolarsTaskRunner) so results are released when the flow run ends.", RuntimeWarning)
        try:
            session.close_at_exit()
        except Exception as exc:  # the engine failed at exit
            logging.getLogger("prefect_cudf_polars.session").warning("Engine session %s: teardown at exit failed: %s", session.id, exc)
