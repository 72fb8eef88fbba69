"""
Where a GPU task's time goes: ``time.perf_counter`` around each piece of our task path.

:class:`TaskPathProfile` wraps, for the duration of a ``with`` block, the
pieces one ``gpu_task`` call goes through, and sums their time:

``get_engine_session``
    the session lookup, as ``gpu_task`` calls it;
``session.execute``
    everything our session does for one query, split into
    ``engine.execute`` (the engine call itself, timed on the owner thread),
    ``memory reading`` (rmm statistics after each query, in the same hop to the
    owner thread) and the rest: the hop to the owner thread and back, the
    ``GPUResult`` and its registration;
``task, rest``
    the task call as seen from the flow body minus the above: Prefect's task
    engine (task run, states, events, logs) and our ``gpu_task`` wrapper.

Nothing is changed for good: every wrapped attribute is restored on exit.
"""

from __future__ import annotations

import importlib
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any


class TaskPathProfile:
    """
    Sum the time of each piece of the GPU task path while active.

    Parameters
    ----------
    session
        The open :class:`~prefect_cudf_polars.blocks.EngineSession` the tasks use.
    """

    def __init__(self, session: Any) -> None:
        self.session = session
        self.totals_s: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._restore: list[Callable[[], None]] = []

    def _wrap(self, owner: Any, attr: str, label: str, *, instance: bool) -> None:
        original = getattr(owner, attr)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.totals_s[label] += time.perf_counter() - started
                self.counts[label] += 1

        setattr(owner, attr, wrapper)
        if instance:
            self._restore.append(lambda: owner.__dict__.pop(attr, None))
        else:
            self._restore.append(lambda: setattr(owner, attr, original))

    def __enter__(self) -> TaskPathProfile:
        # The module, not the decorator of the same name that prefect_cudf_polars.tasks exports.
        gpu_task_module = importlib.import_module("prefect_cudf_polars.tasks.gpu_task")
        running = self.session.running_engine
        self._wrap(gpu_task_module, "get_engine_session", "get_engine_session", instance=False)
        self._wrap(self.session, "execute", "session.execute", instance=True)
        self._wrap(running, "memory_per_rank", "memory reading", instance=True)
        self._wrap(running, "memory_in_use", "memory reading", instance=True)
        self._wrap(running, "execute", "engine.execute", instance=True)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._restore:
            self._restore.pop()()

    def breakdown(self, task_total_s: float, calls: int) -> dict[str, float]:
        """
        Milliseconds per task call of each piece.

        Parameters
        ----------
        task_total_s
            Sum of the task calls' times as seen from the flow body (seconds).
        calls
            Number of task calls profiled.

        Returns
        -------
        dict
            ``task total``, ``task, rest (Prefect task engine + gpu_task wrapper)``,
            ``get_engine_session``, ``session.execute``, ``engine.execute``,
            ``memory reading``, ``session, rest (owner-thread hop, GPUResult,
            registry)`` — milliseconds per call.
        """
        t = self.totals_s
        per = 1000.0 / max(calls, 1)
        session_rest = t["session.execute"] - t["engine.execute"] - t["memory reading"]
        task_rest = task_total_s - t["session.execute"] - t["get_engine_session"]
        return {
            "task total": task_total_s * per,
            "task, rest (Prefect task engine + gpu_task wrapper)": task_rest * per,
            "get_engine_session": t["get_engine_session"] * per,
            "session.execute": t["session.execute"] * per,
            "engine.execute": t["engine.execute"] * per,
            "memory reading": t["memory reading"] * per,
            "session, rest (owner-thread hop, GPUResult, registry)": session_rest * per,
        }
