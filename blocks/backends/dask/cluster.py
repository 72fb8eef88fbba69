"""
The Dask cluster a ``dask`` session runs on: started and owned, or external and borrowed.

Developer notes
---------------
The rule is prefect-dask's: shut down only what you started.

* No ``dask_scheduler_address``: the session starts a ``dask_cuda.LocalCUDACluster``
  (one worker per visible GPU, honouring ``CUDA_VISIBLE_DEVICES``, with the
  block's rmm pool and spilling options), owns it, and closes client and
  cluster at session end.
* With ``dask_scheduler_address``: the session connects a client (bounded by
  ``dask_connect_timeout`` seconds, so a scheduler that does not answer cannot
  hang a flow run), checks the workers, and at session end closes only its own
  client. The cluster keeps running; our results were already released.

Worker checks (each an error that says what to do): no workers at all; a worker
without a visible GPU; several workers on the same first GPU (workers started
without cudf-polars' nanny preload, ``--preload-nanny cudf_polars.engine.dask``).

An owned cluster's worker processes each move into a process group of their
own (:class:`OwnProcessGroup`, a worker plugin, so a worker its nanny restarts
does too). A Prefect process worker cancels a flow run with SIGTERM to the
run's whole process group; the workers then keep running until the session's
teardown has released every result on them and closed the cluster, instead
of dying at once and being restarted by their nannies (which live in the flow
process) into a group nothing signals again. They still end with the flow
process when it is killed: distributed's worker processes end when their
parent does (checked with distributed 2026.8, ``tests/lifecycle/test_cluster_process_groups.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from typing import Any

from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import DASK_WORKERS, INSTALL, LOCAL_CLUSTER, NoGPUError


class DaskClusterError(RuntimeError):
    """A Dask cluster cannot run cudf-polars: unreachable, no workers, or workers without GPUs."""


try:
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
except ImportError:  # distributed is optional; connect() says so
    _WorkerPlugin = object  # type: ignore[assignment,misc]


class OwnProcessGroup(_WorkerPlugin):  # type: ignore[misc,valid-type]
    """A worker plugin that moves each worker process of an owned cluster into its own process group."""

    name = "prefect-cudf-polars-own-process-group"

    def setup(self, worker: Any) -> None:
        with contextlib.suppress(OSError):  # already a group (or session) leader
            os.setpgid(0, 0)


def worker_gpu_report() -> dict[str, Any]:
    """On a worker: its ``CUDA_VISIBLE_DEVICES`` and how many GPUs its driver shows."""
    from prefect_cudf_polars.blocks.backends.probe import count_gpus

    gpus, problem = count_gpus()
    return {"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpus": gpus, "problem": problem}


def check_gpu_workers(reports: dict[str, dict[str, Any]], address: str) -> int:
    """
    Check every worker can run one cudf-polars rank on a GPU of its own.

    Parameters
    ----------
    reports
        Worker address to :func:`worker_gpu_report`.
    address
        The scheduler address, for messages.

    Returns
    -------
    int
        Number of workers (ranks).

    Raises
    ------
    DaskClusterError
        No workers; a worker sees no GPU; two workers would use the same GPU.
    """
    if not reports:
        raise DaskClusterError(f"The Dask cluster at {address} has no workers: {DASK_WORKERS}, or {LOCAL_CLUSTER}.")
    if no_gpu := sorted(w for w, r in reports.items() if r["gpus"] == 0):
        raise DaskClusterError(f"{len(no_gpu)} of {len(reports)} workers of the Dask cluster at {address} see no GPU "
                               f"({no_gpu[0]}: {reports[no_gpu[0]]['problem']}), and cudf-polars needs one GPU per "
                               f"worker: {DASK_WORKERS}.")
    first = [(r["cvd"] or "0").split(",")[0] for r in reports.values()]
    if len(set(first)) < len(first):
        raise DaskClusterError(f"Workers of the Dask cluster at {address} share GPUs (first visible device of each: "
                               f"{sorted(first)}): {DASK_WORKERS}.")
    return len(reports)


@dataclasses.dataclass
class DaskConnection:
    """
    A client and, when we started it, the cluster.

    Attributes
    ----------
    client : distributed.Client
        Our client (always ours to close).
    cluster : object or None
        The cluster we started (``LocalCUDACluster``), or ``None`` for an external one.
    address : str
        Scheduler address.
    """

    client: Any
    cluster: Any | None
    address: str

    @property
    def owned(self) -> bool:
        """Whether the session started the cluster (and so shuts it down)."""
        return self.cluster is not None

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard URL, if the scheduler serves one."""
        with contextlib.suppress(Exception):
            return self.client.dashboard_link
        return None

    def close(self) -> None:
        """Close our client; close the cluster only if we started it (idempotent)."""
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()
                self.cluster = None


def local_cuda_cluster(block: CudfPolarsEngine) -> Any:
    """Start a ``dask_cuda.LocalCUDACluster``: one worker per visible GPU (see ``CudfPolarsEngine.local_cluster_kwargs``)."""
    from dask_cuda import LocalCUDACluster

    return LocalCUDACluster(**block.local_cluster_kwargs())


def connect(block: CudfPolarsEngine, *,
            start_cluster: Callable[[CudfPolarsEngine], Any] = local_cuda_cluster) -> DaskConnection:
    """
    Connect to the block's Dask cluster, or start one the session owns.

    Parameters
    ----------
    block
        The engine block (``dask_scheduler_address``, ``dask_connect_timeout``).
    start_cluster
        Starts the owned cluster when there is no address (a ``LocalCUDACluster``).

    Returns
    -------
    DaskConnection

    Raises
    ------
    NoGPUError
        When ``distributed`` (or dask-cuda for an owned cluster) is not installed.
    DaskClusterError
        When the scheduler does not answer within ``dask_connect_timeout``
        seconds, or its workers cannot run cudf-polars (see :func:`check_gpu_workers`).
    """
    try:
        from distributed import Client
    except ImportError as exc:
        raise NoGPUError(f"backend='dask' needs dask.distributed and dask-cuda: {INSTALL.format(extra='cu13')} "
                         "(or cu12).") from exc
    address = block.dask_scheduler_address
    if address is None:
        cluster = start_cluster(block)
        try:
            client = Client(cluster)
            client.register_plugin(OwnProcessGroup())  # each worker, now and after a restart
        except BaseException:
            cluster.close()
            raise
        return DaskConnection(client=client, cluster=cluster, address=cluster.scheduler_address)
    try:
        client = Client(address, timeout=block.dask_connect_timeout)
    except (OSError, TimeoutError) as exc:
        raise DaskClusterError(f"The Dask scheduler at {address} did not answer within {block.dask_connect_timeout:g} "
                               f"s ({type(exc).__name__}: {exc}). Check the address and that the scheduler runs, or "
                               f"{LOCAL_CLUSTER}.") from exc
    try:
        check_gpu_workers(client.run(worker_gpu_report), address)
    except BaseException:
        client.close()
        raise
    return DaskConnection(client=client, cluster=None, address=address)
