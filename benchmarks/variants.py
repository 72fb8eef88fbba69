"""
The variants of a pipeline: what each one runs, and one timed run of it.

(a) ``a``: one ``gpu_task`` per step, ``GPUResult``s passed between them, the
    last one ``collect=True``; called in the flow body.
``a-deferred``: (a) with every step but the last ``gpu_task(defer=True)``, so
    the last task runs the whole pipeline in one engine call.
(h) ``h``, Prefect's floor: one plain ``@task(persist_result=False,
    cache_policy=NO_CACHE)`` per step making exactly (b)'s calls, on the
    engine's thread: no code of ours on the path.
(b) ``b``: bare cudf-polars, ``engine.execute(lf)`` per step, the next step
    reading ``result.lazy()``, the last one ``lf.collect(engine=engine)``.
(c) ``c``: bare cudf-polars, the steps folded into one query, one collect.
(d) ``d``: bare cudf-polars, each step collected to a host DataFrame and the
    next one started from ``df.lazy()``.
(e) ``e``: polars' CPU engine, the fused query.
(g) ``g``, the peer: one plain ``@task`` per step running
    ``lf.collect(engine="gpu")`` (plain ``collect()`` on the ``cpu`` backend),
    DataFrames passed between tasks, Prefect's task defaults (its default cache
    policy hashes the inputs); ``g-nocache`` the same with ``NO_CACHE``.

The bare engine is the engine the flow run's session started, used directly
on the session's owner thread (cudf-polars' ``SPMDEngine`` must be created,
used and shut down on one thread), handed over with the session's public
``EngineSession.run`` once per run, outside the timing.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import polars as pl
from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from benchmarks.pipelines import Paths, Pipeline, Step
from benchmarks.timing import RunOutcome

T = TypeVar("T")

#: Pipeline variants in the order a round runs them.
ROUND_ORDER = ("a", "a-deferred", "h", "b", "c", "d", "g", "g-nocache", "e")

#: Variants that need the flow run's engine session ((f) included).
SESSION_VARIANTS = frozenset({"a", "a-deferred", "b", "c", "d", "h", "f"})


class WrongThreadError(RuntimeError):
    """A bare engine call was about to run off the engine's owner thread."""


