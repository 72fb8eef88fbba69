"""
A lease on an external Dask cluster: the scheduler drops our workers' state when our client leaves.

Why
---
On an external cluster (``dask_scheduler_address``) cudf-polars keeps, per
worker and per engine ``uid`` (``DaskEngine._dask_ctx.rapidsmpf_id``), the
attribute ``_cudf_polars_mp_context_{uid}`` (streaming Context, memory
resource) and the persisted result partitions in
``cudf_polars.engine.rank_local_store._stores[uid]``. ``DaskEngine.shutdown()``
removes both with ``client.run(functools.partial(_teardown_worker, uid=uid))``
(cudf-polars 26.10, ``engine/dask.py``). A SIGKILLed flow process runs no code,
so without a lease the cluster would hold that state (and its GPU memory)
until the workers restart.

How
---
:class:`WorkerStateLease` is a ``SchedulerPlugin`` that our client registers on
the scheduler (:func:`hold`). It knows our client's id and a cleanup callable,
pickled on our side. When the scheduler removes that client
(``Scheduler.remove_client`` calls every plugin's ``remove_client``), the lease
sends the cleanup to every worker with the scheduler's own ``broadcast`` of op
``"run"``, the message ``Client.run`` sends (distributed 2026.8,
``client.py`` ``Client._run``), logs the outcome on the ``distributed.scheduler``
logger and removes itself. A normal session end calls :func:`release` before
closing the client, so a clean close broadcasts nothing.

The scheduler unpickles the plugin: this module is registered with
``cloudpickle.register_pickle_by_value`` and imports only the standard library
and ``distributed``, so the scheduler needs neither ``prefect_cudf_polars`` nor
cudf-polars (the cleanup stays bytes until a worker runs it).

Bounds
------
* SIGKILL, OOM kill, crash: the OS closes the dead process's sockets, the
  scheduler reads end-of-stream and removes the client at once;
  ``tests/blocks/test_dask_lease.py`` measures well under a second on CPU.
* The client's host vanishes without closing its sockets (power loss, network
  cut): distributed sets TCP keep-alive on every comm from
  ``distributed.comm.timeouts.tcp`` (default ``30s`` in ``distributed.yaml``;
  ``comm/tcp.py`` ``set_tcp_timeout``: 10 s idle, then 10 probes 2 s apart), so
  the scheduler drops the client after about 30 s of silence. The scheduler
  does not time clients out on missed heartbeats. While it has unacknowledged
  data queued for the client, the kernel's retransmission timeout
  (``net.ipv4.tcp_retries2``, about 15 min on Linux) applies instead.
* Any removal of our client counts, a transient network drop included: the
  client reconnects with the same id but its workers' state is gone, and the
  session's later queries fail.
* The lease is registered right after the engine is built; a kill in between
  (milliseconds) is not covered.

Ray needs no lease: cudf-polars' ``RankActor`` actors are created without
``lifetime="detached"`` (26.10, ``engine/ray.py``), and Ray terminates an actor
"if the original creator process dies"; only detached actors must be destroyed
by hand (https://docs.ray.io/en/latest/ray-core/actors/terminating-actors.html).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol.pickle import dumps

# Travel by value: the scheduler need not have prefect_cudf_polars installed.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class WorkerStateLease(SchedulerPlugin):
    """
    Scheduler plugin: run ``cleanup`` on every worker once ``client_id`` leaves.

    Parameters
    ----------
    client_id
        The client whose departure ends the lease (``Client.id``).
    cleanup
        Run on each worker as ``Client.run`` would (``dask_worker`` is passed
        when it takes that argument). Pickled here with
        ``distributed.protocol.pickle.dumps``, unpickled only on the workers.
    name
        The plugin's name on the scheduler, unique per lease.
    """

    def __init__(self, client_id: str, cleanup: Callable[..., Any], name: str) -> None:
        self.client_id, self.name = client_id, name
        self.cleanup_name = getattr(cleanup, "func", cleanup).__qualname__
        self._cleanup = dumps(cleanup)
        self._task: asyncio.Task | None = None

    def remove_client(self, scheduler: Any, client: str) -> None:
        """Called by the scheduler for each client that leaves; acts on ours, once."""
        if client != self.client_id or self._task is not None:
            return
        # The plugin stays registered (and so referenced) until the task ends.
        self._task = asyncio.get_running_loop().create_task(self._run_cleanup(scheduler))

    async def _run_cleanup(self, scheduler: Any) -> None:
        log = logging.getLogger("distributed.scheduler")
        try:
            msg = {"op": "run", "function": self._cleanup, "args": dumps(()), "kwargs": dumps({}), "wait": True}
            responses = await scheduler.broadcast(msg=msg, on_error="return")
            failed = {worker: (r.get("exception_text") if isinstance(r, dict) else repr(r))
                      for worker, r in responses.items() if not (isinstance(r, dict) and r.get("status") == "OK")}
            log.info("Lease %s: client %s left; ran %s on %d workers, %d failed%s", self.name, self.client_id,
                     self.cleanup_name, len(responses), len(failed), f": {failed}" if failed else "")
        except Exception:
            log.exception("Lease %s: cleanup after client %s failed", self.name, self.client_id)
        finally:
            if self.name in scheduler.plugins:
                scheduler.remove_plugin(self.name)


def hold(client: Any, cleanup: Callable[..., Any], name: str) -> None:
    """
    Register a :class:`WorkerStateLease` for ``client`` on its scheduler.

    Parameters
    ----------
    client
        Our ``distributed.Client``; its departure runs ``cleanup``.
    cleanup
        Callable to run on every worker (see :class:`WorkerStateLease`).
    name
        Plugin name, unique per lease (e.g. ``prefect-cudf-polars-lease-{uid}``), for :func:`release`.
    """
    client.register_plugin(WorkerStateLease(client.id, cleanup, name), name=name)


def release(client: Any, name: str) -> None:
    """Unregister the lease (before a normal client close, so nothing is broadcast); never raises."""
    try:
        client.unregister_scheduler_plugin(name)
    except Exception as exc:  # the scheduler is gone, or the lease was spent: nothing left to drop
        logging.getLogger("distributed.client").debug("Lease %s not unregistered: %s", name, exc)
