"""
Dask cluster ownership with real ``distributed`` clusters: shut down only what we started.

These run on the CPU: the cluster logic is the same whatever the workers run,
so a ``distributed.LocalCluster`` stands in for ``LocalCUDACluster`` as the
owned cluster, and external clusters are real schedulers and workers.
"""

from __future__ import annotations

import time

import psutil
import pytest
from processes import child_pids, wait_gone

pytest.importorskip("distributed")
from distributed import Client, LocalCluster  # noqa: E402

from prefect_cudf_polars.blocks import CudfPolarsEngine  # noqa: E402
from prefect_cudf_polars.blocks.backends.dask.cluster import (  # noqa: E402
    DaskClusterError,
    check_gpu_workers,
    connect,
    worker_gpu_report,
)


def _local_cluster(_block):
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")


@pytest.fixture(scope="module")
def external():
    """An external cluster (a scheduler and 2 process workers) for the module: each test leaves it as it was."""
    with _local_cluster(None) as cluster:
        yield cluster


def test_owned_cluster_is_closed_with_no_orphaned_processes():
    before = child_pids()
    connection = connect(CudfPolarsEngine(backend="dask"), start_cluster=_local_cluster)
    assert connection.owned
    workers = connection.client.scheduler_info()["workers"]
    assert len(workers) == 2
    started = child_pids() - before
    assert started, "the owned cluster started worker processes"
    connection.close()
    left = wait_gone(started)
    assert left == set(), [" ".join(psutil.Process(p).cmdline()) for p in left]


def test_external_cluster_is_left_running(external):
    block = CudfPolarsEngine(backend="dask", dask_scheduler_address=external.scheduler_address)
    with pytest.raises(DaskClusterError, match="see no GPU"):
        connect(block)  # CPU workers: refused, and the cluster is untouched
    with Client(external.scheduler_address, timeout=10) as probe:
        assert len(probe.scheduler_info()["workers"]) == 2
        assert probe.submit(sum, [1, 2]).result(timeout=30) == 3


def test_connection_to_external_cluster_closes_only_its_client(external, monkeypatch):
    # Pretend the external CPU workers had GPUs of their own, to get past the check.
    import prefect_cudf_polars.blocks.backends.dask.cluster as dc

    monkeypatch.setattr(dc, "check_gpu_workers", lambda reports, address: len(reports))
    connection = connect(
        CudfPolarsEngine(backend="dask", dask_scheduler_address=external.scheduler_address)
    )
    assert not connection.owned
    assert connection.dashboard_link
    connection.close()
    assert connection.client.status == "closed"
    with Client(external.scheduler_address, timeout=10) as probe:
        assert len(probe.scheduler_info()["workers"]) == 2
        assert probe.submit(sum, [1, 2]).result(timeout=30) == 3


def test_unanswering_scheduler_times_out_with_guidance():
    block = CudfPolarsEngine(
        backend="dask", dask_scheduler_address="tcp://127.0.0.1:9", dask_connect_timeout=2
    )
    started = time.monotonic()
    with pytest.raises(DaskClusterError, match=r"did not answer within 2 s.*Check the address"):
        connect(block)
    assert time.monotonic() - started < 30


def test_worker_checks_name_the_fix():
    with pytest.raises(DaskClusterError, match="has no workers.*--preload-nanny"):
        check_gpu_workers({}, "tcp://x:8786")
    with pytest.raises(DaskClusterError, match="share GPUs.*--preload-nanny cudf_polars.engine.dask"):
        check_gpu_workers(
            {"w1": {"cvd": None, "gpus": 2, "problem": None}, "w2": {"cvd": None, "gpus": 2, "problem": None}},
            "tcp://x:8786",
        )
    assert check_gpu_workers(
        {"w1": {"cvd": "0,1", "gpus": 2, "problem": None}, "w2": {"cvd": "1,0", "gpus": 2, "problem": None}},
        "tcp://x:8786",
    ) == 2


def test_worker_report_runs_on_real_workers(external):
    with Client(external.scheduler_address, timeout=10) as client:
        reports = list(client.run(worker_gpu_report).values())
    assert len(reports) == 2
    assert all(set(report) == {"cvd", "gpus", "problem"} for report in reports)
