"""
The pipelines as plain Prefect tasks, with no code of prefect-cudf-polars on the path.

(h) ``floor``: one plain ``@task`` per step (``persist_result=False``,
    ``cache_policy=NO_CACHE``) making exactly (b)'s engine calls,
    ``engine.execute(lf)`` and, for the last step, ``lf.collect(engine=engine)``,
    and passing cudf-polars' persisted results from task to task. Called on
    the engine's thread (:mod:`benchmarks.engine_thread`), so the only cost over
    (b) is Prefect's task engine: Prefect's floor for a pipeline of tasks.
(g) ``peer``: what a user would write without this package: one plain
    ``@task`` per step that runs ``lf.collect(engine="gpu")`` (polars'
    ``GPUEngine`` with cudf-polars' defaults; plain ``lf.collect()`` on the
    ``cpu`` backend) and passes polars DataFrames between tasks, with Prefect's
    task defaults as a user gets them: the default cache policy hashes each
    task's inputs (the DataFrames) and its source. The sub-variant
    ``g-nocache`` is the same tasks with ``cache_policy=NO_CACHE``, so that
    ``g - g-nocache`` is what the hashing costs.

Tasks are called directly in order (Prefect runs a directly called task on the
calling thread); :func:`chain` times each call. Their names start with the
variant (``floor.``, ``peer.``, ``peer-nocache.``), so that the UI tells them
from our ``gpu_task``s (named ``<pipeline>.<step>``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import polars as pl
from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from benchmarks.bare_variants import BareEngine, bare_step
from benchmarks.engine_thread import EngineThread
from benchmarks.pipelines import Paths, Pipeline, Step
from benchmarks.timing import RunOutcome


def chain(pipeline: Pipeline, tasks: Sequence[Any]) -> RunOutcome:
    """One pipeline run: the step tasks called in order, each one's value passed to the next."""
    steps_s: dict[str, float] = {}
    started = time.perf_counter()
    value: Any = None
    for step, step_task in zip(pipeline.steps, tasks, strict=True):
        t = time.perf_counter()
        value = step_task(value)
        steps_s[step.name] = time.perf_counter() - t
    return RunOutcome(time.perf_counter() - started, value, steps_s)


def task_name(variant: str, pipeline: Pipeline, step: Step) -> str:
    """The Prefect task name of one step of a plain-task variant: ``floor.``, ``peer.`` or ``peer-nocache.`` first."""
    return f"{variant}.{pipeline.name}.{step.name}"


def floor_tasks(
    pipeline: Pipeline, paths: Paths, engine: BareEngine, thread: EngineThread
) -> list[Task[..., Any]]:
    """
    (h) One plain Prefect task per step, making (b)'s engine calls.

    Each task first checks that it runs on the engine's thread (a comparison of
    two thread objects), then calls :func:`~benchmarks.bare_variants.bare_step`.

    Raises
    ------
    WrongThreadError
        At run time, when a task is called off the engine's thread.
    """
    last = len(pipeline.steps) - 1

    def make(step: Step, is_last: bool) -> Task[..., Any]:
        def floor_step(previous: Any) -> Any:
            thread.check(f"(h) task {task_name('floor', pipeline, step)!r}")
            return bare_step(engine, step, previous, paths, last=is_last)

        floor_step.__name__ = floor_step.__qualname__ = step.name.replace("-", "_")
        return task(
            floor_step,
            name=task_name("floor", pipeline, step),
            persist_result=False,
            cache_policy=NO_CACHE,
        )

    return [make(step, i == last) for i, step in enumerate(pipeline.steps)]


def peer_tasks(
    pipeline: Pipeline, paths: Paths, *, gpu: bool, default_cache: bool
) -> list[Task[..., Any]]:
    """
    (g) One plain Prefect task per step that collects to a polars DataFrame.

    Parameters
    ----------
    pipeline, paths
        What to run, on which tables.
    gpu
        ``collect(engine="gpu")``; False: ``collect()`` (polars on the CPU, for
        the ``cpu`` backend).
    default_cache
        Prefect's default task options (its default cache policy hashes the
        inputs); False: ``cache_policy=NO_CACHE``.
    """
    options: dict[str, Any] = {} if default_cache else {"cache_policy": NO_CACHE}

    def make(step: Step) -> Task[..., Any]:
        def peer_step(previous: pl.DataFrame | None) -> pl.DataFrame:
            lf = step.build(previous.lazy() if previous is not None else None, paths)
            return lf.collect(engine="gpu") if gpu else lf.collect()

        peer_step.__name__ = peer_step.__qualname__ = step.name.replace("-", "_")
        prefix = "peer" if default_cache else "peer-nocache"
        return task(peer_step, name=task_name(prefix, pipeline, step), **options)

    return [make(step) for step in pipeline.steps]
