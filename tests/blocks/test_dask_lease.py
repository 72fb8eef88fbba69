"""
The worker-state lease (``blocks/backends/dask/lease.py``) on a real external Dask cluster, on the CPU.

A scheduler and two workers (``--no-nanny --nthreads 1``) run as processes of
their own on 127.0.0.1, with a preload that makes ``prefect_cudf_polars``
unimportable there, as on a cluster without our package: the lease and its
cleanup must reach them by value. The state is a stand-in for cudf-polars'
(``scripts/lease_holder.py``); the GPU case is in ``tests/gpu/test_gpu_dask.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from processes import child_pids, spawn, start_dask_scheduler, stop, wait_gone, wait_until

pytest.importorskip("distributed")
import cloudpickle  # noqa: E402
from distributed import Client  # noqa: E402

from prefect_cudf_polars.blocks.backends.dask import lease as dask_lease  # noqa: E402

pytestmark = pytest.mark.timeout(60)

SCRIPTS = Path(__file__).parent / "scripts"
#: Seconds from SIGKILL of the lease holder to its state gone from every worker.
#: The scheduler sees the killed client's socket close at once, well inside the bound.
BOUND_S = 10.0
#: Seconds to wait before concluding that a cleanup did not run.
SETTLE_S = 1.5


def _load_helpers():
    spec = importlib.util.spec_from_file_location("lease_holder", SCRIPTS / "lease_holder.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lease_holder"] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the workers cannot import it
    return module


lease_holder = _load_helpers()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """An external cluster (scheduler + 2 workers as processes) and a client of the test's own."""
    folder = tmp_path_factory.mktemp("lease-cluster")
    hide = ["--preload", str(SCRIPTS / "hide_project.py")]
    before = child_pids()
    scheduler, address = start_dask_scheduler(folder, *hide)
    procs = [scheduler]
    try:
        for i in range(2):
            procs.append(spawn(
                [sys.executable, "-m", "distributed.cli.dask_worker", address, "--host", "127.0.0.1",
                 "--nthreads", "1", "--no-nanny", "--no-dashboard", *hide],
                folder / f"worker-{i}.log",
            ))
        with Client(address, timeout=30) as ours:
            ours.wait_for_workers(2, timeout=30)
            assert not ours.run_on_scheduler(lease_holder.project_importable)
            assert not any(ours.run(lease_holder.project_importable).values())
            yield SimpleNamespace(address=address, client=ours, log=folder / "scheduler.log")
    finally:
        # Workers first, while the scheduler still answers their graceful close; then it.
        stop(procs[1:], timeout=10)
        stop(procs[:1], timeout=10)
    assert wait_gone(child_pids() - before) == set(), "cluster processes left behind"


def _held(cluster, uid: str) -> list[bool]:
    return list(cluster.client.run(lease_holder.held, uid=uid).values())


def _plugins(cluster) -> list[str]:
    return cluster.client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins))


def test_sigkilled_client_has_its_worker_state_dropped_within_bound(cluster, tmp_path, record_property):
    uid = uuid.uuid4().hex
    name = f"prefect-cudf-polars-lease-{uid}"
    out = tmp_path / "holder.out"
    child = spawn([sys.executable, str(SCRIPTS / "lease_holder.py"), cluster.address, uid], out)
    try:
        wait_until(lambda: "READY" in out.read_text() or child.poll() is not None, 30, "READY")
        assert child.poll() is None, out.read_text()
        client_id = out.read_text().split("READY ", 1)[1].split()[0]
        assert _held(cluster, uid) == [True, True]
        assert name in _plugins(cluster)

        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        child.wait(timeout=10)
        wait_until(lambda: _held(cluster, uid) == [False, False], BOUND_S, "state dropped")
        seconds = time.monotonic() - killed
    finally:
        stop([child], timeout=0)
    record_property("sigkill_to_cleanup_s", round(seconds, 3))
    print(f"\nSIGKILL to worker state gone on both workers: {seconds:.3f} s (bound {BOUND_S} s)")
    wait_until(lambda: name not in _plugins(cluster), 5, "lease removed itself")
    logged = f"Lease {name}: client {client_id} left; ran cleanup_for.<locals>.cleanup on 2 workers, 0 failed"
    wait_until(lambda: logged in cluster.log.read_text(), 5, "scheduler log line")


@contextlib.contextmanager
def _holding(cluster):
    """A client of its own that plants state for a fresh uid and holds a lease on it."""
    uid = uuid.uuid4().hex
    name = f"prefect-cudf-polars-lease-{uid}"
    with Client(cluster.address, timeout=30) as holder:
        holder.run(lease_holder.plant, uid=uid)
        dask_lease.hold(holder, lease_holder.cleanup_for(uid), name)
        assert name in _plugins(cluster)
        yield SimpleNamespace(client=holder, uid=uid, name=name)


def test_released_lease_does_not_run_on_normal_close(cluster):
    with _holding(cluster) as lease:
        dask_lease.release(lease.client, lease.name)
        assert lease.name not in _plugins(cluster)
    time.sleep(SETTLE_S)
    assert _held(cluster, lease.uid) == [True, True], "a released lease ran its cleanup"
    cluster.client.run(lease_holder.cleanup_for(lease.uid))
    assert _held(cluster, lease.uid) == [False, False]


def test_other_client_leaving_does_not_trigger_the_lease(cluster):
    with _holding(cluster) as lease:
        Client(cluster.address, timeout=30).close()  # someone else comes and goes
        time.sleep(SETTLE_S)
        assert _held(cluster, lease.uid) == [True, True], "another client's exit ran our cleanup"
        assert lease.name in _plugins(cluster)
    # Our client closed without releasing: now the lease runs.
    wait_until(lambda: _held(cluster, lease.uid) == [False, False], BOUND_S, "state dropped")
    wait_until(lambda: lease.name not in _plugins(cluster), 5, "lease removed itself")
