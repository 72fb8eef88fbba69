"""
A flow run that holds GPU results and waits to be stopped (run as a file by the teardown tests).

It runs on the cpu backend, produces three results, consumes one, writes
``<evidence>/ready.json`` (pid, flow run id) and sleeps in the flow body. The
test then stops it (SIGTERM, or a cancellation through the API). Every line of
the ``prefect.flow_runs`` logger is also written to ``<evidence>/flow.log``
synchronously, so the session's end line survives even if the process ends
before Prefect's API log handler flushes.

Usage: ``python flow_until_signalled.py EVIDENCE_DIR PARQUET_PATH``
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import polars as pl
from prefect import flow
from prefect.context import FlowRunContext

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, host_store
from prefect_cudf_polars.tasks import collect, execute


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        text = (task / "children").read_text().split()
        pids.extend(int(p) for p in text)
    return pids


def _log_to(evidence: Path) -> None:
    handler = logging.FileHandler(evidence / "flow.log")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("prefect.flow_runs").addHandler(handler)


@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
def hold_results(evidence: str, path: str, wait_s: float = 120.0) -> int:
    """Produce three results, consume one, then wait to be stopped."""
    _log_to(Path(evidence))
    kept = [execute(pl.scan_parquet(path), name=f"kept-{i}") for i in range(2)]
    used = execute(pl.scan_parquet(path), name="used")
    rows = collect(used).height
    ctx = FlowRunContext.get()
    (Path(evidence) / "ready.json").write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "flow_run_id": str(ctx.flow_run.id),
                "rows": rows,
                "live": [r.state for r in kept],
                "host_store_partitions": host_store.total_partitions(),
                "children": _children(),
            }
        )
    )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return rows


if __name__ == "__main__":
    hold_results(sys.argv[1], sys.argv[2])
