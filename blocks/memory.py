"""
Held memory: the budget a session keeps its held results under, and results moved to host memory.

With the block's ``device_memory_limit`` the engine's memory resource is
capped (on ``cpu``, the host store counts the same way). A result's partitions
stay in the engine's memory between tasks, and cudf-polars 26.10 keeps them in
its rank-local store, outside rapidsmpf's spill manager: what a flow run holds
never spills by itself. A new result's size is known only once it exists, so
before each engine call the session keeps the unread results the call does not
read within the *held budget*::

    held budget = limit - max(20 % of the limit, the largest partition held)

which leaves the query at least a fifth of the limit, and room for the largest
partition it may read (one in host memory included), as working memory. The
results the call reads, and those other queued calls have claimed, are their
working memory, not held. When the unread others hold more than the budget:

* ``spill_results="off"``: the call fails with
  :class:`~prefect_cudf_polars.blocks.DeviceMemoryError` naming them and their
  bytes; nothing has run, and every result the task did not read stays readable.
* ``spill_results="host"``: the least recently produced unread results move to
  host memory (:class:`HostCopy`: the engine collects each to a host
  ``polars.DataFrame``) until the rest fit; the same check runs after each
  engine call, so the room stays free between tasks. A moved result keeps
  every rule of a result (read once, bound to its session, never persisted by
  a serializer). The query that reads it scans the host frame, copying the
  rows back to the engine as it runs; room is made for them first (the call's
  reads and the rows coming back must then fit the budget together).

With a limit, the engine calls that may add a result run one at a time from
the room they make to the result's registration (:meth:`HeldMemory.room`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl
from prefect.logging.loggers import get_logger

from prefect_cudf_polars.blocks.backends.engine_errors import raise_engine_error
from prefect_cudf_polars.blocks.errors import DeviceMemoryError
from prefect_cudf_polars.blocks.results import free_claimed

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.backends.base import PersistedResult
    from prefect_cudf_polars.blocks.results import GPUResult

logger = get_logger("prefect_cudf_polars")

#: Seconds a task's thread waits at a time for another engine call's room.
WAIT_SLICE_S = 0.05
#: The share of the limit a query keeps as working room at least.
WORKING_SHARE = 0.2

SPILL_OFF_MESSAGE = (
    "This engine call cannot start within device_memory_limit={limit}: the results it does not read hold "
    "{held:,} bytes, over the held budget of {budget:,} bytes (the limit less the larger of 20 % of it and the "
    "largest partition held, the query's working room). Held: {named}. Nothing has run and those results stay "
    "readable. On the CudfPolarsEngine block set spill_results=\"host\" (unread results move to host memory until "
    "the call fits) or raise device_memory_limit; or read or release (`result.release()`) results sooner."
)
HOST_FULL_MESSAGE = (
    "This engine call cannot start within device_memory_limit={limit}: with every unread result moved to host "
    "memory, the inputs that unread deferred steps hold for their readers still take {held:,} bytes, over the held "
    "budget of {budget:,} bytes. On the engine: {named}. Nothing has run. Read those deferred results sooner, run "
    "their steps without defer=True, or raise device_memory_limit on the CudfPolarsEngine block."
)


def held_budget(limit: int, largest_partition: int) -> int:
    """Bytes the results a call does not read may hold on the engine: ``limit - max(20 % of limit, largest_partition)``."""
    return limit - max(int(limit * WORKING_SHARE), largest_partition)


def on_engine(result: GPUResult) -> int:
    """Bytes ``result`` holds in the engine's memory now (0 once read or released, or while in host memory)."""
    persisted = result.persisted
    if persisted is None or isinstance(persisted, HostCopy):
        return 0
    return result.bytes or 0


def read_by(claimed: Iterable[GPUResult]) -> dict[str, GPUResult]:
    """The results a call reads, by id: those it claimed and, for deferred ones, the inputs their plans hold."""
    found: dict[str, GPUResult] = {}
    stack = list(claimed)
    while stack:
        result = stack.pop()
        if result.id not in found:
            found[result.id] = result
            stack.extend(result.held_inputs)
    return found


