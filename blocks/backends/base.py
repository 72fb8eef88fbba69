"""
What every backend hands the engine host: a running engine and its persisted results.

A backend module (``cpu``, ``streaming`` for ``spmd``, ``dask/``, ``ray/``) has
one function, ``start(block, stack) -> RunningEngine``, that turns the block's
fields into a running engine and enters everything it creates (the engine, a
cluster, a lease, a Ray head) into ``stack``, a :class:`contextlib.ExitStack`
the host closes on its owner thread when the session ends, the way
cudf-polars' ``StreamingEngine`` closes its own ``exit_stack``. Every method
below runs on that owner thread (but :meth:`RunningEngine.move_out`, which a
running query's room on demand also calls): rapidsmpf requires an engine to
be created, used and shut down on one thread. Everything a backend knows about
cudf-polars' internals stays behind :mod:`~prefect_cudf_polars.blocks.backends.compat`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import polars as pl


class PersistedResult(Protocol):
    """
    The partitions of one query, kept where the engine ran it.

    cudf-polars' ``PersistedQueryResult`` behind an adapter, or the ``cpu``
    backend's host counterpart.

    Attributes
    ----------
    schema : polars.Schema
        Column names and dtypes of the result.
    ranks : list of int
        Ranks holding a partition.
    """

    schema: pl.Schema
    ranks: list[int]

    @property
    def moved_out(self) -> bool:
        """Whether its partitions are in host memory now (moved out of the engine, not yet back)."""

    @property
    def frame_source(self) -> object | None:
        """What a frame from :meth:`lazy` (and every query built on it) keeps alive, weakly referenceable: while it
        lives, such a frame may still be read; ``None`` when the frame keeps nothing of this result's."""

    def lazy(self) -> pl.LazyFrame:
        """A LazyFrame whose scan moves the partitions out of the engine's store."""

    def release(self) -> None:
        """Free the partitions now (idempotent, never raises); on the engine's thread while it runs."""

    def forget(self) -> None:
        """Let go without calling the engine: its shutdown closed every store (idempotent)."""


class Reading(NamedTuple):
    """
    What the engine holds right after a call, read on its owner thread.

    Attributes
    ----------
    memory : int or None
        Bytes allocated now, summed over ranks (rmm statistics on GPU
        backends, the host store on ``cpu``); ``None`` where unreadable.
    rows : int or None
        Rows of the persisted result just produced (``None`` for none).
    bytes : int or None
        Its bytes, summed over its partitions.
    per_rank : tuple of (int or None)
        ``memory`` of each rank, in rank order.
    bytes_per_rank : tuple of int
        The persisted result's bytes on each rank, in rank order (empty for none).
    """

    memory: int | None
    rows: int | None = None
    bytes: int | None = None
    per_rank: tuple[int | None, ...] = ()
    bytes_per_rank: tuple[int, ...] = ()


class RunningEngine(abc.ABC):
    """A started engine of one backend, as the session drives it through the engine host."""

    #: Resolved backend name: ``"spmd"``, ``"dask"``, ``"ray"`` or ``"cpu"``.
    backend: str
    #: The backend's engine object (a cudf-polars ``StreamingEngine``, or the ``cpu`` engine).
    engine: Any
    #: ``device_memory_limit`` in bytes, which the engine is held to (``None``: the whole device).
    memory_limit: int | None = None
    #: What the engine asks for room when a query's allocation would pass :attr:`memory_limit`, on the thread that
    #: allocates: ``room_wanted(nbytes, running)``, the bytes it freed (``None``: nothing to ask).
    room_wanted: Callable[[int, RunningEngine], int] | None = None

    def ask_room(self, nbytes: int) -> int:
        """The bytes :attr:`room_wanted` freed for ``nbytes`` more bytes (on any thread; 0 without it)."""
        return 0 if self.room_wanted is None else self.room_wanted(nbytes, self)

    @abc.abstractmethod
    def execute(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> PersistedResult:
        """Run ``lf`` with ``flags``; the result stays where the engine keeps it."""

    @abc.abstractmethod
    def collect(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> pl.DataFrame:
        """Run ``lf`` with ``flags`` and return the result on the host."""

    @abc.abstractmethod
    def read(self, persisted: PersistedResult | None = None) -> Reading:
        """Memory in use now and, given a result, its rows and bytes (one call to the ranks)."""

    def move_out(self, persisted: PersistedResult, pool_bytes: int) -> bool:
        """
        Move ``persisted``'s partitions into pinned host memory in place (on the owner thread, or on the thread of a
        running query that asked for room, :attr:`room_wanted`): its ``lazy()`` frames
        stay valid once :meth:`move_back` has run. False where this backend cannot (nothing moved). ``pool_bytes``:
        the most the engine's pinned pool, made at its first move, may grow to.

        Raises
        ------
        MemoryError
            The pinned pool cannot hold it (nothing moved).
        """
        return False

    def move_back(self, persisted: PersistedResult) -> None:
        """Put what :meth:`move_out` moved back into the engine's store, where its frames read it."""
        raise NotImplementedError(f"the {self.backend} backend moves no result into pinned host memory")

    def copy(self, persisted: PersistedResult) -> PersistedResult | None:
        """A new persisted result holding device copies of ``persisted``'s partitions (on the owner thread, which it
        leaves as it was); ``None`` where this backend cannot copy them."""
        return None

    def check_plan(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags | None = None) -> None:
        """
        Refuse ``lf`` before it runs, as far as this engine can tell without running it.

        For a deferred step, whose plan runs later fused into its reader's
        engine call. Only the ``cpu`` backend checks (as cudf-polars would,
        with ``flags``, default: :func:`~prefect_cudf_polars.blocks.backends.plans.prepare`'s);
        on the GPU backends the reader's engine call checks the fused plan.

        Raises
        ------
        NotImplementedError
            What the engine would refuse; nothing has run.
        """

    def set_rank_environment(self, env: Mapping[str, str | None]) -> None:
        """Set (``None``: unset) environment variables on every rank in another process (default: none)."""

    def restore_rank_environment(self) -> None:
        """Put back, on every rank in another process, what the last :meth:`set_rank_environment` replaced."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Backend, GPUs (names), ranks and versions, for logs and artifacts."""
