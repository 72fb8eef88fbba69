"""
Open a session, run a GPU task, exit without closing the session (run as a file).

Writes the live result's name and id to ``ID_FILE`` (JSON) before it exits, so
the test can look for them in what the process printed.

Usage: ``python exit_without_closing.py PARQUET_PATH ID_FILE``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.tasks import execute

if __name__ == "__main__":
    session = CudfPolarsEngine(backend="cpu").session().__enter__()
    result = execute(pl.scan_parquet(sys.argv[1]), name="left live")
    Path(sys.argv[2]).write_text(json.dumps({"name": result.name, "id": result.id}))
