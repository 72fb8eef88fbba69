"""
What every backend hands the engine session: a running engine and its persisted results.

A backend module (``spmd``, ``dask``, ``ray``, ``cpu``) has one function,
``start(block) -> RunningEngine``, that turns the block's fields into a running
engine. The session calls ``start`` and every method below on its owner thread
only: rapidsmpf requires an engine to be created, used and shut down on one
thread. Everything a backend knows about cudf-polars' internals stays inside
its own module; the session and the results see only these two interfaces.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, Protocol

import polars as pl

from prefect_cudf_polars.blocks.backends.result_scans import prepare


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

    def lazy(self) -> pl.LazyFrame:
        """A LazyFrame whose scan moves the partitions out of the engine's store."""
        ...

    def release(self) -> None:
        """Free the partitions now (idempotent, never raises)."""
        ...


class RunningEngine(abc.ABC):
    """A started engine of one backend, as the session drives it."""

    #: Resolved backend name: ``"spmd"``, ``"dask"``, ``"ray"`` or ``"cpu"``.
    backend: str
    #: The backend's engine object (a cudf-polars ``StreamingEngine``, or the ``cpu``
    #: backend's engine), for code that measures the bare engine next to the session.
    engine: Any

    @abc.abstractmethod
    def execute(self, lf: pl.LazyFrame) -> PersistedResult:
        """Run ``lf`` and return its persisted result (the data stays where the engine keeps it)."""

    @abc.abstractmethod
    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        """Run ``lf`` and return the result on the host."""

    @abc.abstractmethod
    def memory_in_use(self) -> int | None:
        """
        Bytes the engine's allocator holds now, summed over ranks.

        GPU backends read rmm statistics (the memory rmm tracks as allocated,
        not the pool's size, which ``nvidia-smi`` shows); the ``cpu`` backend
        reports its host store. ``None`` when the figure cannot be read.
        """

    def check_plan(self, lf: pl.LazyFrame) -> None:
        """
        Refuse ``lf`` before it runs, as far as this engine can tell without running it.

        For a deferred step: its plan runs later, fused into its reader's
        engine call. The default refuses what
        :func:`~prefect_cudf_polars.blocks.backends.result_scans.prepare`
        refuses (a zero-column read of a result's frame); the ``cpu`` backend
        also runs its GPU-support check.

        Raises
        ------
        NotImplementedError
            What the engine would refuse; nothing has run.
        """
        prepare(lf)

    def memory_per_rank(self) -> list[int | None] | None:
        """Bytes allocated on each rank, in rank order; ``None`` where ranks are not read apart."""
        return None

    def set_rank_environment(self, env: Mapping[str, str | None]) -> None:
        """
        Set (``None``: unset) environment variables on every rank in another process.

        Ranks that run in this process (``spmd``, ``cpu``) share its environment,
        so the default does nothing.
        """

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Backend, GPUs (names), ranks and versions, for logs and artifacts."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Shut the engine down and free what it holds (idempotent)."""