class BareEngine:
    """
    The session's engine without the session: its own ``execute`` and ``collect``, on its owner thread.

    Parameters
    ----------
    session
        An open :class:`~prefect_cudf_polars.blocks.EngineSession`.

    Attributes
    ----------
    backend : str
    engine
        cudf-polars' engine (the ``cpu`` backend's own engine on ``cpu``).
    thread : threading.Thread
        The owner thread, which created the engine.
    """

    def __init__(self, session: Any) -> None:
        running = session.running_engine
        self.session, self.backend, self.engine = session, running.backend, running.engine
        self.thread: threading.Thread = session.run(threading.current_thread)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the owner thread, in a copy of this context (Prefect's flow run context included)."""
        return self.session.run(contextvars.copy_context().run, fn, *args)

    def check(self, what: str) -> None:
        """Raise :class:`WrongThreadError`, naming ``what``, unless called on the owner thread."""
        if threading.current_thread() is not self.thread:
            raise WrongThreadError(f"{what} ran on {threading.current_thread().name!r}, not on the engine's thread")

    def execute(self, lf: pl.LazyFrame) -> Any:
        """``engine.execute(lf)``: a persisted result that stays in the engine."""
        return self.engine.execute(lf, pl.QueryOptFlags()) if self.backend == "cpu" else self.engine.execute(lf)

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        """``lf.collect(engine=engine)`` (the ``cpu`` engine's own collect)."""
        return self.engine.collect(lf, pl.QueryOptFlags()) if self.backend == "cpu" else lf.collect(engine=self.engine)


def bare_step(engine: BareEngine, step: Step, previous: Any, paths: Paths, *, last: bool) -> Any:
    """One step on the bare engine, built on ``previous.lazy()``; ``previous`` is released after the call."""
    lf = step.build(previous.lazy() if previous is not None else None, paths)
    value = engine.collect(lf) if last else engine.execute(lf)
    if previous is not None:
        previous.release()
    return value


def chain(pipeline: Pipeline, steps: Sequence[Callable[[Any], Any]]) -> RunOutcome:
    """One run: each step called with the previous step's value, each timed with ``time.perf_counter``."""
    steps_s: dict[str, float] = {}
    started = time.perf_counter()
    value: Any = None
    for step, call in zip(pipeline.steps, steps, strict=True):
        t = time.perf_counter()
        value = call(value)
        steps_s[step.name] = time.perf_counter() - t
    return RunOutcome(time.perf_counter() - started, value, steps_s)


def _named(fn: Callable[..., Any], step: Step) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = step.name.replace("-", "_")
    return fn


def gpu_steps(pipeline: Pipeline, paths: Paths, *, defer: bool) -> list[Task[..., Any]]:
    """(a) One ``gpu_task`` per step (task names ``<pipeline>.<step>``, ``deferred.`` first with ``defer``)."""
    from prefect_cudf_polars.tasks import gpu_task

    last = len(pipeline.steps) - 1

    def make(i: int, step: Step) -> Task[..., Any]:
        def run_step(previous: Any) -> pl.LazyFrame:
            return step.build(previous.lazy() if previous is not None else None, paths)

        name = f"{'deferred.' if defer else ''}{pipeline.name}.{step.name}"
        return gpu_task(name=name, collect=i == last, defer=defer and i != last)(_named(run_step, step))

    return [make(i, step) for i, step in enumerate(pipeline.steps)]


def floor_steps(pipeline: Pipeline, paths: Paths, engine: BareEngine) -> list[Task[..., Any]]:
    """(h) One plain Prefect task per step making (b)'s call; each checks that it runs on the engine's thread."""
    last = len(pipeline.steps) - 1

    def make(i: int, step: Step) -> Task[..., Any]:
        name = f"floor.{pipeline.name}.{step.name}"

        def floor_step(previous: Any) -> Any:
            engine.check(f"(h) task {name!r}")
            return bare_step(engine, step, previous, paths, last=i == last)

        return task(_named(floor_step, step), name=name, persist_result=False, cache_policy=NO_CACHE)

    return [make(i, step) for i, step in enumerate(pipeline.steps)]


def peer_steps(pipeline: Pipeline, paths: Paths, *, gpu: bool, default_cache: bool) -> list[Task[..., Any]]:
    """(g) One plain Prefect task per step collecting to a DataFrame (``peer.`` or ``peer-nocache.`` names)."""
    options: dict[str, Any] = {} if default_cache else {"cache_policy": NO_CACHE}

    def make(step: Step) -> Task[..., Any]:
        def peer_step(previous: pl.DataFrame | None) -> pl.DataFrame:
            lf = step.build(previous.lazy() if previous is not None else None, paths)
            return lf.collect(engine="gpu") if gpu else lf.collect()

        prefix = "peer" if default_cache else "peer-nocache"
        return task(_named(peer_step, step), name=f"{prefix}.{pipeline.name}.{step.name}", **options)

    return [make(step) for step in pipeline.steps]


def chained(engine: BareEngine, pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(b) One ``engine.execute()`` per step, chained with ``result.lazy()`` (call on the engine's thread)."""
    last = len(pipeline.steps) - 1
    calls = [
        lambda prev, i=i, s=s: bare_step(engine, s, prev, paths, last=i == last) for i, s in enumerate(pipeline.steps)
    ]
    return chain(pipeline, calls)


def fused(engine: BareEngine, pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(c) The whole pipeline as one query (call on the engine's thread)."""
    started = time.perf_counter()
    df = engine.collect(pipeline.fused(paths))
    return RunOutcome(time.perf_counter() - started, df)


def round_trips(engine: BareEngine, pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(d) Each step collected to the host and ``.lazy()``-ed into the next (call on the engine's thread)."""
    calls = [
        lambda df, s=s: engine.collect(s.build(df.lazy() if df is not None else None, paths)) for s in pipeline.steps
    ]
    return chain(pipeline, calls)


def cpu_polars(pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """(e) The fused query on polars' CPU engine."""
    started = time.perf_counter()
    df = pipeline.fused(paths).collect()
    return RunOutcome(time.perf_counter() - started, df)


def runs_of(
    pipeline: Pipeline, paths: Paths, keys: list[str], engine: BareEngine | None, *, gpu: bool
) -> dict[str, Callable[[], RunOutcome] | None]:
    """
    Each asked variant of one pipeline as a callable making one timed run.

    Parameters
    ----------
    pipeline, paths
        What to run, on which tables.
    keys
        The variants, in round order (:data:`ROUND_ORDER`).
    engine
        The bare engine of the flow run's session, or ``None`` without one.
    gpu
        Whether (g) collects on polars' GPU engine.

    Returns
    -------
    dict
        Variant to its callable; ``None`` for a variant that needs the session when there is none.
    """
    p = pipeline
    out: dict[str, Callable[[], RunOutcome] | None] = {}
    for key in keys:
        if key in SESSION_VARIANTS and engine is None:
            out[key] = None
        elif key in ("a", "a-deferred"):
            out[key] = lambda tasks=gpu_steps(p, paths, defer=key == "a-deferred"): chain(p, tasks)
        elif key == "h":
            out[key] = lambda tasks=floor_steps(p, paths, engine): engine.call(chain, p, tasks)
        elif key in ("b", "c", "d"):
            out[key] = lambda fn={"b": chained, "c": fused, "d": round_trips}[key]: engine.call(fn, engine, p, paths)
        elif key in ("g", "g-nocache"):
            out[key] = lambda tasks=peer_steps(p, paths, gpu=gpu, default_cache=key == "g"): chain(p, tasks)
        elif key == "e":
            out[key] = lambda: cpu_polars(p, paths)
    return out
