"""
Room on the engine's demand: the memory resource through which a running query asks for held results to move out.

On ``spmd`` with a ``device_memory_limit`` and ``spill_results="host"``, the
engine's memory resource (cudf-polars 26.10's ``memory_resource_config``) is
rmm's ``FailureCallbackResourceAdaptor`` over the limit's
``LimitingResourceAdaptor``. When an allocation would pass the limit, on
whichever thread makes it, the adaptor asks the engine host's ledger for room
(:meth:`~prefect_cudf_polars.blocks.memory.MemoryLedger.on_demand`), which
moves unread held results into pinned host memory, and tries the allocation
again while the ledger freed something. cudf-polars builds the resource from
its configuration by qualified name (``MemoryResourceConfig``, options as
JSON), so the configuration carries a key into this module's table of askers.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

#: Key -> what answers "free this many bytes" with the bytes it freed (any: try again).
_ASKERS: dict[str, Callable[[int], int]] = {}


def resource_config(upstream: dict[str, Any], key: str) -> dict[str, Any]:
    """
    The ``MemoryResourceConfig`` fields (``qualname``, ``options``) of an adaptor over ``upstream`` that asks ``key``.

    Parameters
    ----------
    upstream : dict
        The configuration of the resource it wraps (``qualname`` and ``options``).
    key : str
        What :func:`listen` returned.
    """
    return {"qualname": f"{__name__}.{failure_callback_resource.__name__}",
            "options": {"upstream_mr": upstream, "key": key}}


def failure_callback_resource(upstream_mr: Any, key: str) -> Any:
    """rmm's ``FailureCallbackResourceAdaptor`` over ``upstream_mr`` asking ``key``'s listener (built by cudf-polars)."""
    import rmm.mr

    return rmm.mr.FailureCallbackResourceAdaptor(upstream_mr, functools.partial(ask, key))


def ask(key: str, nbytes: int) -> bool:
    """An allocation of ``nbytes`` bytes failed: whether ``key``'s listener freed something (then rmm tries again)."""
    listener = _ASKERS.get(key)
    return listener is not None and listener(nbytes) > 0


def listen(listener: Callable[[int], int], stack: ExitStack) -> str:
    """Answer the asks of a resource built with the returned key by ``listener`` until ``stack`` closes."""
    key = uuid.uuid4().hex
    _ASKERS[key] = listener
    stack.callback(_ASKERS.pop, key, None)
    return key
