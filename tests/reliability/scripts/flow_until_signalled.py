"""
A flow run that holds GPU results and waits to be stopped (run as a file by the teardown tests).

It runs on the backend named by ``PREFECT_CUDF_POLARS_TEST_BACKEND`` (``cpu``
unless set), produces three results, consumes one, writes
``<evidence>/ready.json`` (pid, flow run id) and sleeps in the flow body. The
test then stops it (SIGTERM, or a cancellation through the API). Every line of
the ``prefect.flow_runs`` logger is also written to ``<evidence>/flow.log``
synchronously, so the session's end line survives even if the process ends
before Prefect's API log handler flushes.

Usage: ``python flow_until_signalled.py EVIDENCE_DIR PARQUET_PATH``
"""

from __future__ import annotations

import atexit
import datetime
import faulthandler
import json
import logging
import os
import sys
import time
from pathlib import Path

import polars as pl
from prefect import flow
from prefect.context import FlowRunContext

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import collect, execute


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids.extend(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:  # the thread ended while we looked
            continue
    return pids


def _log_to(evidence: Path) -> None:
    handler = logging.FileHandler(evidence / "flow.log")
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(message)s", "%H:%M:%S"))
    logging.getLogger("prefect.flow_runs").addHandler(handler)
    # The last exit hook to run: when the interpreter got there (a slow exit shows in flow.log).
    atexit.register(_exit_mark, evidence / "flow.log")


def _exit_mark(path: Path) -> None:
    with path.open("a") as log:
        log.write(datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3] + " interpreter at its exit hooks\n")


#: Seconds after ready.json until the threads' stacks are dumped (then again each period).
STACKS_AFTER_S = 15

#: The backend, from the environment (a worker's flow-run process inherits it).
BACKEND = os.environ.get("PREFECT_CUDF_POLARS_TEST_BACKEND", "cpu")


@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend=BACKEND, raise_on_fail=True)))
def hold_results(evidence: str, path: str, wait_s: float = 120.0) -> int:
    """Produce three results, consume one, then wait to be stopped."""
    _log_to(Path(evidence))
    kept = [execute(pl.scan_parquet(path), name=f"kept-{i}") for i in range(2)]
    used = execute(pl.scan_parquet(path), name="used")
    rows = collect(used).height
    ctx = FlowRunContext.get()
    session = get_engine_session()
    ready = Path(evidence) / "ready.json.partial"
    ready.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "flow_run_id": str(ctx.flow_run.id),
                "rows": rows,
                "live": [r.state for r in kept],
                "host_store_partitions": held_partitions(),
                "memory_at_start": session.memory["at_start"],
                "memory_held": session.memory_in_use(),
                "children": _children(),
            }
        )
    )
    ready.rename(ready.with_suffix(""))  # appears whole
    # If this process is still alive well after the test stopped it, its threads'
    # stacks go to stacks.txt (for the failing test's message).
    faulthandler.dump_traceback_later(STACKS_AFTER_S, repeat=True, file=(Path(evidence) / "stacks.txt").open("w"))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return rows


if __name__ == "__main__":
    hold_results(sys.argv[1], sys.argv[2])
