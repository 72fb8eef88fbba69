"""
What every backend module (``spmd``, ``dask``, ``ray``, ``cpu``) hands the session.

A backend module has one function, ``start(block) -> RunningEngine``, that turns
the block's fields into a running engine. The session calls ``start`` and every
method below on its owner thread only (rapidsmpf requires the engine to be
created, used and shut down on one thread).
"""

from __future__ import annotations

import abc
from typing import Any

import polars as pl


class RunningEngine(abc.ABC):
    """A started engine of one backend, as the session drives it."""

    #: Resolved backend name: ``"spmd"``, ``"dask"``, ``"ray"`` or ``"cpu"``.
    backend: str
    #: The engine object (cudf-polars ``StreamingEngine`` or the CPU engine).
    engine: Any

    @abc.abstractmethod
    def execute(self, lf: pl.LazyFrame) -> Any:
        """Run ``lf`` and return the engine's persisted result (data stays put)."""

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

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Backend, GPUs (names), ranks and versions, for logs and artifacts."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Shut the engine down and free what it holds (idempotent)."""
