"""
The ``ray`` backend on every visible GPU: cudf-polars' ``RayEngine``, one rank (actor) per GPU.

Skipped without a GPU (conftest) or without Ray (``pip install ray``; the GPU kit
needs ``ray`` as an extra spec). An external cluster is a ``ray start --head``
on 127.0.0.1 started here; a local Ray is started and stopped by the session.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from processes import child_pids, free_port, wait_gone, wait_until

from prefect_cudf_polars.blocks import CudfPolarsEngine, NoGPUError, gpu_probe
from spread_data import SMALL_PARTITIONS, check_results_on_every_rank, data, query  # noqa: F401 (fixture)

ray = pytest.importorskip("ray", reason="backend='ray' needs Ray (pip install ray)")

GPUS = gpu_probe.count_gpus()[0]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
RAY_ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}


def _ray_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the ``ray`` command line (``ray.scripts.scripts``) with this interpreter."""
    return subprocess.run(
        [sys.executable, "-c", "from ray.scripts.scripts import main; main()", *args],
        capture_output=True, text=True, timeout=timeout, env=RAY_ENV,
    )


@pytest.fixture()
def ray_head(request):
    """``ray start --head`` on 127.0.0.1 with ``request.param`` GPUs (default: all); stopped after."""
    gpus = getattr(request, "param", GPUS)
    port = free_port()
    started = _ray_cli(
        "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
        f"--num-gpus={gpus}", "--include-dashboard=false", "--disable-usage-stats",
    )
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        _ray_cli("stop", "--force")


def test_local_ray_started_and_stopped_by_the_session(data):
    before = child_pids()
    block = CudfPolarsEngine(backend="ray", target_partition_size=SMALL_PARTITIONS)
    with block.session() as session:
        assert session.backend == "ray" and session.description["ranks"] == GPUS
        assert session.description["cluster"] == "owned local Ray"
        check_results_on_every_rank(session, data, GPUS)
        live = session.execute(query(data))
        ray_pids = child_pids() - before
    assert live.state == "released"
    assert session.memory["before_shutdown"] == session.memory["at_start"]
    assert not ray.is_initialized()
    assert wait_gone(ray_pids, timeout=60) == set(), "the session's Ray processes were left behind"


def test_external_ray_keeps_running_and_holds_none_of_our_actors(data, ray_head):
    block = CudfPolarsEngine(backend="ray", ray_address=ray_head, target_partition_size=SMALL_PARTITIONS)
    with block.session() as session:
        assert session.description["cluster"] == f"external Ray {ray_head}"
        assert session.description["ranks"] == GPUS
        check_results_on_every_rank(session, data, GPUS)
        kept = session.execute(query(data))
    assert kept.state == "released"
    assert session.memory["before_shutdown"] == session.memory["at_start"]
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
