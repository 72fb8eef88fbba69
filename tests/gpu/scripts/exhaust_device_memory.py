"""
Exhaust device memory on purpose, in its own process, and report what the user sees.

The engine gets an rmm ``LimitingResourceAdaptor`` of ``LIMIT`` bytes over
``CudaMemoryResource`` (through the block's memory-resource config), then runs a
query whose result (64M float64 rows, 512 MB) cannot fit. Prints one JSON line:
the exception class and message, rmm figures (bytes) before and after, and
whether the session still reads an earlier result and runs a small query.
Run as a file by ``tests/gpu/test_gpu_reliability.py`` (a process of its own, so
a crash in native code cannot take the test run down).
"""

from __future__ import annotations

import gc
import json

import numpy as np
import polars as pl

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.tasks import DeviceMemoryError

LIMIT = 256 * 2**20
ROWS = 64_000_000


def limited(self: CudfPolarsEngine) -> dict:
    return {
        "qualname": "rmm.mr.LimitingResourceAdaptor",
        "options": {"upstream_mr": {"qualname": "rmm.mr.CudaMemoryResource"}, "allocation_limit": LIMIT},
    }


def live_columns() -> int:
    """cudf-polars Column objects alive in this process (device data a Python object holds)."""
    from cudf_polars.containers import Column

    return sum(isinstance(o, Column) for o in gc.get_objects())


def main() -> dict:
    CudfPolarsEngine.memory_resource_config = limited  # type: ignore[method-assign]
    out: dict = {"limit": LIMIT}
    block = CudfPolarsEngine(backend="spmd", raise_on_fail=True)
    try:
        session = block.session().__enter__()
    except (TypeError, AttributeError, ValueError) as exc:  # the adaptor's API differs here
        out["start_error"] = f"{type(exc).__name__}: {exc}"
        return out
    try:
        out["at_start"] = session.memory_in_use()
        kept = session.execute(pl.LazyFrame({"k": [1, 2, 3]}), name="kept")
        big = pl.LazyFrame({"x": np.arange(ROWS, dtype=np.float64)}).with_columns(y=pl.col("x") * 2)
        for attempt in (1, 2):  # twice: whatever a failure leaves behind must not grow
            try:
                session.execute(big, name="too big")
                out["raised"] = None
            except DeviceMemoryError as exc:
                out["raised"] = "DeviceMemoryError"
                out["is_memory_error"] = isinstance(exc, MemoryError)
                out["message"] = str(exc)
                out[f"held_with_error_{attempt}"] = session.memory_in_use()  # the error still alive
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                out["raised"] = type(exc).__name__
                out["message"] = str(exc)[:4000]
            gc.collect()
            out[f"after_error_{attempt}"] = session.memory_in_use()
            out[f"live_cudf_columns_{attempt}"] = live_columns()
        out["after_error"] = out["after_error_2"]
        out["live_after_error"] = [r.name for r in session.live_results]
        out["kept_rows"] = session.collect(kept.lazy()).height
        out["small_query_rows"] = session.collect(pl.LazyFrame({"a": list(range(10))})).height
        out["at_end"] = session.memory_in_use()
    finally:
        session.close()
    out["before_shutdown"] = session.summary()["memory"]["before_shutdown"]
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
