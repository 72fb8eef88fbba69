"""
Held memory: the budget a session keeps its held results under, and results moved to host memory.

With the block's ``device_memory_limit`` the engine's memory resource is
capped (on ``cpu``, the host store counts the same way). A result's partitions
stay in the engine's memory between tasks, and cudf-polars 26.10 keeps them in
its rank-local store, outside rapidsmpf's spill manager: what a flow run holds
never spills by itself. A new result's size is known only once it exists, so
before each engine call the session keeps the results the call does not read
within the *held budget*::

    held budget = limit - max(20 % of the limit, the largest partition held)

which leaves the query at least a fifth of the limit, and room for the largest
partition it may read (one in host memory included), as working memory. The
results the call reads are its working memory, not held. When the others hold
more than the budget:

* ``spill_results="off"``: the call fails with
  :class:`~prefect_cudf_polars.blocks.DeviceMemoryError` naming them and their
  bytes; nothing has run, and every result the task did not read stays readable.
* ``spill_results="host"``: the least recently produced unread results move to
  host memory (:class:`HostCopy`: the engine collects each to a host
  ``polars.DataFrame``) until the rest fit. A moved result keeps every rule of
  a result (read once, bound to its session, never persisted by a serializer);
  after each engine call as well, so the room stays free between tasks. Its
  claim puts it back on the engine (the engine executes the host frame) before
  the reading query is built, room made for it first the same way (which may
  move another result out, even one the same query reads next).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl

from prefect_cudf_polars.blocks.backends.engine_errors import raise_engine_error
from prefect_cudf_polars.blocks.errors import DeviceMemoryError

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.backends.base import PersistedResult
    from prefect_cudf_polars.blocks.results import GPUResult

#: The share of the limit a query keeps as working room at least.
WORKING_SHARE = 0.2

SPILL_OFF_MESSAGE = (
    "This engine call cannot start within device_memory_limit={limit:,} bytes: the results it does not read hold "
    "{held:,} bytes, over the held budget of {budget:,} bytes (the limit less the larger of 20 % of it and the "
    "largest partition held, the query's working room). Held: {named}. Nothing has run and those results stay "
    "readable. On the CudfPolarsEngine block set spill_results=\"host\" (unread results move to host memory until "
    "the call fits) or raise device_memory_limit; or read or release (`result.release()`) results sooner."
)


def held_budget(limit: int, largest_partition: int) -> int:
    """Bytes the results a call does not read may hold on the engine: ``limit - max(20 % of limit, largest_partition)``."""
    return limit - max(int(limit * WORKING_SHARE), largest_partition)


def on_engine(result: GPUResult) -> int:
    """Bytes ``result`` holds in the engine's memory now (0 once read or released, or while in host memory)."""
    persisted = result.persisted
    if persisted is None or (isinstance(persisted, HostCopy) and not persisted.back):
        return 0
    return result.bytes or 0


def read_by(claimed: Iterable[GPUResult]) -> set[str]:
    """The ids of the results a call reads: those it claimed and, for deferred ones, the inputs their plans hold."""
    ids: set[str] = set()
    stack = list(claimed)
    while stack:
        result = stack.pop()
        if result.id not in ids:
            ids.add(result.id)
            stack.extend(result.held_inputs)
    return ids


