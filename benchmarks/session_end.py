"""
How much a flow run's end costs with many GPU results: the engine session's end for N results.

::

    python -m benchmarks.session_end --results 1000 --backend cpu --out output/bench/session_end.json

Flow runs of the same shape, each ``.submit()``-ing N tasks that each run a small
query (1,000 rows) and waiting for all of them in the flow body:

* ``ours``: a ``gpu_task`` returning a ``GPUResult`` on ``CudfPolarsTaskRunner(block)``;
  the results are left unconsumed, so the session's end releases all N (the worst case);
* ``plain``: a plain Prefect ``@task`` returning the host DataFrame on Prefect's
  ``ThreadPoolTaskRunner``: what a flow run's end costs without us.

Figures (seconds, ``time.perf_counter``):

* ``tasks_s``: flow body start to the last future resolved;
* ``end_s``: last future resolved to the flow call's return (for ``ours``: the session's
  end, result releases, end line, summary artifact, ``engine.stopped``);
* ``artifacts_s`` (``ours``): flow call's return to the last of the N result artifacts
  readable through the API (artifacts written in the background after the run ended);
* ``session_close_s`` (``ours`` and ``ours_monitor_off``): the part of ``end_s`` spent in the session's own end
  (``EngineSession.close``: teardown, and the wait of at most 1 s for its summary
  artifact and ``engine.stopped``);
* ``session_end_added_s`` = ``ours.end_s - plain.end_s``: what our session adds to the
  flow run's end, Prefect's own end work included (on a small machine with a local API,
  that work is slowed by the API writing the run's events and artifacts in the
  background). Goal: at most 1 s for 1,000 results on a 2-core machine.

Each flow run starts once the API holds every task run of the one before as Completed
(``settle_s``: the seconds that took, not part of any other figure; ``settled`` is false
where that took longer than ``SETTLE_TIMEOUT_S`` and the next flow run started anyway).

A third flow run, ``ours_monitor_off``, is ``ours`` with the session monitor switched off
(no result artifacts, plans, events or summary artifact), run between the other two:

* ``monitor_end_added_s`` = ``ours.end_s - ours_monitor_off.end_s``: what the monitor
  (every result's artifact and events, written in the background) adds to the flow run's
  end.

``--order`` sets the order of the three flow runs (default ``plain,ours_monitor_off,ours``);
vary it across runs of the benchmark so that a run-order effect does not pass for a cost.
``--warmup N`` first runs each of the three with N results (default 20, not measured), so
that the first measured flow run does not pay for first calls (imports, the API's caches).
The JSON records the order, the warm-up, the monitor's options and the machine
(``benchmarks.machine.describe()``: CPU, Python, package versions).

Prefect 3.9.1 adds 0 to 1 s at random to every flow run's ``end_s``: its flow engine joins
the flow run's heartbeat thread, which sleeps in steps of 1 s. Compare medians of several
runs, not single runs.

The Prefect API is the one ``PREFECT_API_URL`` names, else Prefect's ephemeral local API.
Prints the JSON it writes to ``--out``.

``--no-result-artifacts``, ``--no-plans``, ``--no-events`` and ``--no-summary-artifact``
switch the session monitor's parts off (``prefect_cudf_polars.blocks.monitoring.monitor.
DEFAULT_OPTIONS``), for a breakdown of what each costs; ``artifacts_s`` is then ``None``
without result artifacts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

# Before Prefect is imported: the ephemeral API's first start migrates its database,
# which can take tens of seconds on a small machine (Prefect's default timeout is shorter).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

import polars as pl  # noqa: E402
from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from benchmarks import machine  # noqa: E402
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session  # noqa: E402
from prefect_cudf_polars.blocks.monitoring import monitor  # noqa: E402
from prefect_cudf_polars.tasks import gpu_task  # noqa: E402

ROWS = 1_000
#: Most artifacts the API returns per read.
PAGE = 200
#: Most seconds to wait, after a flow run, for the API to hold its task runs as Completed.
SETTLE_TIMEOUT_S = 180.0


def small_query(i: int) -> pl.LazyFrame:
    """1,000 rows, two columns; ``i`` makes each task's query its own."""
    return pl.LazyFrame({"k": range(ROWS)}).with_columns(v=pl.col("k") * i)


