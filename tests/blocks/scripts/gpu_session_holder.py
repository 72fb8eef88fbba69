"""
Open a ``dask`` session on an external GPU cluster, keep a result, then wait to be killed.

``python gpu_session_holder.py SCHEDULER PARQUET_GLOB PARTITION_BYTES``: executes a
filter over the parquet files and keeps the result on the workers, prints one
line ``READY {json}`` (engine uid, ranks holding the result, rmm bytes allocated
per rank) and sleeps; the session is never closed. Run by
``tests/gpu/test_gpu_dask.py``, which SIGKILLs it and checks that the cluster's
lease (``blocks/dask_lease.py``) drops the result.
"""

from __future__ import annotations

import json
import sys
import time

import polars as pl

from prefect_cudf_polars.blocks import CudfPolarsEngine


def main(address: str, path: str, partition_bytes: int) -> None:
    block = CudfPolarsEngine(
        backend="dask", dask_scheduler_address=address, target_partition_size=partition_bytes
    )
    session = block.session().__enter__()
    kept = session.execute(pl.scan_parquet(path).filter(pl.col("y") < 50), name="kept")
    running = session._running
    ready = {
        "uid": session.run(lambda: running.engine._dask_ctx.rapidsmpf_id),
        "ranks": sorted(kept.ranks),
        "rmm_per_rank": session.run(running.memory_per_rank),
        "cluster": running.extra_description["cluster"],
    }
    print("READY " + json.dumps(ready), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
