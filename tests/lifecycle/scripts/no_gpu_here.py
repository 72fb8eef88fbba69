"""
Two flow runs on a ``backend="spmd"`` block in a process that sees no GPU (run as a file).

The test starts it with ``CUDA_VISIBLE_DEVICES=""``, so it behaves the same on a
machine with GPUs. ``<prefix>-gpu-task`` runs one GPU task; ``<prefix>-no-gpu-task``
runs none. Prints one ``OUTCOME {json}`` line per flow run: what its call returned
or raised.

Usage: ``python no_gpu_here.py PREFIX``
"""

from __future__ import annotations

import json
import sys

import polars as pl
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import collect, execute

RUNNER = CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd"))


def gpu_task_flow() -> int:
    return collect(execute(pl.LazyFrame({"a": [1, 2, 3]}))).height


def plain_flow() -> int:
    return 42


def outcome(fn, name: str) -> dict:
    try:
        return {"flow": name, "returned": flow(name=name, task_runner=RUNNER)(fn)()}
    except Exception as exc:  # reported to the test
        return {"flow": name, "raised": type(exc).__name__, "message": str(exc)}


if __name__ == "__main__":
    prefix = sys.argv[1]
    for fn, suffix in ((gpu_task_flow, "gpu-task"), (plain_flow, "no-gpu-task")):
        print("OUTCOME " + json.dumps(outcome(fn, f"{prefix}-{suffix}")), flush=True)
