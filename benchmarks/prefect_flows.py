"""
The benchmark's flow run: every variant of the pipelines, interleaved, in one flow run and one engine session.

:func:`run_variants` runs one Prefect flow. Its body opens ``block.session()``
once (the engine starts once, outside the timings) and, pipeline by pipeline,
runs the variants round-robin (:func:`benchmarks.timing.interleave`), in this
order within a round:

* (a) ours: one ``gpu_task`` per step, ``GPUResult``s passed between them,
  called in the flow body. After each run the harness waits for the session's
  pending artifacts (``session.monitor.flush()``), outside the timing, so that
  they are not written while the next variant runs; the next run of (a) starts
  the monitor's writer thread again, inside its timing;
* ``a-deferred``, "(a) deferred": (a) with every step but the last deferred
  (``gpu_task(defer=True)``), so the last step's task runs the whole pipeline
  in one engine call; settled like (a);
* (h) Prefect's floor: plain Prefect tasks making (b)'s engine calls, on the
  engine's thread;
* (b), (c), (d): the bare engine on the engine's thread;
* (g) and ``g-nocache``: plain Prefect tasks on polars' ``GPUEngine``, in the
  flow body;
* (e): polars on the CPU, in the flow body.

Then (f), the per-task overhead on a tiny query, and its profile. The session
is opened only when a variant needs it ((g) and (e) do not), so that (g) can
also run with no other engine in the process.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import polars as pl
from prefect import flow
from prefect.context import FlowRunContext

from benchmarks import task_overhead
from benchmarks.bare_variants import BareEngine, chained, cpu_polars, fused, round_trips
from benchmarks.engine_thread import EngineThread
from benchmarks.overhead_profile import TaskPathProfile
from benchmarks.pipelines import Paths, Pipeline, Step
from benchmarks.plain_tasks import chain, floor_tasks, peer_tasks
from benchmarks.timing import Budget, RunOutcome, interleave, outcome_value
from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.tasks import GPUResult, gpu_task

#: The (f) measurements (a guard key names them, comma-joined), in their turn order.
OVERHEAD = "gpu-task,bare,plain-task,noop-task"

#: Variants that need the flow run's engine session.
SESSION_VARIANTS = frozenset({"a", "a-deferred", "b", "c", "d", "h", "f"})

#: Pipeline variants in the order a round runs them; ``g`` brings ``g-nocache``.
ROUND_ORDER = ("a", "a-deferred", "h", "b", "c", "d", "g", "g-nocache", "e")

#: ``guard(key, fn)``: run ``fn``, record its value or its error under ``key``.
Guard = Callable[[tuple[str, str], Callable[[], Any]], Any]


def step_tasks(pipeline: Pipeline, paths: Paths, *, defer: bool = False) -> list[Any]:
    """
    (a) One ``gpu_task`` per step; the last one collects to the host.

    With ``defer`` (``a-deferred``), every step but the last is deferred and
    the task names start with ``deferred.``, so the last step's task runs the
    whole pipeline in one engine call.
    """
    prefix = "deferred." if defer else ""

    def make(step: Step, last: bool) -> Any:
        def run_step(previous: GPUResult | None) -> pl.LazyFrame:
            return step.build(previous.lazy() if previous is not None else None, paths)

        run_step.__name__ = run_step.__qualname__ = step.name.replace("-", "_")
        name = f"{prefix}{pipeline.name}.{step.name}"
        return gpu_task(name=name, collect=last, defer=defer and not last)(run_step)

    last = len(pipeline.steps) - 1
    return [make(step, i == last) for i, step in enumerate(pipeline.steps)]


def round_keys(variants: set[str] | list[str]) -> list[str]:
    """The measured pipeline variants for the asked ones, in round order (``g`` adds ``g-nocache``)."""
    asked = set(variants)
    if "g" in asked:
        asked.add("g-nocache")
    return [v for v in ROUND_ORDER if v in asked]


def settle(session: Any) -> None:
    """Wait for the session's pending artifacts (called outside the timings)."""
    session.monitor.flush()


class VariantRunner:
    """
    The callables that run each variant of one pipeline once (see the module docstring).

    Parameters
    ----------
    paths
        The TPC-H tables.
    session
        The open engine session, or ``None`` when no variant needs it.
    gpu
        Whether (g) runs on polars' GPUEngine (False on the ``cpu`` backend).
    """

    def __init__(self, paths: Paths, session: Any, *, gpu: bool) -> None:
        self.paths = paths
        self.session = session
        self.gpu = gpu
        self.engine = BareEngine(session.running_engine) if session is not None else None
        self.thread = EngineThread(session) if session is not None else None

    def for_pipeline(self, p: Pipeline, keys: list[str]) -> dict[str, Callable[[], RunOutcome] | None]:
        """Key to its callable; ``None`` for a variant that needs the session when there is none."""
        paths, engine, thread = self.paths, self.engine, self.thread
        out: dict[str, Callable[[], RunOutcome] | None] = {}
        for key in keys:
            if key in SESSION_VARIANTS and (engine is None or thread is None):
                out[key] = None
            elif key in ("a", "a-deferred"):
                tasks = step_tasks(p, paths, defer=key == "a-deferred")
                out[key] = lambda tasks=tasks: self._settled(chain(p, tasks))
            elif key == "h":
                floor = floor_tasks(p, paths, engine, thread)  # type: ignore[arg-type]
                out[key] = lambda floor=floor: thread.call(chain, p, floor)  # type: ignore[union-attr]
            elif key in ("b", "c", "d"):
                fn = {"b": chained, "c": fused, "d": round_trips}[key]
                out[key] = lambda fn=fn: thread.call(fn, engine, p, paths)  # type: ignore[union-attr]
            elif key in ("g", "g-nocache"):
                tasks = peer_tasks(p, paths, gpu=self.gpu, default_cache=key == "g")
                out[key] = lambda tasks=tasks: chain(p, tasks)
            elif key == "e":
                out[key] = lambda: cpu_polars(p, paths)
        return out

    def _settled(self, outcome: RunOutcome) -> RunOutcome:
        settle(self.session)
        return outcome

    def overhead_timers(self, tiny: Any) -> dict[str, Callable[[], float]]:
        """(f), with ``tiny`` the tiny GPU task: each timer makes one call and returns its seconds."""
        engine, thread, paths = self.engine, self.thread, self.paths
        assert engine is not None and thread is not None
        plain = task_overhead.plain_task_for(engine, paths)
        timed = task_overhead.timed_release
        return {
            "gpu-task": lambda: timed(tiny),
            "bare": lambda: thread.call(timed, lambda: engine.execute(task_overhead.tiny_query(paths))),
            "plain-task": lambda: thread.call(timed, plain),
            "noop-task": lambda: timed(task_overhead.noop_task),
        }


