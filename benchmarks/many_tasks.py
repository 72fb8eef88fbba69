"""
Many small tasks: a flow run that submits N tiny ``gpu_task``s on the ``cpu`` backend vs N plain ``@task``s.

``python -m benchmarks --many-tasks --tasks 200 --runs 5 --out DIR`` runs two
flows, each ``.submit()``-ing N tasks that run the same tiny polars query (5
rows of an in-memory 25-row frame) and waiting for all of them:

``ours``
    ``gpu_task`` on ``CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu"))``;
    each returns a ``GPUResult`` left unread, so the session's end releases N
    results (the worst case for the flow run's end);
``plain``
    ``@task(persist_result=False, cache_policy=NO_CACHE)`` (the options a
    ``gpu_task`` starts from) on Prefect's ``ThreadPoolTaskRunner``, each
    collecting the query to a DataFrame on polars' CPU engine.

The two take turns flow run by flow run, the first of a round alternating,
after at least one untimed round (the first flow runs of a process start
Prefect's local API and import what the tasks need), with Prefect's flow-run
heartbeat off: Prefect 3.9.1's flow engine joins its heartbeat thread at a
flow run's end, and that thread sleeps in steps of 1 s, so with it every flow
call would last a whole number of seconds past its start (plus its first
API calls) and a ratio of two would jump by whole seconds. No GPU is needed. Per flow run, in seconds:
``wall_s`` (the flow call), ``tasks_s`` (flow body start to the last task's
result), ``end_s`` (from there to the call's return: the flow run's end, our
session's end included); then the harness waits until the API holds every
task run as Completed (``settle_s``, :func:`settle`), and takes ``cpu_s`` (CPU
time of this process over the flow run and its settling) and ``api_cpu_s``
(of its child processes: Prefect's ephemeral local API; 0 with an API
elsewhere). ``--profile`` adds one sampled flow run of each
(:class:`~benchmarks.profiling.StackSampler`).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.task_runners import ThreadPoolTaskRunner

from benchmarks.profiling import StackSampler
from benchmarks.stats import bootstrap_ci, summary
from benchmarks.timing import Budget

FRAME = pl.DataFrame({"key": range(25), "group": [i % 5 for i in range(25)]})
VARIANTS = ("plain", "ours")
#: The seconds of each flow run besides its wall time, as the module docstring says.
FLOW_FIGURES = ("tasks_s", "end_s", "settle_s", "cpu_s", "api_cpu_s")


def tiny_query(i: int) -> pl.LazyFrame:
    """The 5 keys of group ``i % 5``."""
    return FRAME.lazy().filter(pl.col("group") == i % 5).select("key")


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its running child processes (``/proc``, Linux)."""
    own = os.times()
    tick, children = os.sysconf("SC_CLK_TCK"), 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            children += (int(fields[11]) + int(fields[12])) / tick
    return own.user + own.system, children


