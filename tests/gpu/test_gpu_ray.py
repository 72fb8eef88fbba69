"""
The ``ray`` backend on every visible GPU: cudf-polars' ``RayEngine``, one rank (actor) per GPU.

Skipped without a GPU (conftest) or without Ray (``pip install -e '.[ray]'`` in the checkout).
An external cluster is a ``ray start --head``
on 127.0.0.1 started here; a local Ray is started and stopped by the session.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from nvidia_smi import device_memory_used_mib, wait_back_to
from processes import child_pids, pid_alive, stop, wait_gone, wait_until
from ray_head import ray_head  # noqa: F401 (fixture)

from prefect_cudf_polars.blocks import CudfPolarsEngine, NoGPUError
from prefect_cudf_polars.blocks.backends import probe as gpu_probe
from session_holder import start_holder
from spread_data import SMALL_PARTITIONS, check_results_on_every_rank, data, query  # noqa: F401 (fixture)

ray = pytest.importorskip("ray", reason="backend='ray' needs Ray (pip install ray)")

GPUS = gpu_probe.count_gpus()[0]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


def test_local_ray_started_and_stopped_by_the_session(data):
    before = child_pids()
    block = CudfPolarsEngine(backend="ray", target_partition_size=SMALL_PARTITIONS)
    with block.session() as session:
        assert session.backend == "ray" and session.description["ranks"] == GPUS
        assert session.description["cluster"] == "owned local Ray"
        check_results_on_every_rank(session, data, GPUS)
        live = session.execute(query(data))
        ray_pids = child_pids() - before
    assert live.state == "released" and session.summary()["teardown"] == "complete"
    assert not ray.is_initialized()
    assert wait_gone(ray_pids, timeout=60) == set(), "the session's Ray processes were left behind"


@pytest.mark.parametrize("ray_head", [GPUS], indirect=True)
def test_external_ray_keeps_running_and_holds_none_of_our_actors(data, ray_head):
    block = CudfPolarsEngine(backend="ray", ray_address=ray_head, target_partition_size=SMALL_PARTITIONS)
    with block.session() as session:
        assert session.description["cluster"] == f"external Ray {ray_head}"
        assert session.description["ranks"] == GPUS
        check_results_on_every_rank(session, data, GPUS)
        kept = session.execute(query(data))
    assert kept.state == "released" and session.summary()["teardown"] == "complete"
    # The cluster runs on, with every GPU free again: our rank actors (one GPU each) are gone.
    ray.init(address=ray_head)
    try:
        assert ray.cluster_resources().get("GPU") == GPUS
        # Ray ends a departed driver's actors asynchronously.
        wait_until(lambda: ray.available_resources().get("GPU") == GPUS, 60, "every GPU free again")
    finally:
        ray.shutdown()


@pytest.mark.parametrize("ray_head", [0], indirect=True)
def test_ray_cluster_without_gpus_says_what_to_do(ray_head):
    block = CudfPolarsEngine(backend="ray", ray_address=ray_head)
    with pytest.raises(NoGPUError, match="has no free GPU for cudf-polars.*ray start --num-gpus"):
        with block.session():
            pass
    assert not ray.is_initialized()


@pytest.mark.parametrize("ray_head", [GPUS], indirect=True)
def test_external_ray_ends_a_sigkilled_sessions_actors_and_frees_their_gpus(data, ray_head, tmp_path):
    """
    SIGKILL a driver holding results on an external Ray: Ray ends its rank actors.

    cudf-polars' ``RankActor``s are not detached, so Ray ends them when the driver
    that created them dies; with the actor processes gone the CUDA driver frees
    their device memory. Checked: actor processes gone, every GPU slot free, and
    ``nvidia-smi`` memory.used on every GPU back to its figure before the session.
    """
    before = device_memory_used_mib()
    child, ready = start_holder("ray", ray_head, data, tmp_path / "holder.out")
    try:
        assert ready["ranks"] == list(range(GPUS)) and ready["cluster"] == f"external Ray {ray_head}"
        actors = set(ready["actor_pids"])
        assert len(actors) == GPUS and all(pid_alive(p) for p in actors)
        held = device_memory_used_mib()
        assert all(h > b for h, b in zip(held, before)), (before, held)

        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        child.wait(timeout=30)
        assert wait_gone(actors, timeout=60) == set(), "Ray kept the killed driver's actors"
        seconds = time.monotonic() - killed
    finally:
        stop([child], timeout=0)
    ray.init(address=ray_head)
    try:
        wait_until(lambda: ray.available_resources().get("GPU") == GPUS, 60, "every GPU slot free")
    finally:
        ray.shutdown()

    wait_back_to(before, 60, "device memory back to its figure before the session")
    print(
        f"SIGKILL to rank actors gone on {GPUS} GPUs: {seconds:.3f} s; nvidia-smi memory.used MiB "
        f"before {before}, holding {held}, after {device_memory_used_mib()}"
    )
