"""
The task runs a ``with block.session():`` serves, which its end waits for.

A GPU task submitted inside the with block runs on the flow's task runner, in
a thread of its own; the block's exit must not end the session under it. Each
future a GPU task's ``submit`` or ``map`` returns there is registered here
(:func:`~prefect_cudf_polars.blocks.active.serve_future`) and leaves when its
task run reaches a final state; the session's end waits until none is left,
bounded by the block's ``teardown_timeout``.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class ServedRuns:
    """Prefect futures of task runs still using a session."""

    def __init__(self) -> None:
        self._pending: set[Any] = set()
        self._changed = threading.Condition()

    def add(self, future: Any) -> None:
        """Keep ``future`` until its task run ends (``PrefectFuture.add_done_callback``)."""
        with self._changed:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Any) -> None:
        with self._changed:
            self._pending.discard(future)
            self._changed.notify_all()

    def wait(self, timeout: float) -> int:
        """
        Wait until no served task run is left, at most ``timeout`` seconds.

        Returns
        -------
        int
            How many were still running when the wait ended (0: none).
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            still = len(self._pending)
            self._pending.clear()
            return still
