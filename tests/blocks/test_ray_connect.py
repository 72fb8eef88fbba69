"""
Connecting to an external Ray cluster that wants a token.

Without one, the error says what to do; after a local Ray in the same process,
the session sends the cluster's token, not the local one Ray kept.
Needs Ray (``pip install ray``; skipped without it). A real ``ray start --head``
with token authentication (``tests/ray_head.py``); the client runs in a
subprocess, as a flow run would.
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
from prefect_cudf_polars.blocks.backends.ray.connect import explain_connect_failure
try:
    ray.init(address=sys.argv[1])
except ConnectionError as exc:
    error = explain_connect_failure(sys.argv[1], exc)
    print(json.dumps({"type": type(error).__name__, "message": str(error)}))
else:
    print(json.dumps({"connected": ray.cluster_resources().get("CPU", 0) > 0}))
    ray.shutdown()
"""

AFTER_A_LOCAL_RAY = """
import json, os, sys
import ray
from prefect_cudf_polars.blocks.backends.engine_errors import iter_exceptions
from prefect_cudf_polars.blocks.backends.compat import reload_ray_auth_token as reload_auth_token

def connect(address):
    try:
        ray.init(address=address)
    except ConnectionError as exc:
        refused = any("InvalidAuthToken" in str(e) for e in iter_exceptions(exc))
        return "InvalidAuthToken" if refused else repr(exc)
    ray.shutdown()
    return "connected"

cluster_token = os.environ.pop("RAY_AUTH_TOKEN")
ray.init(address="local", num_cpus=1, include_dashboard=False)  # a new local Ray: its own token, in ~/.ray/auth_token
ray.shutdown()
os.environ["RAY_AUTH_TOKEN"] = cluster_token
got = {"as_ray_leaves_it": connect(sys.argv[1])}
reload_auth_token()
got["after_reload_auth_token"] = connect(sys.argv[1])
print(json.dumps(got))
"""


def _client(address: str, env: dict[str, str], script: str = CLIENT) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", script, address], capture_output=True, text=True, timeout=180, env=env
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


@pytest.mark.parametrize("ray_head", [0], indirect=True)
def test_after_a_local_ray_the_cluster_token_is_sent_not_the_one_ray_kept(ray_head, tmp_path):
    # HOME: the local Ray writes ~/.ray/auth_token there, not in the user's home.
    got = _client(ray_head, {**os.environ, "HOME": str(tmp_path)}, AFTER_A_LOCAL_RAY)
    # Ray 2.60 keeps the first token it loaded: the cluster refuses it. When a Ray
    # release reloads by itself this turns "connected" and reload_auth_token can go.
    assert got["as_ray_leaves_it"] == "InvalidAuthToken"
    assert got["after_reload_auth_token"] == "connected"  # what each Ray session does first
