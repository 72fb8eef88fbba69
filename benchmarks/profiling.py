"""
Where the time goes: wall-clock samples of every thread's Python stack.

:class:`StackSampler` reads, every ``interval_s`` seconds, the Python stack of
every thread of this process (``sys._current_frames()``, CPython) from a thread
of its own, so it sees the task threads, the engine's owner thread and
Prefect's service threads alike (``cProfile`` sees one thread only, or, from
Python 3.12, mixes them). A sample whose innermost frame is a known wait
(:data:`IDLE`: a condition, a queue, a selector) is idle and left out; the
others are a thread running Python, waiting for the GIL, or in a C call
(polars' engine, a socket). A sample stands for the wall time between two
rounds, so the figures are thread-seconds, summed over threads.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from typing import Any

#: Innermost frames (``module:function``) of a thread that waits.
IDLE = frozenset({
    "threading:wait", "threading:_wait_for_tstate_lock", "queue:get", "selectors:select",
    "concurrent.futures.thread:_worker", "prefect_cudf_polars.blocks.engine:_serve",
    "prefect_cudf_polars.blocks.send_queue:_serve",
    "asyncio.base_events:_run_once", "asyncio.selector_events:_read_from_self", "socket:accept",
    "prefect.flow_engine:heartbeat_loop",
})
OURS = "prefect_cudf_polars."


def _thread_group(name: str) -> str:
    """A thread's name without its numbers and ids: ``ThreadPoolExecutor-N_N``, ``cudf-polars-engine-owner-…``."""
    return re.sub(r"\d+", "N", re.sub(r"[0-9a-f]{8,}", "…", name))


class StackSampler:
    """
    Sample every thread's stack while the ``with`` block runs.

    Parameters
    ----------
    interval_s
        Seconds between two rounds of samples.
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.rounds = 0
        self.seconds = 0.0
        self.innermost: Counter[str] = Counter()
        self.ours_inclusive: Counter[str] = Counter()
        self.threads: Counter[str] = Counter()
        self.packages: Counter[str] = Counter()
        self.with_ours = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="benchmarks-stack-sampler", daemon=True)

    def __enter__(self) -> StackSampler:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self._started

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval_s):
            names = {t.ident: t.name for t in threading.enumerate()}
            self.rounds += 1
            for ident, frame in sys._current_frames().items():
                stack, innermost_line = [], frame.f_lineno
                while frame is not None and ident != me:
                    stack.append(f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_name}")
                    frame = frame.f_back
                if not stack or stack[0] in IDLE:
                    continue
                self.innermost[f"{stack[0]}:{innermost_line}"] += 1
                self.threads[_thread_group(names.get(ident, "?"))] += 1
                self.packages[stack[0].split(":")[0].split(".")[0]] += 1
                ours = {s for s in stack if s.startswith(OURS)}
                self.with_ours += bool(ours)
                self.ours_inclusive.update(ours)

    def report(self, top: int = 15) -> dict[str, Any]:
        """
        The samples as thread-seconds.

        Returns
        -------
        dict
            ``wall_s``, ``samples`` (rounds); ``busy_s`` (all threads);
            ``with_our_code_s`` (busy with a frame of ``prefect_cudf_polars``
            on the stack); ``by_thread`` and ``by_package`` (of the innermost
            frame) in seconds; ``top_innermost`` (``module:function:line``) and ``top_ours`` (our
            functions, inclusive): ``[function, seconds]`` pairs, largest first.
        """
        per = self.seconds / max(self.rounds, 1)

        def seconds(counter: Counter[str], n: int | None = None) -> list[list[Any]]:
            return [[k, round(v * per, 4)] for k, v in counter.most_common(n)]

        return {
            "wall_s": self.seconds,
            "samples": self.rounds,
            "busy_s": sum(self.threads.values()) * per,
            "with_our_code_s": self.with_ours * per,
            "by_thread": dict(seconds(self.threads)),
            "by_package": dict(seconds(self.packages, top)),
            "top_innermost": seconds(self.innermost, top),
            "top_ours": seconds(self.ours_inclusive, top),
        }
