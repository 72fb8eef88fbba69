"""
Start an owned Dask cluster the way the ``dask`` backend does, report its processes, wait (run as a file).

A ``distributed.LocalCluster`` with process workers stands in for ``LocalCUDACluster``
(the same nanny and worker-process machinery). Prints one ``READY {json}`` line: this
process's pid and process group, and each worker process's pid and process group.

Usage: ``python owned_dask_cluster.py``
"""

from __future__ import annotations

import json
import os
import time

from distributed import LocalCluster

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.blocks.backends.dask.cluster import connect


def local_cluster(_block):
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")


if __name__ == "__main__":
    connection = connect(CudfPolarsEngine(backend="dask"), start_cluster=local_cluster)
    pids = connection.client.run(os.getpid)
    groups = connection.client.run(os.getpgid, 0)
    print(
        "READY "
        + json.dumps(
            {
                "pid": os.getpid(),
                "pgid": os.getpgid(0),
                "workers": sorted(pids.values()),
                "worker_groups": sorted(groups.values()),
            }
        ),
        flush=True,
    )
    time.sleep(600)
