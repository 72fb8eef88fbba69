"""
Memory readings of one session: at its start, before its shutdown, and the peaks in between.

GPU backends read rmm statistics (bytes rmm has allocated now, on each rank);
the ``cpu`` backend reads its host store. The session takes a reading after
every engine call, on the owner thread; a backend whose ranks are read apart
(``spmd``, ``dask``, ``ray``) gives one reading per rank, and the total is
their sum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.backends.base import RunningEngine


class MemoryTracker:
    """
    Bytes a session's engine holds: named readings and peaks.

    Attributes
    ----------
    readings : dict of str to (int or None)
        ``at_start`` (after the engine started) and ``before_shutdown`` (after
        every result was released), in bytes; ``None`` where unreadable.
    peak : int or None
        Highest total reading, in bytes.
    peak_per_rank : dict of int to int
        Highest reading of each rank, in bytes (backends that read ranks apart).
    """

    def __init__(self) -> None:
        self.readings: dict[str, int | None] = {}
        self.peak: int | None = None
        self.peak_per_rank: dict[int, int] = {}

    def read(self, running: RunningEngine) -> int | None:
        """
        Read the engine's memory now (call on the owner thread) and keep the peaks.

        Returns
        -------
        int or None
            Bytes in use, summed over ranks; ``None`` when unreadable.
        """
        per_rank = running.memory_per_rank()
        if per_rank is None:
            total = running.memory_in_use()
        else:
            total = None if any(v is None for v in per_rank) else sum(v for v in per_rank if v is not None)
            for rank, value in enumerate(per_rank):
                if value is not None and value > self.peak_per_rank.get(rank, -1):
                    self.peak_per_rank[rank] = value
        if total is not None and (self.peak is None or total > self.peak):
            self.peak = total
        return total

    def record(self, name: str, running: RunningEngine) -> int | None:
        """Take a reading (see :meth:`read`) and keep it as ``readings[name]``."""
        self.readings[name] = value = self.read(running)
        return value
