"""
Open a session on an external GPU cluster, keep a result, then wait to be killed.

``python gpu_session_holder.py BACKEND ADDRESS PARQUET_GLOB PARTITION_BYTES``:
``BACKEND`` is ``dask`` (``ADDRESS`` is the scheduler) or ``ray`` (``ADDRESS`` is
the head's ``host:port``). Executes a filter over the parquet files, keeps the
result on the ranks, prints one line ``READY {json}`` (ranks holding the result,
rmm bytes allocated per rank, the cluster; for dask the engine uid, for ray the
rank actors' process ids) and sleeps; the session is never closed. Run by
``tests/gpu/test_gpu_dask.py`` and ``tests/gpu/test_gpu_ray.py``, which SIGKILL it
and check that the cluster drops the result (the lease in ``blocks/backends/dask/lease.py``;
Ray's ending of a dead driver's actors).
"""

from __future__ import annotations

import json
import os
import sys
import time

import polars as pl

from prefect_cudf_polars.blocks import CudfPolarsEngine


def main(backend: str, address: str, path: str, partition_bytes: int) -> None:
    where = {"dask": "dask_scheduler_address", "ray": "ray_address"}[backend]
    block = CudfPolarsEngine(backend=backend, target_partition_size=partition_bytes, **{where: address})
    session = block.session().__enter__()
    kept = session.execute(pl.scan_parquet(path).filter(pl.col("y") < 50), name="kept")
    running = session.running_engine
    ready = {
        "ranks": sorted(kept.ranks),
        "rmm_per_rank": session.run(lambda: list(running.read().per_rank)),
        "cluster": session.description["cluster"],
    }
    if backend == "dask":
        ready["uid"] = session.run(lambda: running.engine._dask_ctx.rapidsmpf_id)
    else:
        ready["actor_pids"] = session.run(lambda: running.engine._run(os.getpid))
    print("READY " + json.dumps(ready), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
