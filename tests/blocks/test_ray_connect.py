"""
Connecting to an external Ray cluster that wants a token, without one: the error says what to do.

Needs Ray (``pip install ray``; skipped without it). A real ``ray start --head``
with token authentication (``tests/ray_head.py``); the client runs in a
subprocess, as a flow run would, with and without ``RAY_AUTH_MODE=token``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ray_head import ray_head  # noqa: F401 (fixture)

pytest.importorskip("ray", reason="needs Ray (pip install ray)")

CLIENT = """
import json, sys
import ray
from prefect_cudf_polars.blocks.ray_connect import explain_connect_failure
try:
    ray.init(address=sys.argv[1])
except ConnectionError as exc:
    error = explain_connect_failure(sys.argv[1], exc)
    print(json.dumps({"type": type(error).__name__, "message": str(error)}))
else:
    print(json.dumps({"connected": ray.cluster_resources().get("CPU", 0) > 0}))
    ray.shutdown()
"""


def _client(address: str, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, address], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ray_head", [0], indirect=True)
def test_a_client_without_token_mode_is_told_to_set_ray_auth_mode(ray_head):
    without = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    without["RAY_AUTH_TOKEN"] = os.environ["RAY_AUTH_TOKEN"]  # the token is there; the mode is not
    got = _client(ray_head, without)
    assert got["type"] == "RayClusterError"
    assert f"The Ray cluster at {ray_head} requires token authentication" in got["message"]
    assert "RAY_AUTH_MODE is unset" in got["message"]
    assert "Set RAY_AUTH_MODE=token in the flow run's environment" in got["message"]
    # Doing what it says connects.
    assert _client(ray_head, dict(os.environ)) == {"connected": True}
