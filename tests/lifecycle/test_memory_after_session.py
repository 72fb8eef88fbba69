"""
An ended session gives its memory back without Python's garbage collector.

CPU: with automatic garbage collection off, an ended session (a ``with block.session():`` or a
flow run's) and the cpu backend's engine and store are freed by reference counting alone; the
result handles its caller or Prefect still keeps are released and hold nothing. Objects a failed
query left in reference cycles are collected when the session ends.

GPU (``spmd``): four flow runs in one process (``scripts/sessions_in_one_process.py``, a
process of its own with automatic collection off), each leaving two 1.6 GB results
unconsumed. The CUDA driver's used device memory (``cudaMemGetInfo``) after flow run N is
within 256 MiB of its figure after run N-1, for N = 2, 3, 4. Sessions are compared with
each other, not with the process start: the CUDA context and the kernels loaded by the
first run stay for the process's life.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from prefect import flow
from prefect.settings import PREFECT_API_URL

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session, telemetry
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import GPUResult, collect, execute

SCRIPT = Path(__file__).parent / "scripts" / "sessions_in_one_process.py"
#: Bytes of device memory, as the CUDA driver reports it, that an engine session's end may
#: leave above the figure after the previous engine session in the same process.
SESSION_SLACK = 256 * 2**20


def ours_alive() -> Counter:
    """Live instances of classes defined in prefect_cudf_polars, by class name (without collecting)."""
    found: Counter = Counter()
    for o in gc.get_objects():
        module = type(o).__dict__.get("__module__") if not isinstance(o, type) else None
        if isinstance(module, str) and module.startswith("prefect_cudf_polars"):
            found[type(o).__qualname__] += 1
    return found


def wait_for_session_events(session_id: str, timeout: float = 30.0) -> list[str]:
    """
    The names of the events of engine session ``session_id`` the API holds, once its ``engine.stopped`` is there.

    Prefect's EventsWorker keeps a copy of the sender's context with each queued event
    until it sends it; a session's events are sent inside its ``with`` block's context.
    """
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventResourceFilter

    flt = EventFilter(resource=EventResourceFilter(id=[f"prefect-cudf-polars.engine-session.{session_id}"]))
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            names = [e.event for e in client.read_events(filter=flt, limit=50).events]
        if telemetry.ENGINE_STOPPED in names or time.monotonic() > deadline:
            return names
        time.sleep(0.25)


@contextlib.contextmanager
def collector_off(block, orders) -> Iterator[None]:
    """
    Automatic garbage collection off, after a first session and a collection.

    The first session starts Prefect's events worker (it keeps the context it started in).
    """
    with block.session() as first:
        first.execute(pl.scan_parquet(orders), name="warm-up")
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_an_ended_session_and_its_engine_are_freed_by_reference_counting_and_kept_handles_hold_nothing(
    cpu_block, orders
):
    with collector_off(cpu_block, orders):
        with cpu_block.session() as session:
            engine = weakref.ref(session.running_engine)
            left = session.execute(pl.scan_parquet(orders), name="left live")
            read = session.execute(pl.scan_parquet(orders), name="read")
            assert session.collect(read).height == 1000
            assert held_partitions() == 1
        ended, summary = weakref.ref(session), session.summary()
        del session
        assert engine() is None, "the ended session's engine is still alive without the garbage collector"
        assert telemetry.ENGINE_STOPPED in wait_for_session_events(summary["session_id"])
        assert ended() is None, "the ended session is still alive without the garbage collector"
        # The handles the caller kept are still there: released or consumed, holding nothing.
        assert (left.state, read.state) == ("released", "consumed")
        assert not left.holding and left.persisted is None and left.lineage is None
        assert not read.holding and read.persisted is None
        assert held_partitions() == 0
    assert summary["counts"] == {"produced": 2, "consumed": 1, "released_unconsumed": 1}
    assert summary["memory"] == {"at_start": 0, "at_end": pl.read_parquet(orders).estimated_size()}
    assert summary["teardown"] == "complete"
    assert summary["shutdown_thread"].startswith("cudf-polars-engine-owner-")


class Cycle:
    """An object that refers to itself: freed only by the garbage collector."""

    def __init__(self) -> None:
        self.me = self


def test_what_a_failed_query_left_in_reference_cycles_is_freed_when_its_session_ends(orders):
    left: list[weakref.ref] = []

    def fails(df: pl.DataFrame) -> pl.DataFrame:  # as a failing GPU query leaves objects in cycles
        left.append(weakref.ref(Cycle()))
        raise ValueError("the query failed")

    block = CudfPolarsEngine(backend="cpu", raise_on_fail=False)  # a Python function runs in the query
    with collector_off(block, orders):
        with block.session() as session:
            with pytest.raises(ValueError, match="the query failed"):
                session.collect(pl.scan_parquet(orders).map_batches(fails))
            assert left and left[0]() is not None  # the cycle outlives the failed call
        assert left[0]() is None, "the failed query's cycle is still alive after its session ended"


#: What of ours may outlive a flow run while Prefect keeps its states and contexts: the handles the
#: flow run returned, what they keep of their ended session, and the flow's task runner.
KEPT_BY_PREFECT = {"GPUResult", "EndedSession", "CudfPolarsTaskRunner"}


def test_each_flow_runs_session_and_engine_are_freed_by_reference_counting_and_kept_handles_hold_nothing(
    cpu_block, orders, flow_heartbeats
):
    sessions: list[weakref.ref] = []
    engines: list[weakref.ref] = []

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def leaves_two_results() -> tuple[int, list[GPUResult]]:
        session = get_engine_session()
        sessions.append(weakref.ref(session))
        engines.append(weakref.ref(session.running_engine))
        left = [execute(pl.scan_parquet(orders), name="left 1"), execute(pl.scan_parquet(orders), name="left 2")]
        return collect(execute(pl.scan_parquet(orders))).height, left

    # A first run starts Prefect's background services (they keep the context they started in).
    assert leaves_two_results()[0] == 1000
    gc.collect()
    gc.disable()
    try:
        before = ours_alive()
        for run in (1, 2, 3):
            state = leaves_two_results(return_state=True)
            height, left = state.result()
            assert height == 1000
            assert engines[-1]() is None, f"run {run}: the ended session's engine is still alive"
            session = sessions[-1]()
            holders = [type(r).__qualname__ for r in gc.get_referrers(session)] if session else []
            del session
            assert sessions[-1]() is None, f"run {run}: the ended session is still held by {holders}"
            # The handles the flow run returned (Prefect keeps them in its state) hold nothing.
            assert [r.state for r in left] == ["released", "released"]
            assert not any(r.holding or r.persisted is not None or r.lineage is not None for r in left)
            assert held_partitions() == 0
            del state, left
            grown = ours_alive() - before
            assert set(grown) <= KEPT_BY_PREFECT, f"run {run} left these objects of ours alive: {dict(grown)}"
            kept = [o for o in gc.get_objects() if isinstance(o, GPUResult)]
            assert not any(r.holding for r in kept), f"run {run}: a handle still holds partitions or a plan"
            del kept
    finally:
        gc.enable()


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_driver_memory_after_each_session_in_one_process_comes_back(figure):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        capture_output=True, text=True, timeout=840,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    out = json.loads(lines[-1][len("RESULT "):])
    used = out["driver_used_after_run"]
    figure("driver_used_after_run_bytes", used)
    figure("rmm_at_end_bytes", out["rmm_at_end"])
    assert len(used) == 4, out
    for n in (2, 3, 4):
        grew = used[n - 1] - used[n - 2]
        assert grew <= SESSION_SLACK, (
            f"after flow run {n} the driver's used device memory is {grew / 2**20:,.0f} MiB above "
            f"its figure after run {n - 1} (bytes after each run: {used}; rmm's figure at each "
            f"session's end: {out['rmm_at_end']})"
        )
