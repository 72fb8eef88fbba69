"""
The result registry of one session: which results are live, and what became of the others.

Every result a session produces is registered here when it is created, and
leaves the registry once, when it is claimed by its reader (counted
*consumed*) or released before anyone read it (counted *released
unconsumed*). At the session's end the registry closes and hands back the
results still live, which the session releases; a result produced after that
is refused.

The registry also knows every result of the session that Python still holds
(weakly: it keeps none alive), so that the session's end can release the ones
that still hold engine memory (live, or consumed by a read that left
something behind) and point all of them at a tombstone instead of the session.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.results.result import GPUResult


class ResultRegistry:
    """
    Live results of one session, and the counts of what became of all of them.

    Attributes
    ----------
    counts : dict of str to int
        ``produced``, ``consumed`` and ``released_unconsumed``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, GPUResult] = {}
        self._all: weakref.WeakSet[GPUResult] = weakref.WeakSet()
        self._closed = False
        self.counts = {"produced": 0, "consumed": 0, "released_unconsumed": 0}

    @property
    def live(self) -> tuple[GPUResult, ...]:
        """The results registered and not yet consumed or released."""
        with self._lock:
            return tuple(self._live.values())

    def add(self, result: GPUResult) -> bool:
        """Register a new live result; False (nothing registered) once the registry is closed."""
        with self._lock:
            if self._closed:
                return False
            self._live[result.id] = result
            self._all.add(result)
            self.counts["produced"] += 1
            return True

    def late(self) -> None:
        """Count a result whose caller stopped waiting: produced, and released unconsumed at once."""
        with self._lock:
            self.counts["produced"] += 1
            self.counts["released_unconsumed"] += 1

    def claimed(self, result: GPUResult) -> bool:
        """Record that ``result`` was claimed; True when it was live here (counted once)."""
        with self._lock:
            if self._live.pop(result.id, None) is None:
                return False
            self.counts["consumed"] += 1
            return True

    def released(self, result: GPUResult) -> None:
        """Record that ``result`` was released before anyone read it."""
        with self._lock:
            self._live.pop(result.id, None)
            self.counts["released_unconsumed"] += 1

    def close(self) -> list[GPUResult] | None:
        """
        Close the registry.

        Returns
        -------
        list of GPUResult or None
            The results still live, to release; ``None`` if it was already closed.
        """
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            return list(self._live.values())

    def holding(self) -> list[GPUResult]:
        """
        The results that still hold something to free: engine memory (live, or consumed
        with something left), or a deferred plan and the inputs it reads.
        """
        with self._lock:
            return [r for r in list(self._all) if r.holding]

    def forget(self) -> list[GPUResult]:
        """Hand back every result still alive and keep none (the session's end)."""
        with self._lock:
            found = list(self._all)
            self._all = weakref.WeakSet()
            self._live.clear()
            return found
