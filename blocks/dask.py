"""
The ``dask`` backend: cudf-polars' ``DaskEngine`` over several GPUs, one rank per worker.

The cluster is started and owned by the session (``LocalCUDACluster``), or
external (``dask_scheduler_address``) and only borrowed: see
:mod:`prefect_cudf_polars.blocks.dask_cluster`. Seen on the two-GPU H200:
``LocalCUDACluster()`` starts one worker per GPU in ~4 s and
``DaskEngine(dask_client=client, engine_options={"hardware_binding":
HardwareBindingPolicy(enabled=False)})`` gives 2 ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_cudf_polars.blocks.dask_cluster import connect
from prefect_cudf_polars.blocks.streaming_engine import StreamingRunningEngine
from prefect_cudf_polars.blocks.streaming_options import engine_kwargs, silence_unstable_warning

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine


def start(block: CudfPolarsEngine) -> StreamingRunningEngine:
    """
    Create a ``DaskEngine`` on the block's cluster (call on the owner thread).

    Raises
    ------
    DaskClusterError, NoGPUError
        See :func:`~prefect_cudf_polars.blocks.dask_cluster.connect`.
    """
    from cudf_polars.engine.dask import DaskEngine
    from cudf_polars.engine.hardware_binding import HardwareBindingPolicy

    silence_unstable_warning()
    connection = connect(block)
    kwargs = engine_kwargs(block)
    if connection.owned:
        # LocalCUDACluster already pins each worker to its GPU and CPUs.
        kwargs["engine_options"]["hardware_binding"] = HardwareBindingPolicy(enabled=False)
    try:
        engine = DaskEngine(dask_client=connection.client, **kwargs)
    except BaseException:
        connection.close()
        raise
    running = StreamingRunningEngine("dask", engine, on_shutdown=connection.close)
    running.extra_description = {
        "dashboard": connection.dashboard_link,
        "cluster": "owned LocalCUDACluster" if connection.owned else f"external {connection.address}",
    }
    return running