@gpu_task(task_run_name="gpu-{i}")
def gpu_step(i: int) -> pl.LazyFrame:
    return small_query(i)


@task(persist_result=False, cache_policy=NO_CACHE, task_run_name="plain-{i}")
def plain_step(i: int) -> pl.DataFrame:
    return small_query(i).collect()


def _timed_flow(step: Any, results: int, runner: Any, name: str) -> dict[str, Any]:
    marks: dict[str, float] = {}

    sessions: list[Any] = []

    @flow(name=name, task_runner=runner)
    def many() -> int:
        marks["body_start"] = time.perf_counter()
        futures = [step.submit(i) for i in range(results)]
        for future in futures:
            future.result()
        marks["tasks_done"] = time.perf_counter()
        if isinstance(runner, CudfPolarsTaskRunner):
            sessions.append(get_engine_session())
        return len(futures)

    state = many(return_state=True)
    returned = time.perf_counter()
    if not state.is_completed():
        raise RuntimeError(f"flow run {name} ended {state.type.value}: {state.message}")
    figures = {
        "flow_run_id": str(state.state_details.flow_run_id),
        "tasks_s": marks["tasks_done"] - marks["body_start"],
        "end_s": returned - marks["tasks_done"],
        "returned_at": returned,
    }
    if sessions:
        # The session's own share of end_s: EngineSession.close (teardown and monitor wait).
        figures["session_close_s"] = sessions[0].end_seconds
    return figures


def _poll(ready: Callable[[Any], bool], timeout: float) -> tuple[float, bool]:
    """
    Call ``ready(client)`` every 0.5 s until it is true or ``timeout`` seconds pass.

    Returns the seconds waited, and whether ``ready`` became true within ``timeout``.
    """
    from prefect.client.orchestration import get_client

    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        with get_client(sync_client=True) as client:
            if ready(client):
                return time.perf_counter() - started, True
        time.sleep(0.5)
    return time.perf_counter() - started, False


def _settle(flow_run_id: str, results: int, timeout: float) -> tuple[float, bool]:
    """
    Wait until the API holds the flow run's ``results`` task runs as Completed.

    Returns the seconds waited, and whether they were all there before ``timeout`` seconds.

    Prefect 3.9 records task runs from their events, after the flow run ended; the next
    flow run then starts on an API that has taken in everything of this one (on a small
    machine a busy local API slows the next flow run, or refuses to create it: 503).
    """
    from prefect.client.schemas.filters import (
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    flt = TaskRunFilter(
        flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]),
        state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.COMPLETED])),
    )
    # One row at offset results - 1 exists once all the task runs are recorded.
    return _poll(lambda client: bool(client.read_task_runs(task_run_filter=flt, offset=results - 1, limit=1)), timeout)


def _wait_for_result_artifacts(flow_run_id: str, results: int, timeout: float) -> tuple[float, bool]:
    """
    Wait until the API holds ``results`` task-run artifacts of the flow run.

    Returns the seconds waited, and whether they were all there before ``timeout`` seconds.
    """
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterTaskRunId,
    )

    flt = ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
        task_run_id=ArtifactFilterTaskRunId(is_null_=False),
    )

    def all_there(client: Any) -> bool:
        found = 0
        while page := client.read_artifacts(artifact_filter=flt, limit=PAGE, offset=found):
            found += len(page)
        return found >= results

    return _poll(all_there, timeout)


#: The session monitor with every part switched off (the ``ours_monitor_off`` flow run).
MONITOR_OFF = monitor.MonitorOptions(result_artifacts=False, plans=False, events=False, summary_artifact=False)


#: The three flow runs, in their default order.
KINDS = ("plain", "ours_monitor_off", "ours")


