"""
The ``dask`` backend: cudf-polars' ``DaskEngine`` over several GPUs, one rank per worker.

The cluster is started and owned by the session (``LocalCUDACluster``, one
worker per visible GPU), or external (``dask_scheduler_address``) and only
borrowed: see :mod:`prefect_cudf_polars.blocks.backends.dask.cluster`. On an
owned cluster the engine is created with cudf-polars' hardware binding off
(``HardwareBindingPolicy(enabled=False)``): dask-cuda already pins each worker
to its GPU and CPUs.

On an external cluster the session also holds a lease on the scheduler
(:mod:`prefect_cudf_polars.blocks.backends.dask.lease`): if our process dies without
shutting the engine down (SIGKILL), the scheduler runs cudf-polars' worker
teardown for our engine on every worker. An owned cluster needs none: it dies
with our process.

What is created goes on the host's exit stack, so it is shut down last
created first: the lease is dropped, the engine shut down, then our client
(and an owned cluster) closed.
"""

from __future__ import annotations

from contextlib import ExitStack

from prefect_cudf_polars.blocks.backends import compat
from prefect_cudf_polars.blocks.backends.dask import lease
from prefect_cudf_polars.blocks.backends.dask.cluster import DaskClusterError, connect
from prefect_cudf_polars.blocks.backends.streaming import StreamingRunningEngine, limited_engine_kwargs
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import LOCAL_CLUSTER


class DaskLeaseError(DaskClusterError):
    """The external Dask scheduler would not take the lease that cleans up after a killed session."""


def start(block: CudfPolarsEngine, stack: ExitStack, limit: int | None = None) -> StreamingRunningEngine:
    """
    Create a ``DaskEngine`` on the block's cluster (call on the owner thread).

    Raises
    ------
    DaskClusterError, NoGPUError
        See :func:`~prefect_cudf_polars.blocks.backends.dask.cluster.connect`.
    DaskLeaseError
        An external scheduler refused the lease (the scheduler needs to accept
        scheduler plugins from clients); what was started is on ``stack``.
    """
    from cudf_polars.engine.dask import DaskEngine
    from cudf_polars.engine.hardware_binding import HardwareBindingPolicy

    running = StreamingRunningEngine("dask", stack, limit)
    connection = connect(block)
    stack.callback(connection.close)
    kwargs = limited_engine_kwargs(block, limit)
    if connection.owned:
        # LocalCUDACluster already pins each worker to its GPU and CPUs.
        kwargs["engine_options"]["hardware_binding"] = HardwareBindingPolicy(enabled=False)
    engine = running.enter(DaskEngine(dask_client=connection.client, **kwargs), stack).engine
    if not connection.owned:
        uid, teardown = compat.dask_worker_teardown(engine)
        name = f"prefect-cudf-polars-lease-{uid}"
        try:
            lease.hold(connection.client, teardown, name)
        except Exception as exc:
            raise DaskLeaseError(
                f"The Dask scheduler at {connection.address} refused the plugin {name!r} that frees our GPU results "
                f"on its workers if this process is killed ({type(exc).__name__}: {exc}). Use a scheduler that "
                "accepts scheduler plugins from clients, with distributed and cloudpickle versions matching this "
                f"client's, or {LOCAL_CLUSTER}.") from exc
        stack.callback(lease.release, connection.client, name)
    running.extra = {"dashboard": connection.dashboard_link,
                     "cluster": "owned LocalCUDACluster" if connection.owned else f"external {connection.address}"}
    return running