class HostCopy:
    """
    A result moved to host memory (a ``PersistedResult``): its rows as a host ``polars.DataFrame``.

    :meth:`lazy` first puts the rows back on the engine through ``restore``
    (once), then reads them there as any result's frame does.

    Parameters
    ----------
    frame : polars.DataFrame
        The result's rows, collected from the engine.
    ranks : list of int
        The ranks that held it.
    restore : callable
        Takes the frame and returns the ``PersistedResult`` the engine made of it.
    seconds : float
        Seconds the move to host memory took.

    Attributes
    ----------
    out_seconds : float
        Seconds the move to host memory took.
    back : PersistedResult or None
        What the engine holds once the result is back.
    """

    __slots__ = ("_frame", "_lock", "_restore", "back", "out_seconds", "ranks", "schema")

    def __init__(self, frame: pl.DataFrame, ranks: Sequence[int], restore: Callable[[pl.DataFrame], PersistedResult],
                 seconds: float) -> None:
        self._frame: pl.DataFrame | None = frame
        self.schema, self.ranks = frame.schema, list(ranks)
        self._restore, self.out_seconds = restore, seconds
        self.back: PersistedResult | None = None
        self._lock = threading.Lock()

    def lazy(self) -> pl.LazyFrame:
        """Put the rows back on the engine (once) and return the frame that reads them there."""
        with self._lock:
            if self.back is None:
                if self._frame is None:
                    raise RuntimeError("This result's host copy was released; run the task that produced it again.")
                self.back, self._frame = self._restore(self._frame), None
            return self.back.lazy()

    def release(self) -> None:
        """Drop the host rows, or free what the engine holds once back (idempotent)."""
        self._frame = None
        if self.back is not None:
            self.back.release()

    def forget(self) -> None:
        """Drop the host rows; let go of what the engine held without calling it (its shutdown closed the store)."""
        self._frame = None
        if self.back is not None:
            self.back.forget()


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

    Parameters
    ----------
    spill : {"off", "host"}
        The block's ``spill_results``.
    session : EngineAccess
        The session whose results it keeps within the budget.
    moved : callable
        ``moved(result, way, seconds)`` tells Prefect of a move (``way``: ``"out"`` to host memory, ``"back"``).

    Attributes
    ----------
    limit : int or None
        ``device_memory_limit`` in bytes, once the engine has started (``None``: no limit).
    peak_held : int
        Most bytes the session's results held on the engine after any engine call.
    spills : dict
        ``results`` and ``bytes`` moved to host memory and ``out_seconds``; ``back`` (results read back) and
        ``back_seconds``.
    """

    def __init__(self, spill: str, session: EngineAccess, moved: Callable[[GPUResult, str, float], None]) -> None:
        self.spill, self.limit, self.peak_held = spill, None, 0
        self.spills: dict[str, Any] = {"results": 0, "bytes": 0, "out_seconds": 0.0, "back": 0, "back_seconds": 0.0}
        self._session, self._moved = session, moved
        self._lock = threading.Lock()

    def note_held(self) -> None:
        """After an engine call: with ``spill="host"``, move results until the held fit the budget; keep the peak."""
        if self.limit is None:
            return
        if self.spill == "host":
            self.make_room((), refuse=False)
        total = sum(map(on_engine, self._session.held_results()[0]))
        with self._lock:
            self.peak_held = max(self.peak_held, total)

    def make_room(self, claimed: Iterable[GPUResult], *, refuse: bool = True) -> None:
        """
        Before an engine call that reads the results ``claimed`` (and what they hold): keep the others within budget.

        ``refuse=False`` (after a call) moves what it can and raises nothing when that is not enough.

        Raises
        ------
        DeviceMemoryError
            The others hold more than the held budget and ``spill`` is ``"off"``
            (or moving every unread one would not do); nothing has run.
        SessionError
            The session ended while a result moved.
        """
        if self.limit is None:
            return
        read, (held, live) = read_by(claimed), self._session.held_results()
        largest = max(((r.bytes or 0) // max(r.partitions, 1) for r in held if r.persisted is not None), default=0)
        budget = held_budget(self.limit, largest)
        others = [r for r in held if r.id not in read and on_engine(r)]
        total, moving = sum(map(on_engine, others)), []
        for result in live if self.spill == "host" else ():
            if total <= budget:
                break
            if result.id not in read and not result.deferred and on_engine(result):
                moving.append(result)
                total -= on_engine(result)
        if total > budget and refuse:
            order = {r.id: i for i, r in enumerate(live)}  # unread ones in the order produced, then those being read
            kept = sorted((r for r in others if r not in moving), key=lambda r: order.get(r.id, len(order)))
            named = ", ".join(f"{r.name!r} ({on_engine(r):,} bytes, from {r.produced_by})" for r in kept[:20])
            raise DeviceMemoryError(SPILL_OFF_MESSAGE.format(limit=self.limit, held=total, budget=budget,
                                                             named=named + (" ..." if len(kept) > 20 else "")))
        for result in moving:
            self._move_out(result)

    def _move_out(self, result: GPUResult) -> None:
        def out(persisted: PersistedResult) -> HostCopy:  # under the result's lock: no claim meanwhile
            started = time.perf_counter()
            running = self._session.running_engine
            try:
                frame = self._session.run(lambda: running.collect(persisted.lazy(), pl.QueryOptFlags()))
            except Exception as exc:
                raise_engine_error(exc)
            self._session.free(persisted)  # what the read left
            return HostCopy(frame, persisted.ranks, partial(self._put_back, result), time.perf_counter() - started)

        if (copy := result.move(out)) is not None:
            self._count(result, "out", copy.out_seconds)  # type: ignore[attr-defined]

    def _put_back(self, result: GPUResult, frame: pl.DataFrame) -> PersistedResult:
        """A claimed result in host memory goes back to the engine, room made for it first."""
        self.make_room((result,))
        running, started = self._session.running_engine, time.perf_counter()
        try:
            back = self._session.run(lambda: running.execute(frame.lazy(), pl.QueryOptFlags()))
        except Exception as exc:
            raise_engine_error(exc)
        self._count(result, "back", time.perf_counter() - started)
        return back

    def _count(self, result: GPUResult, way: str, seconds: float) -> None:
        with self._lock:
            self.spills["results" if way == "out" else "back"] += 1
            self.spills["bytes"] += (result.bytes or 0) if way == "out" else 0
            self.spills[f"{way}_seconds"] += seconds
        self._moved(result, way, seconds)

    def summary(self) -> dict[str, Any]:
        """``limit`` and ``peak_held`` (bytes), ``spill_results`` and ``spills``."""
        with self._lock:
            return {"limit": self.limit, "peak_held": self.peak_held, "spill_results": self.spill,
                    "spills": dict(self.spills)}