def _run_kind(kind: str, results: int, block: CudfPolarsEngine, prefix: str = "session-end") -> dict[str, Any]:
    """One flow run of ``kind`` (see :data:`KINDS`) with ``results`` tasks."""
    if kind == "plain":
        return _timed_flow(plain_step, results, ThreadPoolTaskRunner(), f"{prefix}-plain")
    if kind == "ours":
        return _timed_flow(gpu_step, results, CudfPolarsTaskRunner(block), f"{prefix}-ours")
    # ``ours`` with the session monitor switched off (its options restored after).
    options = monitor.DEFAULT_OPTIONS
    monitor.DEFAULT_OPTIONS = MONITOR_OFF
    try:
        return _timed_flow(gpu_step, results, CudfPolarsTaskRunner(block), f"{prefix}-ours-monitor-off")
    finally:
        monitor.DEFAULT_OPTIONS = options


def measure(
    results: int,
    backend: str,
    artifact_timeout: float,
    order: tuple[str, ...] = KINDS,
    warmup: int = 0,
) -> dict[str, Any]:
    """
    Run the three flow runs in ``order`` and return the figures (see the module docstring).

    With ``warmup`` > 0, each of the three first runs once with ``warmup`` results, unmeasured.
    """
    _check_order(order)
    block = CudfPolarsEngine(backend=backend, raise_on_fail=True)
    if warmup > 0:
        for kind in order:
            run = _run_kind(kind, warmup, block, prefix="session-end-warmup")
            _settle(run["flow_run_id"], warmup, SETTLE_TIMEOUT_S)
    runs: dict[str, dict[str, Any]] = {}
    for position, kind in enumerate(order):
        run = runs[kind] = _run_kind(kind, results, block)
        if kind == "ours":
            run["artifacts_s"] = None
            if monitor.DEFAULT_OPTIONS.result_artifacts:
                _, found = _wait_for_result_artifacts(run["flow_run_id"], results, artifact_timeout)
                if found:
                    run["artifacts_s"] = time.perf_counter() - run["returned_at"]
        if position < len(order) - 1:
            run["settle_s"], run["settled"] = _settle(run["flow_run_id"], results, SETTLE_TIMEOUT_S)
    for run in runs.values():
        del run["returned_at"]
    return {
        "results": results,
        "backend": backend,
        "order": list(order),
        "warmup_results": warmup,
        **runs,
        "session_end_added_s": runs["ours"]["end_s"] - runs["plain"]["end_s"],
        "monitor_end_added_s": runs["ours"]["end_s"] - runs["ours_monitor_off"]["end_s"],
        "monitoring": dataclasses.asdict(monitor.DEFAULT_OPTIONS),
        "cpus": os.cpu_count(),
        "machine": machine.describe(),
    }


def _check_order(order: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``order`` names each of :data:`KINDS` once."""
    if sorted(order) != sorted(KINDS):
        raise ValueError(f"order must name each of {', '.join(KINDS)} once, comma-separated; got {', '.join(order)}")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _order(text: str) -> tuple[str, ...]:
    order = tuple(part.strip() for part in text.split(","))
    try:
        _check_order(order)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=_positive, default=1000, help="GPU tasks (results) in the flow run")
    parser.add_argument("--order", type=_order, default=KINDS,
                        help="order of the flow runs, comma-separated (default: plain,ours_monitor_off,ours)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="results of the unmeasured warm-up flow run of each kind (0: none)")
    parser.add_argument("--backend", default="cpu", help="engine block backend: cpu, spmd, dask, ray, auto")
    parser.add_argument("--artifact-timeout", type=float, default=900.0,
                        help="seconds to wait for the result artifacts after the flow run")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    for part in ("result-artifacts", "plans", "events", "summary-artifact"):
        parser.add_argument(f"--no-{part}", action="store_true", help=f"switch the monitor's {part.replace('-', ' ')} off")
    args = parser.parse_args(argv)
    monitor.DEFAULT_OPTIONS = monitor.MonitorOptions(
        result_artifacts=not args.no_result_artifacts,
        plans=not args.no_plans,
        events=not args.no_events,
        summary_artifact=not args.no_summary_artifact,
    )
    figures = measure(args.results, args.backend, args.artifact_timeout, order=args.order, warmup=args.warmup)
    text = json.dumps(figures, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
