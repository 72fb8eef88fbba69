"""
Held memory: one ledger per engine host, per rank, of the results held on the engine, and results moved to host memory.

With the block's ``device_memory_limit`` the engine's memory resource is
capped on every rank (on ``cpu``, the host store counts the same way). A
result's partitions stay in the engine's memory between tasks, and cudf-polars
26.10 keeps them in its rank-local store, outside the buffers rapidsmpf's spill
manager spills: they move only as the ledger moves them. The engine host keeps one
:class:`MemoryLedger` of every held result of every session on it (a flow run,
and the subflows that share its block), and before each engine call keeps the
unread results the call does not read within the *held budget* of each rank::

    held budget = limit - max(20 % of the limit, the largest partition held on the rank)

which leaves the query at least a fifth of each rank's limit, and room for the
largest partition it may read (one in host memory included), as working
memory. The results the call reads, and those other calls have claimed, are
their working memory, not held. When the unread others hold more than the
budget on a rank:

* ``spill_results="off"``: the call fails with
  :class:`~prefect_cudf_polars.blocks.DeviceMemoryError` naming them, their
  bytes and the run that produced each (a parent flow run's included); nothing
  has run, and every result the task did not read stays readable.
* ``spill_results="host"``: the least recently produced unread results holding
  bytes on that rank move to host memory until the rest fit: on ``spmd`` each
  partition is packed into the engine's pinned pool and unpacked into its own
  store slot before the query that reads it runs (:data:`PINNED`); elsewhere
  the engine collects the result to a host ``polars.DataFrame`` that the
  reading query scans (:class:`HostCopy`, :data:`HOST_FRAME`). The same check
  runs after each engine call, so the room stays free between tasks. A moved
  result keeps every rule of a result (read once, bound to its session, never
  persisted by a serializer).

Room is made on the engine's owner thread as a step of the engine call itself
(after its plan is checked, before the engine runs), and a new result is
counted there when the call produces it: the owner thread runs one call at a
time, so each call sees every result the calls before it produced, whichever
session made them. With ``spill_results="host"`` a running query that needs
more than that room asks for it too: an allocation that would pass the limit
(on ``spmd``, through the engine's memory resource,
:mod:`~prefect_cudf_polars.blocks.memory_demand`, and rapidsmpf's spill
manager at a reservation past ``spill_device_limit``; on ``cpu``, a result
the store cannot take) first moves unread results the call does not read
out (:meth:`MemoryLedger.on_demand`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import polars as pl
from prefect.logging.loggers import get_logger

from prefect_cudf_polars.blocks.backends.base import PersistedResult, RunningEngine
from prefect_cudf_polars.blocks.backends.engine_errors import error_text, raise_engine_error
from prefect_cudf_polars.blocks.errors import MAKE_ROOM, RUN_PRODUCER_AGAIN, DeviceMemoryError
from prefect_cudf_polars.blocks.results import GPUResult

logger = get_logger("prefect_cudf_polars")

#: Whether this thread is moving a result now (its allocations do not ask for room: :meth:`MemoryLedger.on_demand`).
_moving = threading.local()

#: The share of the limit a query keeps as working room at least.
WORKING_SHARE = 0.2

SPILL_OFF_MESSAGE = ("This engine call cannot start within device_memory_limit={limit}: the results it does not read "
                     "hold {held:,} bytes{on_rank}, over the held budget of {budget:,} bytes (the limit less the larger "
                     "of 20 % of it and the largest partition held, the query's working room). Held: {named}. Nothing "
                     f"has run and those results stay readable. To make room, {MAKE_ROOM}.")
HOST_LIMIT_MESSAGE = ("This engine call cannot start within device_memory_limit={limit}: the unread results it does "
                      "not read hold {held:,} bytes{on_rank}, over the held budget of {budget:,} bytes, and host memory "
                      "cannot take them: results moved out already hold {host_held:,} bytes of host_spill_limit="
                      "{host_limit:,} bytes. Held: {named}. Nothing has run. Raise host_spill_limit or "
                      "device_memory_limit on the CudfPolarsEngine block, or read or release held results sooner.")
HOST_FULL_MESSAGE = ("This engine call cannot start within device_memory_limit={limit}: with every unread result moved "
                     "to host memory, the inputs that unread deferred steps hold for their readers still take {held:,} "
                     "bytes{on_rank}, over the held budget of {budget:,} bytes. On the engine: {named}. Nothing has "
                     "run. Read those deferred results sooner, run their steps without defer=True, or raise "
                     "device_memory_limit on the CudfPolarsEngine block.")

#: ``moved(result, way, seconds, route)``: tells Prefect of a move (``"out"`` to host memory or ``"back"``, its
#: seconds where the ledger timed it, and its route, :data:`PINNED` or :data:`HOST_FRAME`).
Moved = Callable[["GPUResult", str, "float | None", str], None]
#: The routes of a move: packed into pinned host memory and back into the engine's store in place
#: (``spmd``), or collected to a host ``polars.DataFrame`` that the reading query scans (other backends).
PINNED, HOST_FRAME = "pinned", "host frame"


def held_budget(limit: int, largest_partition: int) -> int:
    """Bytes the results a call does not read may hold on a rank: ``limit - max(20 % of limit, largest_partition)``."""
    return limit - max(int(limit * WORKING_SHARE), largest_partition)


def over_budget(limit: int, held: Sequence[int], largest: Sequence[int]) -> list[tuple[int, int, int]]:
    """
    The ranks whose held bytes are over their held budget, each as ``(rank, held, budget)``.

    Parameters
    ----------
    limit : int
        ``device_memory_limit`` in bytes, on each rank.
    held, largest : sequence of int
        Per rank: the bytes the unread results a call does not read hold there, and the largest partition there.
    """
    budgets = [held_budget(limit, big) for big in largest]
    return [(rank, total, budget) for rank, (total, budget) in enumerate(zip(held, budgets)) if total > budget]


def on_engine(result: GPUResult) -> int:
    """Bytes ``result`` holds in the engine's memory now, over its ranks (0 once read or released, or in host memory)."""
    return sum(held_by_rank(result))


