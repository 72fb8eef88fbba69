"""
(f) Per-task overhead on a tiny query: our GPU task vs a plain Prefect task vs the bare engine call.

The tiny query (the 5 nations of one region, from ``nation.parquet``) takes the
engine almost no time, so what is left is the cost around it. In one flow run
and one engine session, taking turns call by call:

* ``bare``: ``engine.execute(query)`` on the engine's thread;
* ``plain-task``: a plain ``@task`` (no persistence, no cache) making the same
  call, on the engine's thread: Prefect's own cost is ``plain-task - bare``;
* ``gpu-task``: our ``gpu_task`` returning a ``GPUResult`` through the flow
  run's engine session, called in the flow body: our cost is
  ``gpu-task - plain-task`` (the hand-off to the owner thread included);
* ``noop-task``: a plain ``@task`` doing nothing, called in the flow body.

Each call is timed with ``time.perf_counter`` on the thread it runs on; its
result is released after the timing, on that same thread.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import polars as pl
from prefect import task
from prefect.cache_policies import NO_CACHE

from benchmarks.pipelines import Paths, scan

TINY_REGION = 2  # ASIA


def tiny_query(paths: Paths) -> pl.LazyFrame:
    """The nations of one region: 5 rows out of 25."""
    return (
        scan(paths, "nation")
        .filter(pl.col("n_regionkey") == TINY_REGION)
        .select("n_nationkey", "n_name")
    )


def _stats(runs: list[float]) -> dict[str, Any]:
    ordered = sorted(runs)
    return {
        "median_ms": statistics.median(runs),
        "p10_ms": ordered[len(ordered) // 10],
        "p90_ms": ordered[(len(ordered) * 9) // 10],
        "calls": len(runs),
        "runs_ms": runs,
    }


def time_calls(
    named: dict[str, Callable[[], float]], *, calls: int, warmups: int
) -> dict[str, dict[str, Any]]:
    """
    Call each timer ``calls`` times, interleaved, after ``warmups`` untimed rounds.

    The timers take turns call by call, so that a drift of the machine (Prefect's
    background work, other processes) touches them alike.

    Parameters
    ----------
    named
        Name to a callable that makes one call and returns its seconds
        (:func:`timed_release`, possibly handed to the engine's thread).
    calls, warmups
        Timed and untimed rounds.

    Returns
    -------
    dict
        Per name: ``median_ms``, ``p10_ms``, ``p90_ms``, ``calls`` and ``runs_ms``
        (milliseconds).
    """
    for _ in range(warmups):
        for timer in named.values():
            timer()
    gc.collect()
    runs: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(calls):
        for name, timer in named.items():
            runs[name].append(timer() * 1000)
    return {name: _stats(values) for name, values in runs.items()}


def timed_release(call: Callable[[], Any]) -> float:
    """Seconds of ``call()``; then its persisted result or GPUResult is released (``None`` passes)."""
    started = time.perf_counter()
    value = call()
    seconds = time.perf_counter() - started
    if value is not None:
        value.release()
    return seconds


def plain_task_for(engine: Any, paths: Paths) -> Any:
    """A plain Prefect task that makes the bare engine call on the tiny query."""

    @task(name="plain-engine-execute", persist_result=False, cache_policy=NO_CACHE)
    def plain_engine_execute() -> Any:
        return engine.execute(tiny_query(paths))

    return plain_engine_execute


@task(name="noop", persist_result=False, cache_policy=NO_CACHE)
def noop_task() -> None:
    """A plain Prefect task doing nothing."""
    return None


def gpu_task_for(paths: Paths) -> Any:
    """Our GPU task running the tiny query on the flow run's engine session."""
    from prefect_cudf_polars.tasks import gpu_task

    @gpu_task(name="tiny-gpu-query")
    def tiny_gpu_query() -> pl.LazyFrame:
        return tiny_query(paths)

    return tiny_gpu_query