def run_variants(
    *,
    label: str,
    block: CudfPolarsEngine,
    backend: str | None,
    backend_error: Exception | None,
    pipelines: list[Pipeline],
    paths: Paths,
    variants: list[str],
    runs: int,
    warmups: int,
    budget: Budget,
    overhead_calls: int,
    guard: Guard,
) -> dict[str, Any]:
    """
    Run the asked variants of every pipeline, interleaved, and (f), in one flow run.

    Parameters
    ----------
    label
        Goes into the flow run's name (the scale factor).
    block
        The engine block of the session.
    backend, backend_error
        The resolved backend, or ``None`` and why none could be resolved (every
        variant that needs the engine is then recorded as failed with it).
    pipelines, paths
        What to run, on which tables.
    variants
        Asked variants (letters ``a`` to ``h``, and ``a-deferred``).
    runs, warmups, budget
        See :func:`benchmarks.timing.interleave`.
    overhead_calls
        Timed calls of each (f) timer (and as many profiled ones).
    guard
        Records each measurement's value or error (keys ``(pipeline, variant)``,
        ``("task-overhead", OVERHEAD)``, ``("task-overhead", "profile")``).

    Returns
    -------
    dict
        ``flow_run_id``, ``flow_run_wall_s`` and, with a session, ``session``
        (its summary: backend, engine start and shutdown seconds, memory),
        ``description`` (GPUs, versions) and ``threads`` (the flow's and the
        engine's thread names).
    """
    want = set(variants)
    keys = round_keys(want)

    @flow(name="tpch-benchmark", flow_run_name=f"tpch-sf{label}", validate_parameters=False)
    def tpch_benchmark() -> dict[str, Any]:
        problem: Exception | None = backend_error
        info: dict[str, Any] = {"flow_run_id": str(FlowRunContext.get().flow_run.id)}
        with contextlib.ExitStack() as stack:
            session = None
            if want & SESSION_VARIANTS and problem is None:
                try:
                    session = stack.enter_context(block.session())
                except Exception as exc:  # recorded on every variant that needs it
                    traceback.print_exc()
                    problem = exc
            runner = VariantRunner(paths, session, gpu=backend not in (None, "cpu"))
            for p in pipelines:
                calls = runner.for_pipeline(p, keys)
                if backend is None and "g" in calls:
                    calls["g"] = calls["g-nocache"] = None  # (g) needs the GPU too
                runnable = {k: fn for k, fn in calls.items() if fn is not None}
                outcomes = interleave(runnable, runs=runs, warmups=warmups, budget=budget)
                for key in calls:
                    outcome = outcomes.get(key)
                    if outcome is None:
                        outcome = problem or RuntimeError("no engine session")
                    guard((p.name, key), lambda o=outcome: outcome_value(o))
            if "f" in want:
                measure_overhead(runner, session, problem, overhead_calls, warmups, guard)
            if session is not None:
                info |= {
                    "session": session.summary(),
                    "description": dict(session.description),
                    "threads": {
                        "flow": threading.current_thread().name,
                        "engine": runner.thread.thread.name if runner.thread else None,
                    },
                }
        return info

    started = time.perf_counter()
    info = tpch_benchmark()
    info["flow_run_wall_s"] = time.perf_counter() - started
    return info


def measure_overhead(
    runner: VariantRunner,
    session: Any,
    problem: Exception | None,
    calls: int,
    warmups: int,
    guard: Guard,
) -> None:
    """(f) and the task-path profile of the tiny GPU task, on the flow run's session."""
    if session is None:
        error = problem or RuntimeError("no engine session")
        guard(("task-overhead", OVERHEAD), lambda: outcome_value(error))
        guard(("task-overhead", "profile"), lambda: outcome_value(error))
        return
    tiny = task_overhead.gpu_task_for(runner.paths)
    timers = runner.overhead_timers(tiny)
    guard(
        ("task-overhead", OVERHEAD),
        lambda: task_overhead.time_calls(timers, calls=calls, warmups=max(3, warmups)),
    )
    settle(session)
    guard(("task-overhead", "profile"), lambda: profile_gpu_task(session, tiny, calls))
    settle(session)


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
