"""
A flow run that holds 2 GB results on the GPU under a device memory limit and admission by bytes.

Run by a process worker, several at once. The flow makes the CUDA context, reads its own
device memory as ``nvidia-smi`` lists it for this process, opens a ``spmd`` session with
``device_memory_limit`` of ``limit_gib`` GiB and ``admission_limit=limit`` (that many slots), loads
``tables`` 2 GB tables as results (after the first, it waits until three runs hold their slots, at
most 180 s, so that three hold their results together), sums them in pairs, closes the
session and reads its own device memory again. It writes ``<evidence>/<flow run id>.json``: the pid, wall-clock times
(``started``, ``admitted``: after the first result exists; ``ended``: after the session
closed, its slots given back), the sums, the session summary's held and timing figures,
and the device memory figures (MiB).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import polars as pl
from prefect import flow
from prefect.context import FlowRunContext

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task

GIB = 1 << 30
ROWS = 125_000_000  # int64 and float64 columns: 2,000,000,000 bytes a table


def own_device_mib() -> int | None:
    """This process's device memory as ``nvidia-smi`` lists it (MiB); None when its pid is not listed."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    rows = dict(line.split(",") for line in out.splitlines() if line.strip())
    mib = {int(pid): int(used) for pid, used in rows.items()}
    return mib.get(os.getpid())


def together(evidence: Path, runs: int, timeout_s: float = 180.0) -> None:
    """Mark this run admitted, then wait until ``runs`` runs are (or ``timeout_s`` seconds pass)."""
    (evidence / f"admitted-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(evidence.glob("admitted-*"))) < runs and time.monotonic() < deadline:
        time.sleep(0.1)


@gpu_task
def pair_sum(a: GPUResult, b: GPUResult) -> pl.LazyFrame:
    return pl.concat([a.lazy(), b.lazy()]).select(pl.col("v").sum(), pl.len())


@flow
def hold_gpu_memory(evidence: str, limit: str, limit_gib: int, tables: int) -> None:
    """Hold ``tables`` 2 GB results under a ``limit_gib`` GiB limit admitted through ``limit``; write the figures."""
    import rmm.mr

    facts: dict[str, object] = {"pid": os.getpid(), "started": time.time(),
                                "flow_run_id": str(FlowRunContext.get().flow_run.id)}
    rmm.mr.available_device_memory()  # the CUDA context
    facts["own_mib_with_context"] = own_device_mib()
    base = pl.DataFrame({"k": np.arange(ROWS, dtype=np.int64)})
    block = CudfPolarsEngine(backend="spmd", device_memory_limit=limit_gib * GIB, admission_limit=limit,
                             admission_timeout=900, spill_results="host")
    with block.session() as session:
        held = [execute(base.lazy().with_columns(v=pl.lit(float(i))), name=f"table-{i}") for i in range(1)]
        facts["admitted"] = time.time()
        together(Path(evidence), 3)
        held += [execute(base.lazy().with_columns(v=pl.lit(float(i))), name=f"table-{i}") for i in range(1, tables)]
        facts["own_mib_holding"] = own_device_mib()
        facts["sums"] = [list(collect(pair_sum(held[i], held[i + 1])).row(0)) for i in range(0, tables, 2)]
        summary = session.summary()
    facts["ended"] = time.time()
    facts["own_mib_after"] = own_device_mib()
    facts["held"] = {k: summary["held"][k] for k in ("limit", "peak_held", "spills")}
    facts["timings"] = summary["timings"]
    facts["rmm_peak_bytes"] = summary["peak_memory"]
    partial = Path(evidence) / f"{facts['flow_run_id']}.partial"
    partial.write_text(json.dumps(facts))
    partial.rename(partial.with_suffix(".json"))
