"""
Readable task run names: a GPU task run is named after the query it runs.

Prefect's default task run name is the task name plus a random suffix
(``cudf-polars-execute-3f1``), which says nothing about the query. These
callables are the default ``task_run_name`` of the package's tasks; pass
``task_run_name=`` (to ``gpu_task`` or ``.with_options``) to override them.
Prefect calls them with the task run's parameters
(``prefect._internal.engine.resolve_custom_task_run_name``).

Runs are named apart within an engine session, as Prefect names its own runs
(the task's name, then ``-`` and a suffix): the first run of a name keeps it
(``execute(lf, name="trips")`` runs as ``trips``), later ones get ``-1``,
``-2``, ... (four mapped ``doubled`` runs: ``doubled``, ``doubled-1``,
``doubled-2``, ``doubled-3``). Prefect 3.9 gives a task run's name callable its
parameters only, no map index, and its own suffix for local runs is random
(``dynamic_key[:3]`` of a UUID), so the session counts the names it gave.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from prefect_cudf_polars.blocks.active import active_session_or_none
from prefect_cudf_polars.blocks.results.result import GPUResult


class RunNames:
    """The task run names given in one session, counted per name."""

    def __init__(self) -> None:
        self._given: dict[str, int] = {}
        self._lock = threading.Lock()

    def distinct(self, base: str) -> str:
        """``base`` the first time, then ``base-1``, ``base-2``, ..."""
        with self._lock:
            n = self._given.get(base, 0)
            self._given[base] = n + 1
        return base if n == 0 else f"{base}-{n}"


#: Each open session's names; an ended session's entry goes with it.
_NAMES: weakref.WeakKeyDictionary[Any, RunNames] = weakref.WeakKeyDictionary()
_NAMES_LOCK = threading.Lock()


def distinct_run_name(base: str) -> str:
    """
    ``base``, or ``base-<n>`` when the active session already named a run ``base``.

    Outside a session, ``base`` itself.
    """
    session = active_session_or_none()
    if session is None:
        return base
    with _NAMES_LOCK:
        names = _NAMES.get(session)
        if names is None:
            names = _NAMES[session] = RunNames()
    return names.distinct(base)


def _query_name(query: Any) -> str | None:
    return query.name if isinstance(query, GPUResult) else None


def execute_run_name(parameters: dict[str, Any]) -> str:
    """``execute``: the ``name`` argument, else the input result's name, else ``"execute-query"``."""
    return distinct_run_name(
        parameters.get("name") or _query_name(parameters.get("query")) or "execute-query"
    )


def collect_run_name(parameters: dict[str, Any]) -> str:
    """``collect``: ``"collect-<input result's name>"``, or ``"collect-query"`` for a LazyFrame."""
    return distinct_run_name(f"collect-{_query_name(parameters.get('query')) or 'query'}")


def gpu_task_run_name(name: str) -> Callable[..., str]:
    """A ``task_run_name`` callable that returns ``name`` (a ``gpu_task``'s query name), named apart."""

    def run_name(parameters: dict[str, Any]) -> str:
        return distinct_run_name(name)

    run_name.__name__ = f"run_name_{name}"
    return run_name
