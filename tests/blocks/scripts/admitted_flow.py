"""
A flow run whose engine holds admission slots, then waits to be stopped (run by a process worker).

The flow writes ``<evidence>/started.json`` (pid, flow run id), opens a ``cpu``
session with ``device_memory_limit`` 4 GiB and ``admission_limit=limit`` (so it
holds 4 slots of that global concurrency limit, once they are free), produces
one result with the ``execute`` task, writes ``<evidence>/ready.json`` (pid,
flow run id, the result's state) and sleeps in the flow body until the test
cancels it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import polars as pl
from prefect import flow
from prefect.context import FlowRunContext

from prefect_cudf_polars.blocks import CudfPolarsEngine, admission
from prefect_cudf_polars.tasks import execute


@flow
def admitted_hold(evidence: str, path: str, limit: str, wait_s: float = 120.0,
                  request_slice_s: float | None = None) -> None:
    """Hold 4 slots of ``limit`` with a live result, then wait to be stopped (asking for the slots in
    requests of ``request_slice_s`` seconds, if given)."""
    if request_slice_s is not None:
        admission.REQUEST_SLICE_S = request_slice_s
    flow_run_id = str(FlowRunContext.get().flow_run.id)
    _write(Path(evidence) / "started.json", {"pid": os.getpid(), "flow_run_id": flow_run_id})
    block = CudfPolarsEngine(backend="cpu", device_memory_limit=4 << 30, admission_limit=limit)
    with block.session():
        kept = execute(pl.scan_parquet(path), name="kept")
        _write(Path(evidence) / "ready.json", {"pid": os.getpid(), "flow_run_id": flow_run_id, "state": kept.state})
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            time.sleep(0.1)


def _write(path: Path, facts: dict[str, object]) -> None:
    """Write ``facts`` as JSON to ``path``, which appears whole."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(facts))
    partial.rename(path)