class HostCopy:
    """
    A result moved to host memory (a ``PersistedResult``): its rows as a host ``polars.DataFrame``.

    Its frame (:meth:`lazy`) scans the host rows: the query that reads it
    copies them back to the engine as it runs, within the room made for it.

    Parameters
    ----------
    frame : polars.DataFrame
        The result's rows, collected from the engine.
    ranks : list of int
        The ranks that held it.
    seconds : float
        Seconds the move to host memory took.

    Attributes
    ----------
    out_seconds : float
        Seconds the move to host memory took.
    """

    __slots__ = ("_frame", "out_seconds", "ranks", "schema")

    def __init__(self, frame: pl.DataFrame, ranks: Sequence[int], seconds: float) -> None:
        self._frame: pl.DataFrame | None = frame
        self.schema, self.ranks, self.out_seconds = frame.schema, list(ranks), seconds

    def lazy(self) -> pl.LazyFrame:
        """A LazyFrame over the host rows (the engine copies them back as the reading query runs)."""
        if self._frame is None:
            raise RuntimeError("This result's host copy was released; run the task that produced it again.")
        return self._frame.lazy()

    def release(self) -> None:
        """Drop the host rows (idempotent; a frame already built keeps them until it is dropped)."""
        self._frame = None

    def forget(self) -> None:
        """Drop the host rows."""
        self._frame = None


class EngineAccess(Protocol):
    """What the held-memory policy asks of its session (:class:`~prefect_cudf_polars.blocks.EngineSession`)."""

    running_engine: Any

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the engine's owner thread."""
        ...

    def free(self, persisted: PersistedResult) -> None:
        """Free ``persisted`` on the engine's owner thread."""
        ...

    def held_results(self) -> tuple[list[GPUResult], list[GPUResult]]:
        """Every result that may hold something, and the unread ones in the order produced."""
        ...


