"""
The results of one session and what became of them: produced, consumed, released unread.

Task threads claim and release results while the engine's owner thread admits
new ones, so every entry and count changes under one lock. The book holds the
unread results strongly (their session releases them at its end) and every
other one weakly (a handle nothing else keeps goes away; a claimed result's
frame keeps what it reads, not the handle).
"""

from __future__ import annotations

import threading
import weakref

from prefect_cudf_polars.blocks.backends.plans import cache_uses
from prefect_cudf_polars.blocks.memory import HostCopy
from prefect_cudf_polars.blocks.results import GPUResult


class ResultBook:
    """
    One session's results, thread-safe.

    Attributes
    ----------
    open : bool
        Whether it admits results (until :meth:`close`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, GPUResult] = {}  # unread, in the order produced
        self._all: weakref.WeakSet[GPUResult] = weakref.WeakSet()
        self._by_cache: weakref.WeakValueDictionary[str, GPUResult] = weakref.WeakValueDictionary()
        # Claimed with a frame no query read yet, or released before one did: by id, the handle and what its frame
        # keeps alive (``frame_source``; ``None`` where it keeps nothing of the result's), both weakly. A caller may
        # keep only ``result.lazy()``: the handle goes away, and the frame counts as out until what it keeps goes away.
        self._framed: dict[str, tuple[weakref.ref[GPUResult], weakref.ref[object] | None]] = {}
        self._host_framed: weakref.WeakSet[GPUResult] = weakref.WeakSet()  # claimed with a host frame (re-readable)
        self._counts = {"produced": 0, "consumed": 0, "released_unconsumed": 0}
        self.open = True

    @property
    def counts(self) -> dict[str, int]:
        """Results ``produced``, ``consumed`` and ``released_unconsumed`` so far."""
        with self._lock:
            return dict(self._counts)

    def admit(self, result: GPUResult) -> bool:
        """Count ``result`` produced and unread; False (nothing counted) once the book is closed."""
        with self._lock:
            if self.open:
                self._live[result.id] = result
                self._all.add(result)
                self._counts["produced"] += 1
            return self.open

    def leave(self, result: GPUResult, count: str) -> bool:
        """Whether ``result`` was unread; then it is counted under ``count`` (``"consumed"`` or ``"released_unconsumed"``)."""
        with self._lock:
            live = self._live.pop(result.id, None) is not None
            self._counts[count] += live
            if count == "consumed" and result.cache_id is not None:
                self._by_cache[result.cache_id] = result
                persisted = result.persisted  # read once: the session's end or a release may let go of it meanwhile
                source = None if persisted is None else persisted.frame_source
                self._framed[result.id] = (weakref.ref(result), None if source is None else weakref.ref(source))
                if isinstance(persisted, HostCopy):  # polars could scan its frame twice: look every time
                    self._host_framed.add(result)
        return live

    def frames_out(self) -> bool:
        """Whether a plan may read a frame of this session's results: one was claimed and no query has read it
        yet (or it was released before one did: that read is refused as released), or one reads rows in host
        memory (which a second query could scan again). Other plans need no look."""
        with self._lock:
            self._framed = {i: refs for i, refs in self._framed.items() if _may_be_read(*refs)}
            return bool(self._framed) or bool(self._host_framed)

    def scanned(self, plan: str) -> list[GPUResult]:
        """The results whose claimed frames a logical plan scans (by the ids of their caches)."""
        with self._lock:
            return [r for c in cache_uses(plan) if (r := self._by_cache.get(c)) is not None]

    def results(self) -> tuple[list[GPUResult], list[GPUResult]]:
        """Every result that may hold something, and the unread ones in the order produced."""
        with self._lock:
            return list(self._all), list(self._live.values())

    def close(self) -> list[GPUResult]:
        """Admit no more; the unread results, now counted released unread."""
        with self._lock:
            self.open = False
            live, self._live = list(self._live.values()), {}
            self._counts["released_unconsumed"] += len(live)
            return live


def _may_be_read(result: weakref.ref[GPUResult], source: weakref.ref[object] | None) -> bool:
    """Whether a claimed result's frame may still be read by a plan: while its handle lives, until a query has read
    the frame (or, released first, for good); once the handle is gone, while what the frame keeps lives."""
    handle = result()
    if handle is None:
        return source is not None and source() is not None
    return handle.frame_out or handle.state == "released"
