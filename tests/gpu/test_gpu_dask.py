"""
The ``dask`` backend on every visible GPU (any N >= 2).

Skipped without a GPU (conftest) and with fewer than two GPUs (here). The data
and queries are in ``spread_data.py`` (shared with the Ray tests).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import polars as pl
import pytest
from processes import child_pids, spawn, start_dask_scheduler, stop, wait_gone, wait_until

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.blocks.backends import probe as gpu_probe
from session_holder import start_holder
from spread_data import SMALL_PARTITIONS, check_results_on_every_rank, data, query  # noqa: F401 (fixture)

GPUS = gpu_probe.count_gpus()[0]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS < 2, reason="needs two GPUs or more"),
]

#: Seconds from SIGKILL of that process to its state gone from every worker (the lease's
#: bound; the CPU test, tests/blocks/test_dask_lease.py, checks the same bound).
LEASE_BOUND_S = 10.0


def test_auto_with_several_gpus_is_dask_over_all_ranks_and_owned_cluster_goes_away(data):
    before = child_pids()
    block = CudfPolarsEngine(backend="auto", target_partition_size=SMALL_PARTITIONS)
    with block.session() as session:
        assert session.backend == "dask" and session.description["ranks"] == GPUS
        assert "owned" in session.description["cluster"] and session.description["dashboard"]
        check_results_on_every_rank(session, data, GPUS)
        live = session.execute(query(data))
        assert sorted(live.ranks) == list(range(GPUS))
        cluster_pids = child_pids() - before
    assert live.state == "released" and session.summary()["teardown"] == "complete"
    assert wait_gone(cluster_pids) == set(), "owned cluster processes left behind"


def test_external_cluster_stays_up_and_holds_none_of_our_results(data):
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    def stored_partitions() -> int:
        from cudf_polars.engine import rank_local_store

        return sum(len(s._partitions) for s in rank_local_store._stores.values())

    with LocalCUDACluster(threads_per_worker=1) as cluster, Client(cluster) as ours:
        block = CudfPolarsEngine(
            backend="dask",
            dask_scheduler_address=cluster.scheduler_address,
            target_partition_size=SMALL_PARTITIONS,
        )
        with block.session() as session:
            assert "external" in session.description["cluster"]
            kept = session.execute(query(data))
            assert sorted(kept.ranks) == list(range(GPUS))
            assert sum(ours.run(stored_partitions).values()) >= GPUS
        assert kept.state == "released"
        assert sum(ours.run(stored_partitions).values()) == 0
        assert len(ours.scheduler_info()["workers"]) == GPUS
        assert ours.submit(sum, [1, 2]).result(timeout=60) == 3


@pytest.mark.timeout(600)
def test_external_cluster_drops_a_sigkilled_sessions_results(data, tmp_path):
    """
    SIGKILL a process holding results on an external cluster: the lease frees every worker.
    """
    from distributed import Client

    def worker_state(dask_worker=None) -> dict:
        from cudf_polars.engine import rank_local_store

        from prefect_cudf_polars.blocks.backends.compat import rank_reading

        

        def rank_allocated_bytes():

            return rank_reading()[0]

        return {
            "stores": sorted(rank_local_store._stores),
            "contexts": [a for a in dir(dask_worker) if a.startswith("_cudf_polars_mp_context_")],
            "rmm": rank_allocated_bytes(),
        }

    def leases(dask_scheduler=None) -> list[str]:
        return [n for n in dask_scheduler.plugins if n.startswith("prefect-cudf-polars-lease-")]

    before = child_pids()
    scheduler, address = start_dask_scheduler(tmp_path)
    procs = [scheduler]
    try:
        procs.append(spawn(
            [sys.executable, "-m", "dask", "cuda", "worker", address, "--host", "127.0.0.1",
             "--no-dashboard"],
            tmp_path / "workers.log",
        ))
        with Client(address, timeout=60) as ours:
            ours.wait_for_workers(GPUS, timeout=180)
            # A session closed normally first: it must leave no state and no lease, and it
            # leaves cudf-polars' tracking rmm adaptor current, so the figures are readable.
            block = CudfPolarsEngine(
                backend="dask", dask_scheduler_address=address, target_partition_size=SMALL_PARTITIONS
            )
            with block.session() as session:
                assert "external" in session.description["cluster"]
                session.collect(query(data).select(pl.len()))
                assert len(ours.run_on_scheduler(leases)) == 1
            assert ours.run_on_scheduler(leases) == []
            start = ours.run(worker_state)
            assert all(s["contexts"] == [] for s in start.values()), start

            child, ready = start_holder("dask", address, data, tmp_path / "holder.out")
            try:
                assert ready["ranks"] == list(range(GPUS)) and "external" in ready["cluster"]
                uid = ready["uid"]
                held = ours.run(worker_state)
                assert all(uid in h["stores"] for h in held.values()), held
                assert ours.run_on_scheduler(leases) == [f"prefect-cudf-polars-lease-{uid}"]

                os.kill(child.pid, signal.SIGKILL)
                killed = time.monotonic()
                child.wait(timeout=30)

                def dropped() -> bool:
                    return all(
                        uid not in s["stores"] and s["contexts"] == []
                        for s in ours.run(worker_state).values()
                    )

                wait_until(dropped, LEASE_BOUND_S, "the killed session's state dropped on every worker")
                seconds = time.monotonic() - killed
            finally:
                stop([child], timeout=0)
            print(f"SIGKILL to state gone on {GPUS} GPU workers: {seconds:.3f} s (bound {LEASE_BOUND_S} s)")
            after = ours.run(worker_state)
            for worker, figures in start.items():
                if figures["rmm"] is not None:
                    assert after[worker]["rmm"] == figures["rmm"], (worker, start, held, after)
            wait_until(lambda: ours.run_on_scheduler(leases) == [], 5, "the lease removed itself")
            assert len(ours.scheduler_info()["workers"]) == GPUS
            assert ours.submit(sum, [1, 2]).result(timeout=60) == 3
    finally:
        stop(procs)
    assert wait_gone(child_pids() - before) == set(), "cluster processes left behind"
