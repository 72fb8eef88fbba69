"""
A running cudf-polars streaming engine (``SPMDEngine``, ``DaskEngine``, ``RayEngine``).

Shared by the GPU backend modules: each builds its engine and hands it here.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from prefect_cudf_polars.blocks.backend import RunningEngine
from prefect_cudf_polars.blocks.device_memory import rank_allocated_bytes, rank_device_name


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

    def execute(self, lf: pl.LazyFrame) -> Any:
        return self.engine.execute(lf)

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        return lf.collect(engine=self.engine)

    def memory_in_use(self) -> int | None:
        if self.backend == "spmd":
            # One rank in this process: read it directly, no collective per engine call.
            return rank_allocated_bytes()
        values = self.engine._run(rank_allocated_bytes)
        if any(v is None for v in values):
            return None
        return sum(values)

    def memory_per_rank(self) -> list[int | None]:
        """Bytes rmm has allocated on each rank, in rank order."""
        return list(self.engine._run(rank_allocated_bytes))

    def describe(self) -> dict[str, Any]:
        gpus = list(self.engine._run(rank_device_name))
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
        try:
            self.engine.shutdown()
        finally:
            if self._on_shutdown is not None:
                self._on_shutdown()
