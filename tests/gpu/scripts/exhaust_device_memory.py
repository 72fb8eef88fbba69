"""
Exhaust device memory on purpose, in its own process, and report what the user sees.

The engine gets an rmm ``LimitingResourceAdaptor`` of ``LIMIT`` bytes over
``CudaMemoryResource`` (no pool: a free goes back to the driver, so
``cudaMemGetInfo`` sees it), then runs, twice, a query whose result (64M
float64 rows, 512 MB) cannot fit. Prints one ``RESULT {json}`` line with rmm's
figures (bytes) around the failures, the free device memory (bytes) before the
engine starts and after it shut down, and whether earlier results survive.

Modes (first argument):

``ours``
    Through our engine session (the error, its message, nothing lost).
``alone``
    The same queries on cudf-polars' ``SPMDEngine`` with the same options and
    no prefect-cudf-polars code in the call path: what cudf-polars itself
    leaves allocated after an out-of-memory failure.
``control``
    Our session with the small queries only: the free-memory baseline
    (CUDA loads kernels lazily, which takes device memory too).

Run as a file by ``tests/gpu/test_gpu_reliability.py`` (a process of its own,
so a crash in native code cannot take the test run down).
"""

from __future__ import annotations

import gc
import json
import sys

import numpy as np
import polars as pl

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.blocks.backends.compat import rank_reading

def rank_allocated_bytes():
    return rank_reading()[0]
from prefect_cudf_polars.tasks import DeviceMemoryError

LIMIT = 256 * 2**20
ROWS = 64_000_000


def limited(self: CudfPolarsEngine) -> dict:
    return {
        "qualname": "rmm.mr.LimitingResourceAdaptor",
        "options": {"upstream_mr": {"qualname": "rmm.mr.CudaMemoryResource"}, "allocation_limit": LIMIT},
    }


def free_device_bytes() -> int:
    import rmm.mr

    return int(rmm.mr.available_device_memory()[0])


def live_columns() -> int:
    """cudf-polars Column objects alive in this process (device data a Python object holds)."""
    from cudf_polars.containers import Column

    return sum(isinstance(o, Column) for o in gc.get_objects())


def too_big() -> pl.LazyFrame:
    return pl.LazyFrame({"x": np.arange(ROWS, dtype=np.float64)}).with_columns(y=pl.col("x") * 2)


def fail_twice(out: dict, execute, memory) -> None:
    """Run the query that cannot fit twice: what a failure leaves must not grow."""
    for attempt in (1, 2):
        try:
            execute(too_big())
            out["raised"] = None
        except MemoryError as exc:  # any other error ends the script: the test shows its traceback
            out["raised"] = type(exc).__name__
            out["message"] = str(exc)[:4000]
            # The error still alive. Garbage the failure left in reference cycles (freed by
            # gc.collect(), reachable from nothing, so not held by the error) is collected
            # first, as below, so the two figures differ only by what the error holds.
            before_gc = memory()
            gc.collect()
            out[f"held_with_error_{attempt}"] = memory()
            out[f"freed_by_gc_with_error_{attempt}"] = before_gc - out[f"held_with_error_{attempt}"]
        gc.collect()
        out[f"after_error_{attempt}"] = memory()
        out[f"live_cudf_columns_{attempt}"] = live_columns()


def ours(out: dict, *, fail: bool) -> None:
    block = CudfPolarsEngine(backend="spmd", raise_on_fail=True)
    session = block.session().__enter__()
    try:
        out["at_start"] = session.memory_in_use()
        kept = session.execute(pl.LazyFrame({"k": [1, 2, 3]}), name="kept")
        if fail:
            fail_twice(out, lambda lf: session.execute(lf, name="too big"), session.memory_in_use)
            out["live_after_error"] = [r.name for r in session.live_results]
        out["kept_rows"] = session.collect(kept.lazy()).height
        out["small_query_rows"] = session.collect(pl.LazyFrame({"a": list(range(10))})).height
        out["at_end"] = session.memory_in_use()
    finally:
        session.close()
    out["at_end"] = session.summary()["memory"]["at_end"]


def alone(out: dict) -> None:
    from cudf_polars.engine.spmd import SPMDEngine

    from prefect_cudf_polars.blocks.backends.streaming import silence_unstable_warning

    silence_unstable_warning()
    with SPMDEngine(**CudfPolarsEngine(backend="spmd", raise_on_fail=True).engine_kwargs()) as engine:
        out["at_start"] = rank_allocated_bytes()
        kept = engine.execute(pl.LazyFrame({"k": [1, 2, 3]}))
        fail_twice(out, engine.execute, rank_allocated_bytes)
        out["kept_rows"] = kept.lazy().collect(engine=engine).height
        out["at_end"] = rank_allocated_bytes()


def main(mode: str) -> dict:
    CudfPolarsEngine.memory_resource_config = limited  # type: ignore[method-assign]
    out: dict = {"mode": mode, "limit": LIMIT, "free_before_engine": free_device_bytes()}
    if mode == "alone":
        alone(out)
    else:
        ours(out, fail=mode == "ours")
    gc.collect()
    out["free_after_shutdown"] = free_device_bytes()
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "ours")), flush=True)
