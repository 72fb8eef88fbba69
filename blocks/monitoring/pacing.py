"""
When the monitor's writer may work, and how fast it may send.

Two signals, both of this process:

* :class:`EngineActivity`: whether an engine call is running. The writer does
  its Python work (plans, events, artifact requests) only when the engines
  have been quiet for :data:`QUIET_S`, or once a record has waited
  :data:`MAX_DELAY_S`. One process has one interpreter lock: work on the
  writer's thread during an engine call takes it from the engine's own Python
  threads each time they come back from the GPU, which lengthens a short step
  several times the writer's own work.
* :class:`Pacer`: how long the Prefect API takes to answer the writer's
  artifact writes. A busy API (most often one ingesting the flow runs' own
  events and states: a local API on the flow's own cores, SQLite, many short
  task runs) gets one write at a time, with pauses, so that the flow run's own
  final state is not queued behind ours.
"""

from __future__ import annotations

import threading
import time

#: Artifact writes in flight at once while the API keeps up.
CONCURRENCY = 4
#: Seconds an artifact write may take before the writer counts it as slow: an idle API
#: answers in tens of milliseconds (Prefect Cloud in about 0.1 s), a local API on a 2-core
#: machine that is ingesting a flow run's events in about 0.3 s.
BUSY_S = 0.5
#: While the API is busy, the writer waits this many times the last write's time before
#: the next record that writes an artifact, so its writes take a fifth of one connection
#: at most; a record with an event alone waits the last write's time once.
BUSY_WAIT_FACTOR = 4.0
#: Most seconds the writer waits between two records while the API is busy.
MAX_WAIT_S = 5.0
#: Seconds without an artifact write after which a busy API counts as quick again: twice
#: :data:`MAX_WAIT_S`, so that the writer's own longest wait never ends a busy spell.
QUICK_AGAIN_S = 2 * MAX_WAIT_S
#: Seconds without an engine call after which the engines count as quiet.
QUIET_S = 0.1
#: Most seconds a record waits for the engines to be quiet.
MAX_DELAY_S = 5.0
#: Seconds between two looks at whether the engines are quiet.
POLL_S = 0.05


class EngineActivity:
    """
    Whether an engine call is running in this process, and since when none has (thread-safe).

    Sessions' owner threads report each call (:meth:`started`, :meth:`ended`)
    and their own end (:meth:`stopped`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._last_end = 0.0

    def started(self) -> None:
        """An engine call starts."""
        with self._lock:
            self._running += 1

    def ended(self) -> None:
        """An engine call ended (or its session stopped waiting for it: it no longer counts)."""
        with self._lock:
            self._running = max(self._running - 1, 0)
            self._last_end = time.monotonic()

    def stopped(self) -> None:
        """An engine's owner thread ended (its session's teardown ran): quiet at once if no other call runs."""
        with self._lock:
            if not self._running:
                self._last_end = 0.0

    def quiet(self) -> bool:
        """
        Whether no engine call runs and none ended in the last :data:`QUIET_S` seconds.

        Returns
        -------
        bool
        """
        with self._lock:
            return not self._running and time.monotonic() - self._last_end >= QUIET_S


class Pacer:
    """
    How fast the writer sends to one Prefect API: as fast as the API answers its artifact writes.

    Two artifact writes in a row that take more than :data:`BUSY_S` seconds
    each (a failed write counts as slow) make the API busy. While it is busy
    the writer keeps one write in flight and waits :data:`BUSY_WAIT_FACTOR`
    times the last write's time before the next record with an artifact, and
    the last write's time once before a record with an event alone. One write
    answered within :data:`BUSY_S`, or :data:`QUICK_AGAIN_S` without a write,
    makes it quick again.

    Attributes
    ----------
    last_s : float
        Seconds the last artifact write took.
    """

    def __init__(self) -> None:
        self.last_s = 0.0
        self._slow_in_a_row = 0
        self._last_at = 0.0

    def took(self, seconds: float, *, failed: bool = False) -> None:
        """
        Record one artifact write.

        Parameters
        ----------
        seconds : float
            How long the request took, in seconds.
        failed : bool
            The API did not take the artifact (it counts as a slow write).
        """
        self.last_s = max(seconds, BUSY_S) if failed else seconds
        self._slow_in_a_row = self._slow_in_a_row + 1 if failed or seconds > BUSY_S else 0
        self._last_at = time.monotonic()

    @property
    def busy(self) -> bool:
        """The last two writes were slow (or failed), and the last one ended less than :data:`QUICK_AGAIN_S` seconds ago."""
        return self._slow_in_a_row >= 2 and time.monotonic() - self._last_at < QUICK_AGAIN_S

    @property
    def concurrency(self) -> int:
        """Artifact writes in flight at once: :data:`CONCURRENCY`, or 1 while the API is busy."""
        return 1 if self.busy else CONCURRENCY

    def wait_s(self, *, artifact: bool) -> float:
        """
        Seconds to wait before the next record (0 while the API is quick).

        Parameters
        ----------
        artifact : bool
            The record writes an artifact (else it sends an event alone).

        Returns
        -------
        float
            While the API is busy, :data:`BUSY_WAIT_FACTOR` times the last
            write's seconds for a record with an artifact, once the last
            write's seconds for an event alone; at most :data:`MAX_WAIT_S`.
        """
        if not self.busy:
            return 0.0
        return min((BUSY_WAIT_FACTOR if artifact else 1.0) * self.last_s, MAX_WAIT_S)
