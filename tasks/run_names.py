"""
Readable task run names: a GPU task run is named after the query it runs.

Prefect's default task run name is the task name plus a random suffix, which
says nothing about the query. These callables are the default
``task_run_name`` of the package's tasks (pass ``task_run_name=`` to override
them); Prefect calls them with the task run's parameters
(``prefect._internal.engine.resolve_custom_task_run_name``, Prefect 3.9).

Runs are named apart within a flow run, as Prefect names its own runs: the
first run of a name keeps it (``execute(lf, name="trips")`` runs as ``trips``),
later ones get ``-1``, ``-2``, ... in the order their names are given, whether
they are called or submitted. The counts belong to the flow run's session
provider (its task runner, or its ``with block.session():``), which exists
before the engine starts, so the first runs are counted too.
"""

from __future__ import annotations

import inspect
import itertools
import threading
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from prefect_cudf_polars.blocks import GPUResult
from prefect_cudf_polars.blocks.active import innermost

# Per provider (by id; a task runner compares by value, so it is no dict key), dropped with it.
_counters: dict[int, dict[str, itertools.count[int]]] = {}
_lock = threading.Lock()


def distinct_run_name(base: str) -> str:
    """``base`` the first time in this flow run, then ``base-1``, ``base-2``, ... (``base`` outside any)."""
    provider = innermost()
    if provider is None:
        return base
    with _lock:
        counts = _counters.get(id(provider))
        if counts is None:
            counts = _counters[id(provider)] = {}
            weakref.finalize(provider, _counters.pop, id(provider), None)
        n = next(counts.setdefault(base, itertools.count()))
    return base if n == 0 else f"{base}-{n}"


def _signed(fn: Callable[..., str]) -> Callable[..., str]:
    """``fn`` with its signature set up front: Prefect 3.9 inspects a run-name function's on every task run."""
    fn.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return fn


def result_name(query: Any) -> str | None:
    """``query``'s name when it is a :class:`GPUResult`, else ``None``."""
    return query.name if isinstance(query, GPUResult) else None


@_signed
def execute_run_name(parameters: dict[str, Any]) -> str:
    """``execute``: the ``name`` argument, else the input result's name, else ``"execute-query"``."""
    return distinct_run_name(parameters.get("name") or result_name(parameters.get("query")) or "execute-query")


@_signed
def collect_run_name(parameters: dict[str, Any]) -> str:
    """``collect``: ``"collect-<input result's name>"``, or ``"collect-query"`` for a LazyFrame."""
    return distinct_run_name(f"collect-{result_name(parameters.get('query')) or 'query'}")


@_signed
def tee_run_name(parameters: dict[str, Any]) -> str:
    """``tee``: ``"tee-<input result's name>"``."""
    return distinct_run_name(f"tee-{result_name(parameters.get('result')) or 'result'}")


def gpu_task_run_name(name: str) -> Callable[..., str]:
    """A ``task_run_name`` callable that returns ``name`` (a ``gpu_task``'s query name), named apart."""
    return _signed(partial(distinct_run_name, name))