class HeldMemory:
    """
    One session's held-memory policy, its moves to host memory and back, and its figures (see the module notes).

    With a limit, engine calls that may add a result run one at a time from the
    room they make to the result's registration (:meth:`room`), so each sees
    the results the ones before it produced: the engine runs its calls one at a
    time anyway. A result is moved under its own lock, so no claim reads it
    meanwhile; the engine's owner thread never waits for the lock of an unread
    result, nor for this room.

    Parameters
    ----------
    spill : {"off", "host"}
        The block's ``spill_results``.
    session : EngineAccess
        The session whose results it keeps within the budget.
    moved : callable
        ``moved(result, way, seconds)`` tells Prefect of a move (``way``: ``"out"`` to host memory, with its
        seconds; ``"back"``, read back by a query, ``seconds`` None).

    Attributes
    ----------
    limit : int or None
        ``device_memory_limit`` in bytes on each rank, once the engine has started (``None``: no limit).
    ranks : int
        The engine's ranks: held bytes are summed over them, so the budget is the per-rank one times this.
    peak_held : int
        Most bytes the session's results held on the engine after any engine call.
    spills : dict
        ``results``, ``bytes`` and ``out_seconds`` moved to host memory; ``back`` (results read back by a
        query, which copies them as it runs: the seconds are in its engine seconds) and ``back_bytes``.
    """

    def __init__(self, spill: str, session: EngineAccess, moved: Callable[[GPUResult, str, float | None], None]) -> None:
        self.spill, self.limit, self.ranks, self.peak_held = spill, None, 1, 0
        self.spills: dict[str, Any] = {"results": 0, "bytes": 0, "out_seconds": 0.0, "back": 0, "back_bytes": 0}
        self._session, self._moved = weakref.proxy(session), moved  # the session holds this: no cycle
        self._lock, self._room = threading.Lock(), threading.RLock()

    @contextlib.contextmanager
    def room(self, claimed: Sequence[GPUResult]) -> Iterator[None]:
        """
        Make room for an engine call that reads ``claimed`` (:meth:`make_room`) and hold it until the block ends.

        Claimed results in host memory come back as the call runs: they are counted as read back when it ends
        without an error.

        Without a limit, nothing. The wait for another call's room is in short
        slices, so an exception Prefect injects into the task's thread (its
        timeout) ends it.

        Raises
        ------
        DeviceMemoryError, SessionError
            As :meth:`make_room`.
        """
        if self.limit is None:
            yield
            return
        self._enter_room()
        try:
            read = read_by(claimed)
            coming = [r for r in read.values() if isinstance(r.persisted, HostCopy)]
            try:
                self.make_room(read)
            except BaseException:
                free_claimed(claimed)  # refused before the engine call: what the call claimed is freed, as after one
                raise
            yield
            for result in coming:
                self._count(result, "back", None)
        finally:
            self._room.release()

    def _enter_room(self) -> None:
        """Take the room, waiting in slices (an exception Prefect injects into the task's thread ends the wait)."""
        while not self._room.acquire(timeout=WAIT_SLICE_S):
            pass

    def start(self, limit: int | None, ranks: int) -> None:
        """The engine started: its ``device_memory_limit`` in bytes per rank (``None``: none) and its ranks."""
        self.limit, self.ranks = limit, max(ranks, 1)

    def note_held(self, fresh: GPUResult) -> None:
        """
        After an engine call produced ``fresh``: keep the peak; with ``spill="host"``, move older results until
        the held fit the budget (best effort: a failure to move is logged; interrupted, ``fresh`` is released).
        """
        if self.limit is None:
            return
        total = sum(map(on_engine, self._session.held_results()[0]))
        with self._lock:
            self.peak_held = max(self.peak_held, total)
        if self.spill == "host":
            try:
                self.make_room({}, keep=fresh, refuse=False)
            except Exception as exc:
                logger.warning("cudf-polars could not move a result to host memory after %r was produced: %s: %s",
                               fresh.name, type(exc).__name__, exc)
            except BaseException:  # interrupted (a task's timeout): the new result is not handed out
                fresh.release()
                raise

    def make_room(self, read: Mapping[str, GPUResult], *, keep: GPUResult | None = None, refuse: bool = True) -> None:
        """
        Before an engine call that reads ``read`` (:func:`read_by` of what it claimed): keep the others within budget.

        Results it reads from host memory come back as it runs, as working memory like its other reads.
        ``keep`` is counted but not moved (the result a call just produced). ``refuse=False`` (after a call)
        moves what it can and raises nothing when that is not enough.

        Raises
        ------
        DeviceMemoryError
            The unread results it does not read hold more than the held budget, and ``spill`` is ``"off"``
            or moving every unread one is not enough; nothing has run.
        SessionError
            The session ended while a result moved.
        """
        if self.limit is None:
            return
        self._enter_room()  # re-entered by the call that holds the room (after its result is registered)
        try:
            while True:
                held, live = self._session.held_results()
                largest = max(((r.bytes or 0) // max(r.partitions, 1) for r in held if r.persisted is not None),
                              default=0)
                budget = self.ranks * held_budget(self.limit, largest)
                # Held: the unread results, and the inputs unread deferred results hold for their readers.
                others = list({r.id: r for d in live if d.id not in read for r in read_by((d,)).values()
                               if on_engine(r)}.values())
                total = sum(map(on_engine, others))
                if total <= budget:
                    return
                movable = [r for r in live if r.id not in read and not r.deferred and on_engine(r) and r is not keep]
                if self.spill != "host" or not movable:
                    break
                self._move_out(movable[0])  # the least recently produced; another task may have claimed it meanwhile
        finally:
            self._room.release()
        if refuse:
            raise DeviceMemoryError(self._refusal(others, live, total, budget))

    def _refusal(self, others: list[GPUResult], live: list[GPUResult], total: int, budget: int) -> str:
        order = {r.id: i for i, r in enumerate(live)}  # unread ones in the order produced, then those being read
        kept = sorted(others, key=lambda r: order.get(r.id, len(order)))
        named = ", ".join(f"{r.name!r} ({on_engine(r):,} bytes, from {r.produced_by})" for r in kept[:20])
        limit = f"{self.limit:,} bytes" + (f" on each of {self.ranks} ranks" if self.ranks > 1 else "")
        template = SPILL_OFF_MESSAGE if self.spill != "host" else HOST_FULL_MESSAGE
        return template.format(limit=limit, held=total, budget=budget, named=named + (" ..." if len(kept) > 20 else ""))

    def _move_out(self, result: GPUResult) -> None:
        def out(persisted: PersistedResult) -> HostCopy | None:  # under the result's lock: no claim meanwhile
            if isinstance(persisted, HostCopy):
                return None  # in host memory, or back and read
            started = time.perf_counter()
            running = self._session.running_engine
            try:
                frame = self._session.run(lambda: running.collect(persisted.lazy(), pl.QueryOptFlags()))
            except Exception as exc:
                raise_engine_error(exc)
            self._session.free(persisted)  # what the read left
            return HostCopy(frame, persisted.ranks, time.perf_counter() - started)

        try:
            copy = result.move(out)
        except BaseException:  # the move failed or was interrupted: the rows may have left the engine unkept
            result.release()  # a reader is told it was released, not a misleading second-read error
            raise
        if copy is not None:
            self._count(result, "out", copy.out_seconds)  # type: ignore[attr-defined]

    def _count(self, result: GPUResult, way: str, seconds: float | None) -> None:
        with self._lock:
            self.spills["results" if way == "out" else "back"] += 1
            self.spills["bytes" if way == "out" else "back_bytes"] += result.bytes or 0
            self.spills["out_seconds"] += seconds or 0.0
        self._moved(result, way, seconds)

    def summary(self) -> dict[str, Any]:
        """``limit`` (bytes per rank), ``ranks``, ``peak_held`` (bytes), ``spill_results`` and ``spills``."""
        with self._lock:
            return {"limit": self.limit, "ranks": self.ranks, "peak_held": self.peak_held,
                    "spill_results": self.spill, "spills": dict(self.spills)}
