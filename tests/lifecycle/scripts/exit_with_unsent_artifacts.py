"""
A flow run whose result artifacts the Prefect API has not taken when the process exits (run as a file).

The flow run produces ``RESULTS`` results while every artifact write waits
``BLOCKED_WRITE_S`` seconds before it reaches the API (an API that does not
answer), and the exit drain is short (``EXIT_DRAIN_S``), so the records are
still unsent when the interpreter exits. Prints the time the flow run returned
(``time.time()``), so the test can bound the exit.

Usage: ``python exit_with_unsent_artifacts.py``
"""

from __future__ import annotations

import asyncio
import time

import polars as pl
from prefect import flow
from prefect.client.orchestration import PrefectClient

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.blocks.session import exit_hook
from prefect_cudf_polars.tasks import execute

RESULTS = 40
BLOCKED_WRITE_S = 120.0


@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
def many_results() -> int:
    for i in range(RESULTS):
        execute(pl.LazyFrame({"k": [i]}), name=f"r{i}")
    return RESULTS


if __name__ == "__main__":
    send = PrefectClient.request

    async def blocked_send(self, method, path, *args, **kwargs):
        if method == "POST" and path == "/artifacts/":
            await asyncio.sleep(BLOCKED_WRITE_S)
        return await send(self, method, path, *args, **kwargs)

    PrefectClient.request = blocked_send  # an API that does not answer, for the writer's client only
    exit_hook.EXIT_DRAIN_S = 1.0
    print("flow run returned", many_results(), "at", time.time(), flush=True)
