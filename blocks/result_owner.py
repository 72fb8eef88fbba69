"""
What a :class:`~prefect_cudf_polars.blocks.GPUResult` asks of the session that produced it, and what it keeps of one that ended.

A result never looks up the active session itself: it asks its own session
(:class:`ResultOwner`, which :class:`~prefect_cudf_polars.blocks.EngineSession`
provides) which session would read it here, tells it of a claim or a release,
and hands it partitions to free on the engine's owner thread. When the session
ends, every result points at an :class:`EndedSession` instead, which holds no
engine. Each ``result`` below is the ``GPUResult`` asking.
"""

from __future__ import annotations

from typing import Any, Protocol

from prefect_cudf_polars.blocks.backends.base import PersistedResult


class ResultOwner(Protocol):
    """What a :class:`GPUResult` asks of the session that produced it (:class:`~prefect_cudf_polars.blocks.EngineSession`)."""

    id: str
    backend: str | None

    @property
    def closed(self) -> bool:
        """Whether the session has ended."""

    @property
    def served_run(self) -> str | None:
        """``"flow run 'name'"`` or ``"subflow run 'name'"``, once known."""

    @property
    def subflow(self) -> bool:
        """Whether the run it serves is a subflow run."""

    def reader_here(self) -> ResultOwner | None:
        """The session that would read a result here (the one active in this context), if any."""

    def claimed(self, result: Any) -> None:
        """``result`` was claimed by its reader."""

    def released(self, result: Any) -> None:
        """``result`` was released before anyone read it."""

    def free(self, persisted: PersistedResult) -> None:
        """Free ``persisted`` on the engine's owner thread while the engine runs, else let it go."""


class EndedSession:
    """What a result keeps of its session once that session has ended (a :class:`ResultOwner` holding no engine)."""

    __slots__ = ("backend", "id", "served_run", "subflow")

    closed = True

    def __init__(self, id: str, backend: str | None, served_run: str | None, subflow: bool) -> None:
        self.id, self.backend, self.served_run, self.subflow = id, backend, served_run, subflow

    def reader_here(self) -> None:
        """No reader: the session has ended (the result is released)."""

    def claimed(self, result: Any) -> None:
        """Nothing to record: the session has ended."""

    def released(self, result: Any) -> None:
        """Nothing to record: the session has ended."""

    def free(self, persisted: PersistedResult) -> None:
        """The engine's stores are closed: let go without calling it."""
        persisted.forget()
