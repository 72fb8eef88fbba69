"""
The benchmark's flow run: the asked variants of every pipeline, interleaved, then (f), in one flow run.

:func:`run_variants` runs one Prefect flow per scale factor. Its body opens
``block.session()`` once, when a variant needs it (the engine starts outside
the timings; (g) and (e) alone run with no engine in the process), then runs
each pipeline's variants round-robin (:func:`benchmarks.timing.interleave`) in
the order of :data:`benchmarks.variants.ROUND_ORDER`, then (f)
(:mod:`benchmarks.task_overhead`). Every measurement is recorded as it ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from typing import Any

from prefect import flow
from prefect.context import FlowRunContext

from benchmarks import task_overhead
from benchmarks.pipelines import Paths, Pipeline
from benchmarks.results_file import ResultsFile, attempt
from benchmarks.timing import Budget, BudgetSpentError, interleave
from benchmarks.variants import ROUND_ORDER, SESSION_VARIANTS, BareEngine, runs_of


def round_keys(variants: list[str] | set[str]) -> list[str]:
    """The measured pipeline variants of the asked ones, in round order (``g`` brings ``g-nocache``)."""
    asked = set(variants) | ({"g-nocache"} if "g" in variants else set())
    return [v for v in ROUND_ORDER if v in asked]


def run_variants(
    *,
    label: str,
    block: Any,
    backend: str | None,
    backend_error: Exception | None,
    pipelines: list[Pipeline],
    paths: Paths,
    settings: Any,
    budget: Budget,
    results: ResultsFile,
) -> dict[str, Any]:
    """
    Run the asked variants of every pipeline, interleaved, and (f), in one flow run; record each.

    Parameters
    ----------
    label
        The scale factor as text (in the flow run's name and the records).
    block
        The engine block of the session.
    backend, backend_error
        The resolved backend, or ``None`` and why none could be resolved (every
        variant that needs the engine is then recorded as failed with it).
    pipelines, paths
        What to run, on which tables.
    settings
        The command's arguments: ``variants``, ``runs``, ``warmups``,
        ``overhead_calls``, ``profile``.
    budget
        The command's budget.
    results
        Where each measurement is recorded.

    Returns
    -------
    dict
        ``flow_run_id``, ``flow_run_wall_s`` and, with a session, ``session``
        (its summary at its end) and ``threads`` (the flow's and the engine's).
    """
    want, keys = set(settings.variants), round_keys(settings.variants)

    @flow(name="tpch-benchmark", flow_run_name=f"tpch-sf{label}", validate_parameters=False)
    def tpch_benchmark() -> dict[str, Any]:
        problem: BaseException | None = backend_error
        info: dict[str, Any] = {"flow_run_id": str(FlowRunContext.get().flow_run.id)}
        session = engine = None
        with contextlib.ExitStack() as stack:
            if want & SESSION_VARIANTS and problem is None:
                try:
                    session = stack.enter_context(block.session())
                    engine = BareEngine(session)
                except Exception as exc:  # recorded on every variant that needs it
                    traceback.print_exc()
                    problem = exc
            missing = problem or RuntimeError("no engine session")
            for p in pipelines:
                calls = runs_of(p, paths, keys, engine, gpu=backend not in (None, "cpu"))
                if backend is None:  # (g) needs the GPU too
                    calls = {k: None if k.startswith("g") else fn for k, fn in calls.items()}
                runnable = {k: fn for k, fn in calls.items() if fn}
                outcomes = interleave(runnable, runs=settings.runs, warmups=settings.warmups, budget=budget)
                for key in calls:
                    results.record(label, p.name, key, outcomes.get(key, missing))
            if "f" in want:
                results.set("task_overhead", attempt(lambda: overhead(engine, missing)), sf=label)
        if session is not None and engine is not None:
            threads = {"flow": threading.current_thread().name, "engine": engine.thread.name}
            info |= {"session": session.summary(), "threads": threads}
        return info

    def overhead(engine: BareEngine | None, missing: BaseException) -> dict[str, Any]:
        if engine is None:
            raise missing
        if budget.spent():
            raise BudgetSpentError("the command's time budget (--budget-s) was spent")
        calls, warmups = settings.overhead_calls, max(3, settings.warmups)
        return task_overhead.measure(engine, paths, calls=calls, warmups=warmups, profile=settings.profile)

    started = time.perf_counter()
    info = tpch_benchmark()
    return info | {"flow_run_wall_s": time.perf_counter() - started}
