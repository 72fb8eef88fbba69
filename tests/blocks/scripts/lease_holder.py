"""
Hold a worker-state lease on an external Dask cluster, then wait to be killed.

``python lease_holder.py SCHEDULER UID``: connects a client, puts stand-ins for
cudf-polars' per-engine state on every worker (the attribute
``_cudf_polars_mp_context_{UID}`` and an entry in a per-process ``stores`` dict,
like ``rank_local_store._stores``), registers the lease with the cleanup below,
prints ``READY <client id>`` and sleeps until killed.

``tests/blocks/test_dask_lease.py`` runs it as a file and imports it for the
same helpers. The helpers reach the workers by value (this file is
``__main__`` here, and registered with cloudpickle by value in the test), so the
workers need neither this file nor ``prefect_cudf_polars``.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any

STORES_MODULE = "_lease_test_stores"


def _stores() -> dict[str, list[str]]:
    """This worker process's stand-in for ``rank_local_store._stores``."""
    module = sys.modules.get(STORES_MODULE)
    if module is None:
        module = types.ModuleType(STORES_MODULE)
        module.stores = {}
        sys.modules[STORES_MODULE] = module
    return module.stores


def plant(uid: str, dask_worker: Any = None) -> None:
    """On a worker: the per-engine attribute and a stored partition for ``uid``."""
    setattr(dask_worker, f"_cudf_polars_mp_context_{uid}", {"uid": uid})
    _stores()[uid] = ["partition"]


def held(uid: str, dask_worker: Any = None) -> bool:
    """On a worker: whether any state of ``uid`` is still there."""
    return hasattr(dask_worker, f"_cudf_polars_mp_context_{uid}") or uid in _stores()


def project_importable() -> bool:
    """Whether ``prefect_cudf_polars`` imports in this process (the cluster's must not)."""
    import importlib

    try:
        importlib.import_module("prefect_cudf_polars")
    except ImportError:
        return False
    return True


def cleanup_for(uid: str):
    """The cleanup the lease runs on each worker (a closure, so it pickles by value)."""

    def cleanup(dask_worker: Any = None) -> None:
        _stores().pop(uid, None)
        attr = f"_cudf_polars_mp_context_{uid}"
        if hasattr(dask_worker, attr):
            delattr(dask_worker, attr)

    return cleanup


def main(address: str, uid: str) -> None:
    from distributed import Client

    from prefect_cudf_polars.blocks.backends.dask import lease as dask_lease

    client = Client(address, timeout=30)
    client.run(plant, uid=uid)
    dask_lease.hold(client, cleanup_for(uid), f"prefect-cudf-polars-lease-{uid}")
    print(f"READY {client.id}", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
