"""
A flow run whose engine holds admission slots, then waits to be stopped (run by a process worker).

The flow opens a ``cpu`` session with ``device_memory_limit`` 4 GiB and
``admission_limit=limit`` (so it holds 4 slots of that global concurrency
limit), produces one result with the ``execute`` task, writes
``<evidence>/ready.json`` (pid, flow run id) and sleeps in the flow body until
the test cancels it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import polars as pl
from prefect import flow
from prefect.context import FlowRunContext

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.tasks import execute


@flow
def admitted_hold(evidence: str, path: str, limit: str, wait_s: float = 120.0) -> None:
    """Hold 4 slots of ``limit`` with a live result, then wait to be stopped."""
    block = CudfPolarsEngine(backend="cpu", device_memory_limit=4 << 30, admission_limit=limit)
    with block.session():
        kept = execute(pl.scan_parquet(path), name="kept")
        ready = Path(evidence) / "ready.json.partial"
        ready.write_text(json.dumps({"pid": os.getpid(), "flow_run_id": str(FlowRunContext.get().flow_run.id),
                                     "state": kept.state}))
        ready.rename(ready.with_suffix(""))  # appears whole
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
