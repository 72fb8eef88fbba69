"""
Start a process with multiprocessing's spawn method, then SIGTERM a flow run on a session (run as a file).

The spawned process starts multiprocessing's resource tracker, as distributed's
``LocalCUDACluster`` does on ``dask``. The flow run then signals its own process with
SIGTERM, as a Prefect worker cancelling it does: Prefect raises ``TerminationSignal``,
the task runner's session ends as a cancelled flow run's does (its end line in the
output), and Prefect 3.9 then ends the process with SIGTERM again.

Usage: ``python terminated_after_spawning.py PARQUET_PATH``
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import polars as pl
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import execute


def child() -> None:
    """A spawned process that does nothing."""


@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
def signalled(path: str) -> None:
    execute(pl.scan_parquet(path), name="left live")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)  # the signal ends the flow run first


if __name__ == "__main__":
    spawned = multiprocessing.get_context("spawn").Process(target=child)
    spawned.start()
    spawned.join()
    signalled(sys.argv[1])
