"""
The variants without Prefect: bare cudf-polars (chained, fused, host round trips) and polars on the CPU.

(b) ``chained``: each step's query runs with ``engine.execute()``; the next step
    reads the persisted result with ``.lazy()``; the last step is collected.
(c) ``fused``: all steps folded into one query, collected once.
(d) ``round-trips``: each step is collected to a host ``polars.DataFrame`` and
    the next step starts from ``df.lazy()``, which copies it back to the GPU.
(e) ``cpu``: the fused query on polars' CPU engine (in-memory engine).

The bare engine is the backend's engine object used directly: the one the flow
run's engine session started with the block's fields, called on the thread that
created it (:mod:`benchmarks.engine_thread`), with no code of the session on
the path.
"""

from __future__ import annotations

import time
from typing import Any

import polars as pl

from benchmarks.pipelines import Paths, Pipeline, Step
from benchmarks.timing import RunOutcome


class BareEngine:
    """
    A backend's engine without the session: ``execute`` and ``collect`` on the engine itself.

    Call it only on the thread that created the engine.

    Parameters
    ----------
    running
        The backend's running engine (``EngineSession.running_engine``); its
        ``engine`` attribute is the cudf-polars engine (or the ``cpu``
        backend's).
    """

    def __init__(self, running: Any) -> None:
        self.backend: str = running.backend
        self.engine: Any = running.engine

    def execute(self, lf: pl.LazyFrame) -> Any:
        """``engine.execute(lf)``: a persisted result that stays in the engine."""
        return self.engine.execute(lf)

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        """``lf.collect(engine=engine)`` (``lf.collect()`` on the cpu backend)."""
        if self.backend == "cpu":
            return self.engine.collect(lf)
        return lf.collect(engine=self.engine)


def bare_step(engine: BareEngine, step: Step, previous: Any, paths: Paths, *, last: bool) -> Any:
    """
    One step on the bare engine: build its query on ``previous.lazy()``, run it.

    The last step is collected to the host; the others return the persisted
    result. ``previous``, already read, is released (which frees anything its
    scan left).
    """
    lf = step.build(previous.lazy() if previous is not None else None, paths)
    value = engine.collect(lf) if last else engine.execute(lf)
    if previous is not None:
        previous.release()
    return value


def chained(engine: BareEngine, pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(b) One ``engine.execute()`` per step, chained with ``result.lazy()``."""
    steps_s: dict[str, float] = {}
    started = time.perf_counter()
    value = None
    last = len(pipeline.steps) - 1
    for i, step in enumerate(pipeline.steps):
        t = time.perf_counter()
        value = bare_step(engine, step, value, paths, last=i == last)
        steps_s[step.name] = time.perf_counter() - t
    return RunOutcome(time.perf_counter() - started, value, steps_s)


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
