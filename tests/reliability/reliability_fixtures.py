"""
Fixtures of the reliability tests: backends, teardown checks, flow-run subprocess environments.

Test modules import them by name (``from reliability_fixtures import ...``): a
second ``conftest.py`` here would shadow ``tests/conftest.py`` for the modules
that do ``from conftest import read_run_logs``.
"""

from __future__ import annotations

import pytest

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from process_worker import worker_env
from processes import child_pids, pid_alive


def _assert_torn_down(session, *, store_before: int, children_before: set[int]) -> None:
    """
    The checks every ending must pass.

    The session is closed with no live result and its teardown complete, the
    engine was shut down on its owner thread, this process holds no new child
    process, and the cpu backend's host store holds what it held before. (The
    CUDA driver's figure after a session is tests/lifecycle/test_memory_after_session.py's.)
    """
    assert session.closed
    assert session.live_results == ()
    summary = session.summary()
    assert summary["teardown"] == "complete", summary
    assert (summary["shutdown_thread"] or "").startswith("cudf-polars-engine-owner"), summary
    assert held_partitions() == store_before
    leftover = {p for p in child_pids() - children_before if pid_alive(p)}
    assert not leftover, f"orphaned child processes: {leftover}"


@pytest.fixture()
def torn_down():
    """
    ``torn_down(session)`` asserts the teardown checks against this test's starting point.

    The starting point (host store partitions, child processes) is read when
    the fixture is set up, before the test body runs.
    """
    start = {"store_before": held_partitions(), "children_before": child_pids()}

    def check(session) -> None:
        _assert_torn_down(session, **start)

    return check


@pytest.fixture()
def subprocess_env() -> dict[str, str]:
    """Environment for a flow-run subprocess that talks to this test session's Prefect API."""
    return worker_env()


#: The backends every reliability test runs on: ``cpu`` here, ``spmd`` (marked
#: ``gpu``, one rank on one GPU, cudf-polars' SPMDEngine) on a GPU machine.
BACKENDS = [pytest.param("cpu", id="cpu"), pytest.param("spmd", id="spmd", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def engine_block(request) -> CudfPolarsEngine:
    """An unsaved engine block on each backend (``raise_on_fail=True``)."""
    return CudfPolarsEngine(backend=request.param, raise_on_fail=True)