def settle(flow_run_id: Any, tasks: int, timeout_s: float = 120.0) -> float:
    """
    Wait until the API holds the flow run's ``tasks`` task runs as Completed; the seconds waited.

    Prefect 3.9 records task runs from their events, after the flow run may have
    ended; the next flow run then starts on an API that has taken in this one
    (a busy local API answers 503 and Prefect's client sleeps 2 s, 4 s, ...).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas import filters
    from prefect.client.schemas.objects import StateType

    flt = filters.TaskRunFilter(
        flow_run_id=filters.TaskRunFilterFlowRunId(any_=[flow_run_id]),
        state=filters.TaskRunFilterState(type=filters.TaskRunFilterStateType(any_=[StateType.COMPLETED])),
    )
    started = time.perf_counter()
    with get_client(sync_client=True) as client:  # a row at offset tasks - 1 exists once all are there
        while not client.read_task_runs(task_run_filter=flt, offset=tasks - 1, limit=1):
            if time.perf_counter() - started > timeout_s:
                break
            time.sleep(0.1)
    return time.perf_counter() - started


def make_flows(tasks: int, seen: dict[str, Any]) -> dict[str, Any]:
    """The two flows of the module docstring; each writes ``tasks_s`` (and ours its ``session``) into ``seen``."""
    from prefect_cudf_polars import CudfPolarsEngine, CudfPolarsTaskRunner, gpu_task
    from prefect_cudf_polars.blocks import get_engine_session

    @gpu_task(name="tiny-gpu")
    def tiny_gpu(i: int) -> pl.LazyFrame:
        return tiny_query(i)

    @task(name="tiny-plain", persist_result=False, cache_policy=NO_CACHE)
    def tiny_plain(i: int) -> pl.DataFrame:
        return tiny_query(i).collect()

    def submit_all(step: Any) -> None:
        started = time.perf_counter()
        seen["flow_run_id"] = FlowRunContext.get().flow_run.id
        for future in [step.submit(i) for i in range(tasks)]:
            future.result()
        seen["tasks_s"], seen["tasks_done"] = time.perf_counter() - started, time.perf_counter()

    @flow(name="many-gpu-tasks", task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def ours() -> None:
        seen["session"] = get_engine_session()  # opens the engine, as the first task would
        submit_all(tiny_gpu)

    @flow(name="many-plain-tasks", task_runner=ThreadPoolTaskRunner())
    def plain() -> None:
        submit_all(tiny_plain)

    return {"ours": ours, "plain": plain}


def one_run(
    name: str, flows: dict[str, Any], seen: dict[str, Any], tasks: int, sampler: StackSampler | None = None
) -> dict[str, Any]:
    """One flow run of ``name``, with the figures of the module docstring (seconds); ``sampler`` samples its call."""
    seen.clear()
    cpu, api = cpu_seconds()
    started = time.perf_counter()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}), sampler or contextlib.nullcontext():
        flows[name]()
    ended = time.perf_counter()
    settle_s = settle(seen["flow_run_id"], tasks)
    cpu_after, api_after = cpu_seconds()
    run = {
        "wall_s": ended - started, "tasks_s": seen["tasks_s"], "end_s": ended - seen["tasks_done"],
        "settle_s": settle_s, "cpu_s": cpu_after - cpu, "api_cpu_s": max(api_after - api, 0.0),
    }
    if "session" in seen:
        ended_with = seen["session"].summary()
        run["released_at_end"] = ended_with["counts"]["released_unconsumed"]
        run["teardown"] = ended_with["teardown"]
    return run


def measure(*, tasks: int, runs: int, warmups: int, budget: Budget, profile: bool) -> dict[str, Any]:
    """
    The interleaved flow runs of both variants (see the module docstring).

    Parameters
    ----------
    tasks
        Tasks per flow run.
    runs, warmups
        Timed and untimed rounds (one flow run of each variant per round; at
        least one untimed); a spent budget stops after the first timed round.
    budget
        The command's budget.
    profile
        One more sampled flow run of each variant.

    Returns
    -------
    dict
        ``tasks``, ``runs``; per variant: ``wall`` (:func:`benchmarks.stats.summary`
        of ``wall_s``), medians ``tasks_s``, ``end_s``, ``settle_s``, ``cpu_s``, ``api_cpu_s``,
        ``per_task_ms`` (median wall per task), ``runs`` (every figure of each
        flow run); ``ratio`` (median ``ours`` wall over median ``plain``) and its
        bootstrap ``ratio_ci``; with ``profile``, ``profile`` per variant.
    """
    seen: dict[str, Any] = {}
    flows = make_flows(tasks, seen)
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    warmups = max(1, warmups)
    for round_index in range(warmups + runs):
        if round_index > warmups and budget.spent():
            break
        for name in VARIANTS[:: 1 if round_index % 2 == 0 else -1]:
            run = one_run(name, flows, seen, tasks)
            if round_index >= warmups:
                got[name].append(run)
    out: dict[str, Any] = {"tasks": tasks, "runs": len(got["ours"])}
    for name, done in got.items():
        walls = [r["wall_s"] for r in done]
        out[name] = {"wall": summary(walls), "runs": done, "per_task_ms": statistics.median(walls) / tasks * 1000}
        for figure in FLOW_FIGURES:
            out[name][figure] = statistics.median(r[figure] for r in done)
    walls = {name: out[name]["wall"]["values"] for name in VARIANTS}
    out["ratio"] = out["ours"]["wall"]["median"] / out["plain"]["wall"]["median"]
    out["ratio_ci"] = bootstrap_ci(walls["ours"], walls["plain"], lambda a, b: a / b)
    if profile:
        out["profile"] = {}
        for name in VARIANTS:
            one_run(name, flows, seen, tasks, sampler := StackSampler())
            out["profile"][name] = sampler.report()
    return out
