"""
The adapter over cudf-polars' streaming engines (``SPMDEngine``, ``DaskEngine``, ``RayEngine``).

The three GPU backends build their engine in their own module and hand it
here. Every use of a cudf-polars internal shared by the three sits in this
module, each with the cudf-polars version it was checked against:

* ``StreamingEngine._run(fn, *args)`` runs a module-level function on every
  rank and gathers the results in rank order (cudf-polars 26.10). It reads
  device memory and GPU names on the ranks and sets environment variables on
  ranks in other processes.
* ``PersistedQueryResult._schema`` and ``._ranks`` hold a result's output
  schema and producing ranks (cudf-polars 26.10 has no public accessor).
* ``engine.execute(lf)`` takes no polars optimization flags in cudf-polars
  26.10 (it translates ``lf._ldf.visit()``, which plans with the flags stored
  in the frame), so :func:`with_optimizations` stores them in the frame with
  polars 1.44's private ``LazyFrame._ldf.with_optimizations``. ``collect``
  takes polars' public ``optimizations`` argument.

Every plan is prepared first
(:func:`~prefect_cudf_polars.blocks.backends.result_scans.prepare`): a plan
that reads a result's frame runs without slice pushdown, and a zero-column read
of one is refused before the engine runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from prefect_cudf_polars.blocks.backends.base import RunningEngine
from prefect_cudf_polars.blocks.backends.device_memory import rank_allocated_bytes, rank_device_name
from prefect_cudf_polars.blocks.backends.environment import apply_environment_on_rank
from prefect_cudf_polars.blocks.backends.result_scans import prepare


def with_optimizations(lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> pl.LazyFrame:
    """
    ``lf`` planned with ``flags``, for an engine call that takes no optimization flags.

    Checked against polars 1.44 and cudf-polars 26.10: ``execute_persisted_query``
    translates ``lf._ldf.visit()``, which optimizes with the flags the frame
    carries; ``LazyFrame._ldf.with_optimizations`` (private) sets them, as
    polars' own ``collect`` does.
    """
    return pl.LazyFrame._from_pyldf(lf._ldf.with_optimizations(flags._pyoptflags))


def rapids_versions() -> dict[str, str]:
    """Versions of polars and the RAPIDS packages in use."""
    from importlib.metadata import PackageNotFoundError, version

    import cudf_polars

    versions = {"polars": pl.__version__, "cudf-polars": cudf_polars.__version__}
    for dist in ("rmm-cu13", "rmm-cu12", "rapidsmpf-cu13", "rapidsmpf-cu12", "dask-cuda"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return versions


class StreamingPersistedResult:
    """
    cudf-polars' ``PersistedQueryResult`` as the session sees it.

    Parameters
    ----------
    query_result : cudf_polars.engine.persisted_result.PersistedQueryResult
        What ``engine.execute(lf)`` returned.

    Attributes
    ----------
    query_result : PersistedQueryResult
        The cudf-polars result itself (its finalizer frees the partitions when
        it is garbage-collected).
    schema : polars.Schema
    ranks : list of int
    """

    __slots__ = ("query_result", "ranks", "schema")

    def __init__(self, query_result: Any) -> None:
        self.query_result = query_result
        # cudf-polars 26.10: the schema and ranks are only held privately.
        self.schema = pl.Schema(query_result._schema)
        self.ranks = list(query_result._ranks)

    def lazy(self) -> pl.LazyFrame:
        return self.query_result.lazy()

    def release(self) -> None:
        # cudf-polars 26.10: idempotent, never raises (weakref.finalize).
        self.query_result.release()


class StreamingRunningEngine(RunningEngine):
    """
    A started cudf-polars streaming engine.

    Parameters
    ----------
    backend
        ``"spmd"``, ``"dask"`` or ``"ray"``.
    engine
        The cudf-polars engine, created on the session's owner thread.
    on_shutdown
        Called after ``engine.shutdown()`` (for example to close a cluster the
        backend started); ``None`` for nothing.
    """

    def __init__(self, backend: str, engine: Any, on_shutdown: Any = None) -> None:
        self.backend = backend
        self.engine = engine
        self._on_shutdown = on_shutdown
        self._stopped = False
        #: Backend-specific facts for logs and artifacts (e.g. the Dask dashboard link).
        self.extra_description: dict[str, Any] = {}

    def execute(self, lf: pl.LazyFrame) -> StreamingPersistedResult:
        flags = prepare(lf)
        if not flags.slice_pushdown:  # a plan that reads a result's frame: carry the flags in
            lf = with_optimizations(lf, flags)
        return StreamingPersistedResult(self.engine.execute(lf))

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        return lf.collect(engine=self.engine, optimizations=prepare(lf))

    def memory_in_use(self) -> int | None:
        if self.backend == "spmd":
            # One rank in this process: read it directly, no collective per engine call.
            return rank_allocated_bytes()
        values = self.memory_per_rank()
        if any(v is None for v in values):
            return None
        return sum(v for v in values if v is not None)

    def memory_per_rank(self) -> list[int | None]:
        if self.backend == "spmd":
            return [rank_allocated_bytes()]
        return list(self.engine._run(rank_allocated_bytes))  # cudf-polars 26.10: one call per rank

    def set_rank_environment(self, env: Mapping[str, str | None]) -> None:
        if self.backend != "spmd":  # spmd's one rank is this process
            self.engine._run(apply_environment_on_rank, dict(env))  # cudf-polars 26.10

    def describe(self) -> dict[str, Any]:
        gpus = list(self.engine._run(rank_device_name))  # cudf-polars 26.10
        return {
            "backend": self.backend,
            "gpus": gpus,
            "ranks": self.engine.nranks,
            "versions": rapids_versions(),
            "note": f"cudf-polars {type(self.engine).__name__}, results stay in GPU memory",
            **self.extra_description,
        }

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        engine, on_shutdown = self.engine, self._on_shutdown
        # A shut-down adapter holds nothing of the engine (its memory resource
        # included), even where something still holds the adapter.
        self.engine = self._on_shutdown = None
        try:
            engine.shutdown()
        finally:
            if on_shutdown is not None:
                on_shutdown()
