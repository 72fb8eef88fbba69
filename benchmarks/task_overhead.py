"""
(f) Per-task overhead on a tiny query: our GPU task vs a plain Prefect task vs the bare engine call.

The tiny query (the 5 nations of one region, from ``nation.parquet``) takes the
engine almost no time, so what is left is the cost around it:

* ``bare``: ``engine.execute(query)`` on the thread that created the engine;
* ``plain-task``: a plain ``@task`` (no persistence, no cache) making the same
  call on the same kind of engine — Prefect's own cost is ``plain-task - bare``;
* ``gpu-task``: our ``gpu_task`` returning a ``GPUResult`` through the flow
  run's engine session — our cost is ``gpu-task - plain-task``;
* ``noop-task``: a plain ``@task`` doing nothing (Prefect's floor), timed in
  both flow runs (``noop-task`` next to the bare engine, ``noop-task@ours`` next
  to our session), so a drift between the two flow runs shows.

Within a flow run the callables take turns call by call.

Tasks are called directly in the flow body (Prefect runs them on the flow's
thread), each call timed with ``time.perf_counter``; results are released after
each call, outside the timing.
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
    named: dict[str, Callable[[], Any]], *, calls: int, warmups: int, release: Callable[[Any], None]
) -> dict[str, dict[str, Any]]:
    """
    Time ``calls`` calls of each callable, interleaved, after ``warmups`` untimed rounds.

    The callables take turns call by call, so that a drift of the machine (Prefect's
    background work, other processes) touches them alike.

    Returns
    -------
    dict
        Per name: ``median_ms``, ``p10_ms``, ``p90_ms``, ``calls`` and ``runs_ms``
        (milliseconds).
    """
    for _ in range(warmups):
        for call in named.values():
            release(call())
    gc.collect()
    runs: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(calls):
        for name, call in named.items():
            started = time.perf_counter()
            value = call()
            runs[name].append((time.perf_counter() - started) * 1000)
            release(value)
    return {name: _stats(values) for name, values in runs.items()}


def release_result(value: Any) -> None:
    """Release a persisted result or GPUResult (``None`` passes)."""
    if value is not None:
        value.release()


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
