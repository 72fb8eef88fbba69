"""
Fixtures of the lifecycle tests.

Test modules import them by name (``from lifecycle_fixtures import ...``): a
``conftest.py`` here would shadow ``tests/conftest.py`` for the modules that do
``from conftest import read_run_logs``.
"""

from __future__ import annotations

import pytest

from prefect_cudf_polars.blocks.backends.gpu_support import GPUSupportCheck


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

    monkeypatch.setattr(GPUSupportCheck, "open", classmethod(unchecked))
