"""
A ``ray start --head`` on 127.0.0.1 for tests, with token authentication, stopped after.

Authentication is explicit: the head and every client of the test (this process
and its children, through the environment) get ``RAY_AUTH_MODE=token`` and one
``RAY_AUTH_TOKEN``. Left to itself, ``ray start --head`` turns token
authentication on whenever ``~/.ray/auth_token`` exists (a local ``ray.init()``
writes it), while a client without ``RAY_AUTH_MODE=token`` sends no token; the
outcome then depends on which test ran first (Ray 2.60).
Ray also keeps a token it loaded for the life of the process, so the fixture
makes this process reload it after setting the head's token and after putting
the environment back (``reload_auth_token``).
``ray stop --force`` stops every Ray of the machine, so one head runs at a time
among the test processes (``make test`` runs two): each holds a file lock for it.
Test modules import the fixture (``from ray_head import ray_head``).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from processes import free_port

from prefect_cudf_polars.blocks.backends.compat import reload_ray_auth_token as reload_auth_token


def ray_cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the ``ray`` command line (``ray.scripts.scripts``) with this interpreter."""
    return subprocess.run(
        [sys.executable, "-c", "from ray.scripts.scripts import main; main()", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )


@pytest.fixture()
def ray_head(request) -> str:
    """
    ``host:port`` of a head with ``request.param`` GPUs (default: what Ray detects).

    Sets ``RAY_AUTH_MODE=token`` and the head's ``RAY_AUTH_TOKEN`` in this
    process's environment for the test; ``ray stop --force`` after.
    """
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAY_AUTH_MODE", "token")
            patch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
            patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
            reload_auth_token()
            yield from _head(request, dict(os.environ))
    finally:
        reload_auth_token()


def _head(request, env: dict[str, str]):
    with open(Path(tempfile.gettempdir()) / "prefect-cudf-polars-tests-ray-head.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, after the stop
        yield from _one_head(request, env)


def _one_head(request, env: dict[str, str]):
    port = free_port()
    gpus = getattr(request, "param", None)
    started = ray_cli(
        "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
        *([f"--num-gpus={gpus}"] if gpus is not None else []),
        "--include-dashboard=false", "--disable-usage-stats", env=env,
    )
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        ray_cli("stop", "--force", env=env)
