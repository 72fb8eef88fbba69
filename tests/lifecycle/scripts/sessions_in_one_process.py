"""
Four ``spmd`` flow runs in one process, each leaving two 1.6 GB results unconsumed (run as a file).

Automatic garbage collection is off, so only reference counting frees what a session
leaves. After each flow run the CUDA driver's used device memory (``cudaMemGetInfo``
through ``rmm.mr.available_device_memory``: total - free, bytes) is read once it stops
falling (freed pools go back to the driver as their last references go). Prints one
``RESULT {json}`` line.
"""

from __future__ import annotations

import gc
import json
import time

import numpy as np
import polars as pl
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import execute

RUNS = 4
#: 100M float64 rows, two columns: 1.6 GB per result.
ROWS = 100_000_000
SETTLE_S = 15.0


def driver_used() -> int:
    import rmm.mr

    free, total = rmm.mr.available_device_memory()
    return int(total - free)


def settled_driver_used() -> int:
    """The driver's figure once two readings 0.5 s apart agree within 1 MiB (at most SETTLE_S)."""
    deadline = time.monotonic() + SETTLE_S
    last = driver_used()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = driver_used()
        if abs(now - last) <= 2**20:
            return now
        last = now
    return last


ends: list = []


@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd", raise_on_fail=True)))
def leaves_two_results() -> None:
    ends.append(get_engine_session())
    x = np.arange(ROWS, dtype=np.float64)
    for i in range(2):
        execute(pl.LazyFrame({"x": x}).with_columns(y=pl.col("x") * (i + 2)), name=f"left {i}")


def main() -> dict:
    gc.disable()
    out: dict = {"rows": ROWS, "driver_used_at_start": driver_used(), "driver_used_after_run": [], "rmm_at_end": []}
    for _ in range(RUNS):
        leaves_two_results()
        session = ends.pop()
        out["rmm_at_end"].append(session.summary()["memory"]["at_end"])
        del session
        out["driver_used_after_run"].append(settled_driver_used())
        print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
