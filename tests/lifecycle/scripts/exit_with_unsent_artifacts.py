"""
A flow run whose result artifacts the Prefect API has not taken when the process exits (run as a file).

The flow run produces ``RESULTS`` results; then the API is made slow for the
writer (each artifact write waits ``SLOW_WRITE_S`` first) and the exit drain
short (``EXIT_DRAIN_S``), so most artifacts are still unsent when the
interpreter exits, the case of a flow run with many results on a busy API.

Usage: ``python exit_with_unsent_artifacts.py``
"""

from __future__ import annotations

import asyncio

import polars as pl
from prefect import flow
from prefect.client.orchestration import PrefectClient

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.blocks.session import exit_hook
from prefect_cudf_polars.tasks import execute

RESULTS = 40
SLOW_WRITE_S = 0.3


@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
def many_results() -> int:
    for i in range(RESULTS):
        execute(pl.LazyFrame({"k": [i]}), name=f"r{i}")
    return RESULTS


if __name__ == "__main__":
    send = PrefectClient.request

    async def slow_send(self, method, path, *args, **kwargs):
        if method == "POST" and path == "/artifacts/":
            await asyncio.sleep(SLOW_WRITE_S)
        return await send(self, method, path, *args, **kwargs)

    PrefectClient.request = slow_send  # a busy API, for the writer's client only
    exit_hook.EXIT_DRAIN_S = 1.0
    print("flow run returned", many_results(), flush=True)
