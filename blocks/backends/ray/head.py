"""
The local Ray a ``ray`` session owns: a head of its own, outside the flow run's process group.

A Prefect process worker cancels a flow run with SIGTERM to the run's whole
process group. A Ray that ``ray.init(address="local")`` starts lives in that
group: on SIGTERM its node "drains for up to 30 seconds", so the group lives
until the worker's SIGKILL and the run is Cancelled about 33 s after the
request (Ray 2.60). So the session starts the head itself:

* ``ray start --head --block`` on 127.0.0.1 and a free port, in a new session
  (``start_new_session``): the group SIGTERM reaches only the flow process,
  whose teardown then ends the rank actors, disconnects (``ray.shutdown()``)
  and kills every process of the head's session (SIGKILL: the head's own
  SIGTERM path would drain for 30 s);
* the head's session is led by a guardian
  (:mod:`~prefect_cudf_polars.blocks.backends.ray.guardian`) that gets
  ``PR_SET_PDEATHSIG`` (Linux): if the flow process is killed (SIGKILL, no
  teardown), the guardian kills every process of the head's session. It is
  started from the session's owner thread, which outlives it (the signal
  follows the thread that created the process);
* token authentication is explicit, as for any ``ray start --head``: the head
  and this driver share a new ``RAY_AUTH_MODE=token`` / ``RAY_AUTH_TOKEN``, set
  in this process's environment while the session runs and put back after
  (``ray start --head`` turns token authentication on by itself when
  ``~/.ray/auth_token`` exists; see :mod:`~prefect_cudf_polars.blocks.backends.ray.connect`).

The guardian runs Ray's command line (``ray.scripts.scripts.main``, Ray 2.60).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

from prefect_cudf_polars.blocks.backends.compat import reload_ray_auth_token
from prefect_cudf_polars.blocks.backends.environment import apply_environment
from prefect_cudf_polars.blocks.backends.ray.connect import RayClusterError
from prefect_cudf_polars.blocks.backends.ray.guardian import kill_session

#: Seconds to wait for the head's GCS port to answer.
START_TIMEOUT_S = 60.0

#: Leads the head's session and ends it when this process's starting thread ends.
GUARDIAN = Path(__file__).with_name("guardian.py")

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


class LocalHead:
    """
    A ``ray start --head`` this session starts (on its owner thread, when built) and stops.

    Attributes
    ----------
    address : str
        ``127.0.0.1:<port>``, for ``ray.init(address=...)``.
    process : subprocess.Popen
        The ``ray start --block`` process (its process group holds the node).

    Raises
    ------
    RayClusterError
        When the head ends or does not answer within :data:`START_TIMEOUT_S` seconds.
    """

    def __init__(self) -> None:
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        # Ports of its own, so that two sessions' heads (or another Ray) on the machine do not meet.
        ports = [f"--{name}={_free_port()}"
                 for name in ("dashboard-port", "dashboard-agent-listen-port", "metrics-export-port")]
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        # What cudf-polars sets before its own ray.init (cudf-polars 26.10, engine/ray.py).
        accel = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": os.environ.get("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")}
        self._saved: dict[str, str | None] = {}  # this process's Ray token variables, put back by stop()
        self.process = subprocess.Popen(
            [sys.executable, str(GUARDIAN), str(os.getpid()), "start", "--head", "--block", "--node-ip-address",
             "127.0.0.1", "--port", str(port), "--include-dashboard=false", "--disable-usage-stats", *ports],
            env={**os.environ, **auth, "RAY_USAGE_STATS_ENABLED": "0", **accel}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            self._wait_until_it_answers(port)
        except BaseException:
            self.stop()
            raise
        self._saved = apply_environment(auth)
        reload_ray_auth_token()

    def _wait_until_it_answers(self, port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(port):
            if self.process.poll() is not None:
                said = self.process.stderr.read().decode(errors="replace")
                raise RayClusterError(f"The local Ray head for this session (ray start --head, port {port}) ended with "
                                      f"exit status {self.process.returncode} before it answered: {said[-2000:]}")
            if time.monotonic() > deadline:
                raise RayClusterError(f"The local Ray head for this session (ray start --head, port {port}) did not "
                                      f"answer within {START_TIMEOUT_S:g} s. Check that Ray runs on this machine "
                                      "(`ray start --head`), or give the block a ray_address.")
            time.sleep(0.1)

    def stop(self) -> None:
        """Kill every process of the head's session, wait for it, put this process's Ray token back (idempotent)."""
        # Ray's worker processes lead process groups of their own inside the head's
        # session (Ray 2.60), so the whole session is killed, not only the head's group.
        kill_session(self.process.pid)  # the guardian leads it
        with contextlib.suppress(subprocess.TimeoutExpired):  # a process SIGKILL could not end: nothing more to do
            self.process.wait(timeout=10)
        self.process.stderr.close()
        apply_environment(self._saved)
        reload_ray_auth_token()
