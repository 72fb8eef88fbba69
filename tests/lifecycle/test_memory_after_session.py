"""
An ended session gives its memory back without Python's garbage collector.

CPU: with automatic garbage collection off, each flow run's session, its results and the
cpu backend's engine and store are freed by reference counting alone when the run ends
(nothing of ours survives from one run to the next).

GPU (``spmd``): four flow runs in one process (``scripts/sessions_in_one_process.py``, a
process of its own with automatic collection off), each leaving two 1.6 GB results
unconsumed. The CUDA driver's used device memory (``cudaMemGetInfo``) after flow run N is
within 256 MiB of its figure after run N-1, for N = 2, 3, 4. Sessions are compared with
each other, not with the process start: the CUDA context and the kernels loaded by the
first run stay for the process's life.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from prefect import flow
from prefect.settings import PREFECT_API_URL

from prefect_cudf_polars.blocks import CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import collect, execute

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


def test_a_sessions_end_says_its_engine_was_freed_by_reference_counting(cpu_block, orders):
    with cpu_block.session() as session:
        session.execute(pl.scan_parquet(orders), name="left live")
    assert session.summary()["engine_freed"] == "by reference counting"


def test_an_ended_sessions_objects_are_freed_by_reference_counting(cpu_block, orders):
    sessions: list[weakref.ref] = []

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def leaves_two_results() -> int:
        sessions.append(weakref.ref(get_engine_session()))
        execute(pl.scan_parquet(orders), name="left 1")
        execute(pl.scan_parquet(orders), name="left 2")
        return collect(execute(pl.scan_parquet(orders))).height

    # A first run starts Prefect's background services (they keep the context they started in).
    assert leaves_two_results() == 1000
    gc.collect()
    gc.disable()
    try:
        before = ours_alive()
        for run in (1, 2, 3):
            assert leaves_two_results() == 1000
            session = sessions[-1]()
            holders = [type(r).__qualname__ for r in gc.get_referrers(session)] if session else []
            del session
            assert sessions[-1]() is None, f"run {run}: the ended session is still held by {holders}"
            grown = ours_alive() - before
            assert not grown, f"run {run} left these objects of ours alive: {dict(grown)}"
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
    figure("rmm_before_shutdown_bytes", out["rmm_before_shutdown"])
    figure("engine_freed", out["engine_freed"])
    assert len(used) == 4, out
    # How each session's engine was freed: "by reference counting", or "by gc.collect()" when a
    # reference cycle inside the engine forced the session's fallback (printed above).
    for n in (2, 3, 4):
        grew = used[n - 1] - used[n - 2]
        assert grew <= SESSION_SLACK, (
            f"after flow run {n} the driver's used device memory is {grew / 2**20:,.0f} MiB above "
            f"its figure after run {n - 1} (bytes after each run: {used}; rmm's figure at each "
            f"session's end: {out['rmm_before_shutdown']})"
        )
