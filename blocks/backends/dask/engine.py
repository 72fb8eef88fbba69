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

cudf-polars internals used here (checked against cudf-polars 26.10):
``DaskEngine._dask_ctx.rapidsmpf_id`` (the engine's id on the workers) and
``cudf_polars.engine.dask._teardown_worker`` (what ``DaskEngine.shutdown``
runs on each worker).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from prefect_cudf_polars.blocks.backends.dask.cluster import DaskClusterError, connect
from prefect_cudf_polars.blocks.backends.streaming import StreamingRunningEngine
from prefect_cudf_polars.blocks.backends.streaming_options import engine_kwargs, silence_unstable_warning

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.backends.dask.cluster import DaskConnection
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine


class DaskLeaseError(DaskClusterError):
    """The external Dask scheduler would not take the lease that cleans up after a killed session."""


def hold_lease(connection: DaskConnection, engine: Any) -> str:
    """
    Register the teardown lease for ``engine`` on the external cluster's scheduler.

    Returns
    -------
    str
        The lease name, for :func:`prefect_cudf_polars.blocks.backends.dask.lease.release`.

    Raises
    ------
    DaskLeaseError
        The scheduler refused or could not unpickle the plugin.
    """
    # cudf-polars 26.10: the per-worker teardown and the engine's id on the workers.
    from cudf_polars.engine.dask import _teardown_worker

    from prefect_cudf_polars.blocks.backends.dask import lease as dask_lease

    uid = engine._dask_ctx.rapidsmpf_id
    name = f"prefect-cudf-polars-lease-{uid}"
    try:
        return dask_lease.hold(connection.client, functools.partial(_teardown_worker, uid=uid), name)
    except Exception as exc:
        raise DaskLeaseError(
            f"The Dask scheduler at {connection.address} refused the plugin "
            f"{name!r} that frees our GPU results on its workers if this process is "
            f"killed ({type(exc).__name__}: {exc}). Use a scheduler that accepts "
            "scheduler plugins from clients, with distributed and cloudpickle versions "
            "matching this client's, or leave dask_scheduler_address empty to let the "
            "session start a LocalCUDACluster."
        ) from exc


def _release_then_close(connection: DaskConnection, lease: str) -> None:
    """Drop the lease (so a clean close broadcasts nothing), then close our client."""
    from prefect_cudf_polars.blocks.backends.dask import lease as dask_lease

    try:
        dask_lease.release(connection.client, lease)
    except Exception:
        pass  # Scheduler gone or lease already spent: nothing left to drop.
    finally:
        connection.close()


def start(block: CudfPolarsEngine) -> StreamingRunningEngine:
    """
    Create a ``DaskEngine`` on the block's cluster (call on the owner thread).

    Raises
    ------
    DaskClusterError, NoGPUError
        See :func:`~prefect_cudf_polars.blocks.backends.dask.cluster.connect`.
    DaskLeaseError
        An external scheduler refused the lease (see :func:`hold_lease`); the
        engine is shut down and our client closed first.
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
    on_shutdown = connection.close
    if not connection.owned:
        try:
            lease = hold_lease(connection, engine)
        except BaseException:
            try:
                engine.shutdown()
            finally:
                connection.close()
            raise
        on_shutdown = functools.partial(_release_then_close, connection, lease)
    running = StreamingRunningEngine("dask", engine, on_shutdown=on_shutdown)
    running.extra_description = {
        "dashboard": connection.dashboard_link,
        "cluster": "owned LocalCUDACluster" if connection.owned else f"external {connection.address}",
    }
    return running
