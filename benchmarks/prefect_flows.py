"""
The Prefect flows the benchmark runs.

* :func:`run_ours`: variant (a), our flow — each pipeline step is a ``gpu_task``
  and ``GPUResult``s pass between them inside one engine session
  (``with block.session():`` in the flow body, the engine started once, as
  the bare variants start theirs once); then (f) ``gpu-task`` and the task-path
  profile on the same session.
* :func:`run_plain_tasks`: (f) ``plain-task`` and ``noop-task`` — plain Prefect
  tasks calling the bare engine, and the ``bare`` call itself, in one flow run.

A pipeline run is timed in the flow body with ``time.perf_counter`` from the
first task call to the collected result. Each measurement is guarded: an error
is handed to ``on_error`` and the flow goes on with the next one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import polars as pl
from prefect import flow

from benchmarks import task_overhead
from benchmarks.overhead_profile import TaskPathProfile
from benchmarks.pipelines import Paths, Pipeline, Step
from benchmarks.timing import Budget, RunOutcome, repeat
from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.tasks import GPUResult, gpu_task

#: Task-overhead measurements of each flow run (a guard key names them, comma-joined).
OURS_OVERHEAD = "gpu-task,noop-task@ours"
PLAIN_OVERHEAD = "bare,plain-task,noop-task"

#: ``guard(key, fn)``: run ``fn``, record its value or its error under ``key``.
Guard = Callable[[tuple[str, str], Callable[[], Any]], Any]


def step_tasks(pipeline: Pipeline, paths: Paths) -> list[Any]:
    """One ``gpu_task`` per step; the last one collects to the host."""

    def make(step: Step, last: bool) -> Any:
        def run_step(previous: GPUResult | None) -> pl.LazyFrame:
            return step.build(previous.lazy() if previous is not None else None, paths)

        run_step.__name__ = run_step.__qualname__ = step.name.replace("-", "_")
        return gpu_task(name=f"{pipeline.name}.{step.name}", collect=last)(run_step)

    last = len(pipeline.steps) - 1
    return [make(step, i == last) for i, step in enumerate(pipeline.steps)]


def ours_once(pipeline: Pipeline, tasks: list[Any]) -> RunOutcome:
    """(a) One pipeline run: the step tasks called in order, results passed along."""
    steps_s: dict[str, float] = {}
    started = time.perf_counter()
    value: Any = None
    for step, step_task in zip(pipeline.steps, tasks, strict=True):
        t = time.perf_counter()
        value = step_task(value)
        steps_s[step.name] = time.perf_counter() - t
    return RunOutcome(time.perf_counter() - started, value, steps_s)


def run_ours(
    *,
    label: str,
    block: CudfPolarsEngine,
    pipelines: list[Pipeline],
    paths: Paths,
    runs: int,
    warmups: int,
    budget: Budget,
    overhead_calls: int,
    overhead: bool,
    guard: Guard,
) -> dict[str, Any]:
    """
    Run variant (a) for every pipeline and (f) ``gpu-task`` in one flow run.

    Parameters
    ----------
    label
        Goes into the flow run's name (the scale factor).
    block
        The engine block of the session.
    pipelines, paths
        What to run, on which tables.
    runs, warmups, budget
        See :func:`benchmarks.timing.repeat`.
    overhead_calls
        Timed calls of the tiny GPU task (and as many profiled ones).
    overhead
        Whether to measure (f) at all.
    guard
        Records each measurement's value or error (keys ``(pipeline, "a")``,
        ``("task-overhead", OURS_OVERHEAD)``, ``("task-overhead", "profile")``).

    Returns
    -------
    dict
        The session summary (backend, engine start and shutdown seconds, memory),
        the flow run's wall seconds and the session's description (GPUs, versions).

    Raises
    ------
    NoGPUError, SessionError, Exception
        When the session cannot start; errors of single measurements go to ``guard``.
    """

    @flow(name="tpch-benchmark-ours", flow_run_name=f"tpch-sf{label}", validate_parameters=False)
    def tpch_benchmark_ours() -> dict[str, Any]:
        with block.session() as session:
            for pipeline in pipelines:
                tasks = step_tasks(pipeline, paths)
                guard(
                    (pipeline.name, "a"),
                    lambda p=pipeline, t=tasks: repeat(
                        lambda: ours_once(p, t), runs=runs, warmups=warmups, budget=budget
                    ),
                )
            if overhead:
                tiny = task_overhead.gpu_task_for(paths)
                guard(
                    ("task-overhead", OURS_OVERHEAD),
                    lambda: task_overhead.time_calls(
                        {"gpu-task": tiny, "noop-task@ours": task_overhead.noop_task},
                        calls=overhead_calls,
                        warmups=max(3, warmups),
                        release=task_overhead.release_result,
                    ),
                )
                guard(
                    ("task-overhead", "profile"),
                    lambda: profile_gpu_task(session, tiny, overhead_calls),
                )
            description = dict(session.description)
        return {"session": session.summary(), "description": description}

    started = time.perf_counter()
    info = tpch_benchmark_ours()
    info["flow_run_wall_s"] = time.perf_counter() - started
    return info


def profile_gpu_task(session: Any, tiny: Any, calls: int) -> dict[str, float]:
    """Time ``calls`` calls of the tiny GPU task under :class:`TaskPathProfile`."""
    total = 0.0
    with TaskPathProfile(session) as profile:
        for _ in range(calls):
            started = time.perf_counter()
            result = tiny()
            total += time.perf_counter() - started
            result.release()
    return profile.breakdown(total, calls)


def run_plain_tasks(
    *, label: str, engine: Any, paths: Paths, calls: int, warmups: int, guard: Guard
) -> None:
    """
    (f) ``bare``, ``plain-task`` and ``noop-task`` in one flow run, on ``engine``.

    The flow and its directly called tasks run on this thread, which created the
    bare engine, so the plain task makes exactly the bare call.
    """
    plain = task_overhead.plain_task_for(engine, paths)
    release = task_overhead.release_result

    @flow(
        name="tpch-benchmark-plain-tasks",
        flow_run_name=f"plain-sf{label}",
        validate_parameters=False,
    )
    def tpch_benchmark_plain_tasks() -> None:
        guard(
            ("task-overhead", PLAIN_OVERHEAD),
            lambda: task_overhead.time_calls(
                {
                    "bare": lambda: engine.execute(task_overhead.tiny_query(paths)),
                    "plain-task": plain,
                    "noop-task": task_overhead.noop_task,
                },
                calls=calls,
                warmups=warmups,
                release=release,
            ),
        )

    tpch_benchmark_plain_tasks()