def held_by_rank(result: GPUResult) -> tuple[int, ...]:
    """Bytes ``result`` holds in the engine's memory now, by rank (empty once read or released, or in host memory)."""
    persisted = result.persisted
    return () if persisted is None or persisted.moved_out else result.rank_bytes


def moved_out(result: GPUResult) -> PersistedResult | None:
    """What ``result`` holds out of the engine's memory now (pinned memory or a host frame), else ``None``. It reads
    ``result.persisted`` once: a release on another thread may let go of it between two reads."""
    persisted = result.persisted
    return persisted if persisted is not None and persisted.moved_out else None


def host_held(results: Iterable[GPUResult]) -> int:
    """Bytes those of ``results`` moved out of the engine hold in host memory."""
    return sum(r.bytes or 0 for r in results if moved_out(r) is not None)


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
    """

    __slots__ = ("_frame", "ranks", "schema")

    #: Always in host memory.
    moved_out = True
    #: Its frame scans the rows, not this copy.
    frame_source = None

    def __init__(self, frame: pl.DataFrame, ranks: Sequence[int]) -> None:
        self._frame: pl.DataFrame | None = frame
        self.schema, self.ranks = frame.schema, list(ranks)

    def lazy(self) -> pl.LazyFrame:
        """A LazyFrame over the host rows (the engine copies them back as the reading query runs)."""
        if self._frame is None:
            raise RuntimeError(f"This result's host copy was released: {RUN_PRODUCER_AGAIN}.")
        return self._frame.lazy()

    def release(self) -> None:
        """Drop the host rows (idempotent; a frame already built keeps them until it is dropped)."""
        self._frame = None

    forget = release


class MemoryLedger:
    """
    The results held on one engine, by rank, of every session on its host; their moves to host memory and back.

    Its engine host builds it and :meth:`start` s it once the engine has started; :meth:`make_room`,
    :meth:`read_back` and an :meth:`add` of a result holding partitions run on the engine's owner thread, as
    steps of an engine call. A result is moved under its own lock, so no claim
    reads it meanwhile. Without a limit it keeps nothing and every method returns at once. It holds no
    engine: a move to host memory uses the ``running`` engine its caller passes.

    Attributes
    ----------
    spill : {"off", "host"}
        The block's ``spill_results``.
    limit : int or None
        ``device_memory_limit`` in bytes on each rank, once the engine has started (``None``: no limit).
    ranks : int
        The engine's ranks.
    peak_held : int
        Most bytes held on one rank after any engine call.
    spills : dict
        ``results``, ``bytes`` and ``out_seconds`` moved to host memory (``on_demand`` of them while a query
        that needed the room ran, :meth:`on_demand`); ``back`` (results read back by a query) and ``back_bytes``,
        ``back_seconds`` (of pinned moves back), ``routes`` (moves out per route).
    """

    def __init__(self) -> None:
        self.spill, self.limit, self.ranks, self.peak_held, self.host_limit = "off", None, 1, 0, 0
        self.spills: dict[str, Any] = {"results": 0, "bytes": 0, "out_seconds": 0.0, "back": 0, "back_bytes": 0,
                                       "back_seconds": 0.0, "routes": {}, "on_demand": 0}
        self._held: dict[str, weakref.ref[GPUResult]] = {}  # in the order produced
        self._moved: weakref.WeakKeyDictionary[GPUResult, Moved] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # the ledger's entries and figures, read from any thread
        self._demand_lock = threading.Lock()  # moves on a running query's demand, one thread at a time
        # Demands move nothing: from the ledger's first move in make_room until its moves end (it holds the moved
        # result's lock, and the host frame route runs the engine), and after a failed demand until they end again.
        self._no_demand = False

    def start(self, spill: str, limit: int | None, ranks: int, host_limit: int = 0) -> None:
        """The engine started: the block's ``spill_results``, its limit in bytes per rank (``None``: none), its ranks,
        and ``host_spill_limit`` in bytes (what moved results may hold in host memory)."""
        self.spill, self.limit, self.ranks, self.host_limit = spill, limit, max(ranks, 1), host_limit

    def add(self, fresh: GPUResult, moved: Moved, running: RunningEngine) -> None:
        """
        Hold ``fresh`` in the ledger (``moved`` tells its session's Prefect of its moves). After an engine call
        produced it (on the owner thread): keep the peak, and with ``spill="host"`` move older results with the
        ``running`` engine until the held fit the budget (best effort: a failure to move is logged).
        """
        if self.limit is None:
            return
        with self._lock:
            self._held[fresh.id], self._moved[fresh] = weakref.ref(fresh), moved
        if fresh.persisted is None:  # deferred: its plan's inputs are held already
            return
        peak = max(self._by_rank(self._results()))
        with self._lock:
            self.peak_held = max(self.peak_held, peak)
        if self.spill == "host":
            try:
                self.make_room({}, running, keep=fresh, refuse=False)
            except Exception as exc:
                logger.warning("cudf-polars could not move a result to host memory after %r was produced: %s",
                               fresh.name, error_text(exc))

    def _results(self) -> list[GPUResult]:
        """The results held, in the order produced (those that are gone, or hold nothing, leave the ledger)."""
        with self._lock:
            results = [r for ref in self._held.values() if (r := ref()) is not None and r.holding]
            self._held = {r.id: weakref.ref(r) for r in results}
        return results

    def _by_rank(self, results: Iterable[GPUResult]) -> list[int]:
        """Bytes ``results`` hold on each rank."""
        held = [held_by_rank(result) for result in results]
        return [sum(sizes[rank] for sizes in held if len(sizes) > rank) for rank in range(self.ranks)]

    def make_room(self, read: Mapping[str, GPUResult], running: RunningEngine, *, keep: GPUResult | None = None,
                  refuse: bool = True) -> list[GPUResult]:
        """
        Before an engine call that reads ``read`` (:func:`read_by` of what it claimed): keep the others within budget,
        moving results to host memory with ``running``, the engine; then put the pinned results it reads back into
        the engine's store, where their frames read them.

        Results it reads from host frames come back as it runs, as working memory like its other reads.
        ``keep`` is counted but not moved (the result a call just produced). ``refuse=False`` (after a call)
        moves what it can and raises nothing when that is not enough.

        Returns
        -------
        list of GPUResult
            The results the call reads from host frames, which its query reads back as it runs (for
            :meth:`read_back`).

        Raises
        ------
        DeviceMemoryError
            On a rank, the unread results it does not read hold more than the held budget, and ``spill`` is
            ``"off"`` or moving every unread one is not enough; nothing has run.
        """
        if self.limit is None:
            return []
        try:
            while True:
                results = self._results()
                live = [r for r in results if r.state == "live"]
                # Held: the unread results, and the inputs unread deferred results hold for their readers.
                others = list({r.id: r for d in live if d.id not in read for r in read_by((d,)).values()}.values())
                # The largest partition on each rank (a result in host memory comes back whole).
                largest = [max((r.rank_bytes[rank] for r in results if r.persisted is not None
                                and len(r.rank_bytes) > rank), default=0) for rank in range(self.ranks)]
                over = over_budget(self.limit, self._by_rank(others), largest)
                if not over:
                    break
                movable, fits = self._movable(results, {rank for rank, _, _ in over}, read, keep)
                if self.spill != "host" or not fits:
                    if refuse:
                        raise DeviceMemoryError(self._refusal(others, over[0], results, host_full=bool(movable)))
                    break
                with self._demand_lock:  # a demand waits for no result lock this move holds
                    self._no_demand = True
                self._move_out(fits[0], running)  # the least recently produced that host memory can take
        finally:
            with self._demand_lock:  # the ledger's moves are over: demands may move again
                self._no_demand = False
        frames = [result for result in read.values() if isinstance(result.persisted, HostCopy)]
        for result in read.values():  # the pinned ones go back into the store in place
            if (persisted := moved_out(result)) is not None and not isinstance(persisted, HostCopy):
                started = time.perf_counter()
                running.move_back(persisted)
                self._count(result, "back", time.perf_counter() - started, PINNED)
        return frames

    def _movable(self, results: list[GPUResult], ranks: set[int], read: Mapping[str, GPUResult],
                 keep: GPUResult | None = None) -> tuple[list[GPUResult], list[GPUResult]]:
        """Of ``results``, the unread ones holding bytes on ``ranks``, neither in ``read`` (what a call reads) nor
        ``keep``, least recently produced first; and of those, the ones host memory can take now."""
        movable = [r for r in results if r.state == "live" and r.id not in read and not r.deferred
                   and r is not keep and any(size and rank in ranks for rank, size in enumerate(held_by_rank(r)))]
        room = self.host_limit - host_held(results)
        return movable, [r for r in movable if (r.bytes or 0) <= room]

    def on_demand(self, nbytes: int, running: RunningEngine) -> int:
        """
        The ``running`` engine needs room for ``nbytes`` bytes while a query runs (on the thread that allocates;
        on ``spmd`` the allocation that would pass the limit, on ``cpu`` the bytes past it): with ``spill="host"``,
        move unread results the running call does not read to host memory, least recently produced first, until
        as many bytes left the engine. Returns the bytes that did (any: the engine tries again; none: its
        allocation fails as out of memory). A failure to move is logged, never raised; the result stays readable,
        and no move on demand is tried again until the ledger next makes room, before or after an engine call
        (rapidsmpf's spill manager asks every time its periodic check finds a reservation past
        ``spill_device_limit``). From the ledger's first move in :meth:`make_room` until its moves end (also when they
        fail), a demand moves nothing: the ledger holds the moved result's lock, and the host frame route runs the
        engine.
        """
        if self.limit is None or self.spill != "host" or nbytes > self.limit or getattr(_moving, "now", False):
            return 0  # an allocation past the limit never fits; a move's own allocations do not ask again
        freed, result = 0, None
        with self._demand_lock:  # one thread moves at a time: each counts its own moves against the room left
            if self._no_demand:
                return 0
            try:
                while freed < nbytes and (fits := self._movable(self._results(), set(range(self.ranks)), {})[1]):
                    before = on_engine(result := fits[0])
                    if self._move_out(result, running, frame_route=False):
                        with self._lock:
                            self.spills["on_demand"] += 1
                        freed += before
            except Exception as exc:  # a failed pack takes nothing from the engine: the result stays readable
                self._no_demand = True
                logger.warning("cudf-polars could not move held result %r to host memory for a running query, "
                               "which may run out of device memory (host_spill_limit=%s bytes): %s",
                               getattr(result, "name", None), f"{self.host_limit:,}", error_text(exc))
        return freed

    def _refusal(self, others: list[GPUResult], over: tuple[int, int, int], results: list[GPUResult], *,
                 host_full: bool) -> str:
        rank, held, budget = over
        on_rank = [(r, by_rank[rank]) for r in others if len(by_rank := held_by_rank(r)) > rank and by_rank[rank]]
        named = ", ".join(f"{r.name!r} ({size:,} bytes, from {r.produced_by})" for r, size in on_rank[:20])
        limit = f"{self.limit:,} bytes" + (f" on each of {self.ranks} ranks" if self.ranks > 1 else "")
        template = SPILL_OFF_MESSAGE if self.spill != "host" else HOST_LIMIT_MESSAGE if host_full else HOST_FULL_MESSAGE
        return template.format(limit=limit, held=held, on_rank=f" on rank {rank}" if self.ranks > 1 else "", budget=budget,
                               named=named + (" ..." if len(on_rank) > 20 else ""), host_limit=self.host_limit,
                               host_held=host_held(results))

    def read_back(self, frames: Sequence[GPUResult]) -> None:
        """After an engine call that ended without an error: its query read back the host ``frames``
        (:meth:`make_room`'s; their seconds are in its engine seconds)."""
        for result in frames:
            self._count(result, "back", None, HOST_FRAME)

    def _move_out(self, result: GPUResult, running: RunningEngine, *, frame_route: bool = True) -> bool:
        """Move ``result`` to host memory; whether this call moved it (not when it was moved or claimed meanwhile).
        With ``frame_route`` (off a running query's demand: the host frame route runs the engine), a result the
        pinned pool has no free block for (near ``host_spill_limit``, its blocks' free tails too small) moves by
        the host frame route. A failure releases it only where its rows may have left the engine (a host frame's
        read)."""
        taken = False

        def out(persisted: PersistedResult) -> PersistedResult | None:  # under the result's lock: no claim meanwhile
            nonlocal taken
            if persisted.moved_out:
                return None
            # Packed into pinned memory in place (the handle's frames stay valid); a failure takes nothing.
            with contextlib.suppress(MemoryError) if frame_route else contextlib.nullcontext():
                if running.move_out(persisted, self.host_limit):
                    return persisted
            taken = True  # the read takes the partitions out of the store
            try:
                frame = running.collect(persisted.lazy(), pl.QueryOptFlags())
            except Exception as exc:
                raise_engine_error(exc)
            persisted.release()  # what the read left
            return HostCopy(frame, persisted.ranks)

        started, _moving.now = time.perf_counter(), True
        try:
            moved = result.move(out)
        except BaseException:  # the move failed or was interrupted
            if taken:  # the rows may have left the engine unkept: a reader is told it was released, not a
                result.release()  # misleading second-read error
            raise
        finally:
            _moving.now = False
        if moved is not None:
            self._count(result, "out", time.perf_counter() - started, HOST_FRAME if isinstance(moved, HostCopy) else PINNED)
        return moved is not None

    def _count(self, result: GPUResult, way: str, seconds: float | None, route: str) -> None:
        out = way == "out"
        with self._lock:
            self.spills["results" if out else "back"] += 1
            self.spills["bytes" if out else "back_bytes"] += result.bytes or 0
            self.spills["out_seconds" if out else "back_seconds"] += seconds or 0.0
            if out:  # the routes of the moves out
                self.spills["routes"][route] = self.spills["routes"].get(route, 0) + 1
        if (moved := self._moved.get(result)) is not None:
            moved(result, way, seconds, route)

    def summary(self) -> dict[str, Any]:
        """``limit`` (bytes per rank), ``ranks``, ``peak_held`` (bytes on one rank), ``spill_results``, ``spills``
        and ``host_limit`` (``host_spill_limit`` in bytes)."""
        with self._lock:
            return {"limit": self.limit, "ranks": self.ranks, "peak_held": self.peak_held, "spill_results": self.spill,
                    "spills": {**self.spills, "routes": dict(self.spills["routes"])}, "host_limit": self.host_limit}
