"""
Start a process with multiprocessing's spawn method, then end a session with SIGTERM (run as a file).

The spawned process starts multiprocessing's resource tracker, as distributed's
``LocalCUDACluster`` does on ``dask``; the session then ends as a cancelled flow
run's does (Prefect's ``TerminationSignal``), and the process exits with 143.

Writes the session's summary (JSON) to ``SUMMARY_FILE`` before it exits.

Usage: ``python terminated_after_spawning.py PARQUET_PATH SUMMARY_FILE``
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import sys
from pathlib import Path

import polars as pl
from prefect.exceptions import TerminationSignal

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.tasks import execute


def child() -> None:
    """A spawned process that does nothing."""


if __name__ == "__main__":
    spawned = multiprocessing.get_context("spawn").Process(target=child)
    spawned.start()
    spawned.join()
    try:
        with CudfPolarsEngine(backend="cpu").session() as session:
            execute(pl.scan_parquet(sys.argv[1]), name="left live")
            raise TerminationSignal(signal=signal.SIGTERM)
    except TerminationSignal:
        Path(sys.argv[2]).write_text(json.dumps(session.summary(), default=str))
        sys.exit(143)
