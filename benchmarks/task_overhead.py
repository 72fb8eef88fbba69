"""
(f) Per-task overhead on a tiny query: our GPU task vs a plain Prefect task vs the bare engine call.

The tiny query (the 5 nations of one region, from ``nation.parquet``) takes the
engine almost no time, so what is left is the cost around it. In the flow run
of the variants, on its engine session, four timers take turns call by call:

``gpu-task``
    our ``gpu_task`` returning a ``GPUResult``, called in the flow body, with
    the product's defaults (its Prefect events on, no per-result artifact);
``plain-task``
    a plain ``@task(persist_result=False, cache_policy=NO_CACHE)`` making the
    bare call, on the engine's thread;
``bare``
    ``engine.execute(query)`` alone, on the engine's thread;
``noop-task``
    a plain task doing nothing, in the flow body.

Each call is timed with ``time.perf_counter`` on the thread it runs on; its
result is released after the timing, and the owner thread has run that release
before the next call starts. Each round runs the four timers in a new random
order (seeded), so no timer always follows the same one. Each timer's median comes with its 95 %
order-statistic interval; our overhead (``gpu-task`` minus ``plain-task``) and
Prefect's (``plain-task`` minus ``bare``) are differences of medians, with
percentile bootstrap intervals (:mod:`benchmarks.stats`).
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from typing import Any

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from benchmarks.pipelines import Paths, scan
from benchmarks.profiling import StackSampler
from benchmarks.stats import bootstrap_ci, summary
from benchmarks.variants import BareEngine

TIMERS = ("gpu-task", "plain-task", "bare", "noop-task")
#: Difference name to (minuend, subtrahend).
DIFFERENCES = {"ours": ("gpu-task", "plain-task"), "prefect": ("plain-task", "bare")}


def tiny_query(paths: Paths) -> pl.LazyFrame:
    """The nations of one region (ASIA): 5 rows of 25."""
    return scan(paths, "nation").filter(pl.col("n_regionkey") == 2).select("n_nationkey", "n_name")


def timed_release(call: Callable[[], Any]) -> float:
    """Seconds of ``call()``; the persisted result or ``GPUResult`` it returns is released after the timing."""
    started = time.perf_counter()
    value = call()
    seconds = time.perf_counter() - started
    if value is not None:
        value.release()
    return seconds


@task(name="noop", persist_result=False, cache_policy=NO_CACHE)
def noop_task() -> None:
    """A plain Prefect task doing nothing."""


def timers(engine: BareEngine, paths: Paths) -> dict[str, Callable[[], float]]:
    """The four timers of the module docstring, each making one call and returning its seconds."""
    from prefect_cudf_polars.tasks import gpu_task

    @gpu_task(name="tiny-gpu-query")
    def tiny_gpu_query() -> pl.LazyFrame:
        return tiny_query(paths)

    @task(name="plain-engine-execute", persist_result=False, cache_policy=NO_CACHE)
    def plain_engine_execute() -> Any:
        return engine.execute(tiny_query(paths))

    return {
        "gpu-task": lambda: timed_release(tiny_gpu_query),
        "plain-task": lambda: engine.call(timed_release, plain_engine_execute),
        "bare": lambda: engine.call(timed_release, lambda: engine.execute(tiny_query(paths))),
        "noop-task": lambda: timed_release(noop_task),
    }


def measure(engine: BareEngine, paths: Paths, *, calls: int, warmups: int, profile: bool) -> dict[str, Any]:
    """
    Time each timer ``calls`` times, interleaved call by call in a random order each round, after ``warmups`` untimed rounds.

    Parameters
    ----------
    engine
        The bare engine of the flow run's session (call in its flow run).
    paths
        The TPC-H tables (``nation`` is read).
    calls, warmups
        Timed and untimed rounds.
    profile
        Then sample the stacks of ``calls`` more ``gpu-task`` calls
        (:class:`~benchmarks.profiling.StackSampler`).

    Returns
    -------
    dict
        ``calls``; ``timers``: per timer ``median``, ``ci`` (ms) and ``values``
        (ms per call); ``differences``: ``ours`` and ``prefect``, each
        ``median_ms`` and ``ci_ms``; with ``profile``, ``profile``.
    """
    named = timers(engine, paths)
    drained = lambda: engine.call(lambda: None)  # noqa: E731  (a release queued on the owner thread has run)
    for _ in range(warmups):
        for timer in named.values():
            timer()
            drained()
    gc.collect()
    runs: dict[str, list[float]] = {name: [] for name in named}
    order, shuffled = list(named), random.Random(0)
    for _ in range(calls):
        shuffled.shuffle(order)  # no timer always follows the same one (its queued release, its events)
        for name in order:
            runs[name].append(named[name]() * 1000)
            drained()
    out: dict[str, Any] = {"calls": calls, "timers": {name: summary(values) for name, values in runs.items()}}
    out["differences"] = {
        name: {
            "median_ms": out["timers"][x]["median"] - out["timers"][y]["median"],
            "ci_ms": bootstrap_ci(runs[x], runs[y], lambda a, b: a - b),
        }
        for name, (x, y) in DIFFERENCES.items()
    }
    if profile:
        with StackSampler() as sampler:
            for _ in range(calls):
                named["gpu-task"]()
        out["profile"] = sampler.report()
    return out
