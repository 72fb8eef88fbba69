"""
The variants without Prefect: bare cudf-polars (chained, fused, host round trips) and polars on the CPU.

(b) ``chained``: each step's query runs with ``engine.execute()``; the next step
    reads the persisted result with ``.lazy()``; the last step is collected.
(c) ``fused``: all steps folded into one query, collected once.
(d) ``round-trips``: each step is collected to a host ``polars.DataFrame`` and
    the next step starts from ``df.lazy()``, which copies it back to the GPU.
(e) ``cpu``: the fused query on polars' CPU engine (in-memory engine).

The bare engine is the backend's engine object used directly, made from the same
block fields as the Prefect variant's, created and shut down on the calling thread.
"""

from __future__ import annotations

import time
from typing import Any

import polars as pl

from benchmarks.pipelines import Paths, Pipeline
from benchmarks.timing import RunOutcome
from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.blocks.backends.choice import start_backend


class BareEngine:
    """
    A backend's engine without the session: ``execute`` and ``collect`` on this thread.

    Parameters
    ----------
    backend
        Resolved backend: ``"spmd"``, ``"dask"``, ``"ray"`` or ``"cpu"``.
    block
        Engine options (the same block the Prefect variant uses).

    Raises
    ------
    ImportError, RuntimeError
        When the engine cannot start (cudf-polars' own errors).
    """

    def __init__(self, backend: str, block: CudfPolarsEngine) -> None:
        started = time.perf_counter()
        self.running = start_backend(backend, block)
        self.start_s = time.perf_counter() - started
        self.backend = backend
        self.engine: Any = self.running.engine

    def execute(self, lf: pl.LazyFrame) -> Any:
        """``engine.execute(lf)``: a persisted result that stays in the engine."""
        return self.engine.execute(lf)

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        """``lf.collect(engine=engine)`` (``lf.collect()`` on the cpu backend)."""
        if self.backend == "cpu":
            return self.engine.collect(lf)
        return lf.collect(engine=self.engine)

    def shutdown(self) -> None:
        """Shut the engine down (idempotent)."""
        self.running.shutdown()


def chained(engine: BareEngine, pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(b) One ``engine.execute()`` per step, chained with ``result.lazy()``."""
    steps_s: dict[str, float] = {}
    started = time.perf_counter()
    previous = None
    df = None
    last = len(pipeline.steps) - 1
    for i, step in enumerate(pipeline.steps):
        t = time.perf_counter()
        lf = step.build(previous.lazy() if previous is not None else None, paths)
        if i == last:
            df = engine.collect(lf)
        else:
            current = engine.execute(lf)
        if previous is not None:
            previous.release()  # already read; frees anything a scan left
        previous = None if i == last else current
        steps_s[step.name] = time.perf_counter() - t
    return RunOutcome(time.perf_counter() - started, df, steps_s)


def fused(engine: BareEngine, pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(c) The whole pipeline as one query."""
    started = time.perf_counter()
    df = engine.collect(pipeline.fused(paths))
    return RunOutcome(time.perf_counter() - started, df)


def round_trips(engine: BareEngine, pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(d) ``collect()`` each step to the host, ``.lazy()`` it into the next."""
    steps_s: dict[str, float] = {}
    started = time.perf_counter()
    df: pl.DataFrame | None = None
    for step in pipeline.steps:
        t = time.perf_counter()
        df = engine.collect(step.build(df.lazy() if df is not None else None, paths))
        steps_s[step.name] = time.perf_counter() - t
    return RunOutcome(time.perf_counter() - started, df, steps_s)


def cpu_polars(pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(e) The fused query on polars' CPU engine."""
    started = time.perf_counter()
    df = pipeline.fused(paths).collect()
    return RunOutcome(time.perf_counter() - started, df)
