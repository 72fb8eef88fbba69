"""
Readable task run names: a GPU task run is named after the query it runs.

Prefect's default task run name is the task name plus a random suffix
(``cudf-polars-execute-3f1``), which says nothing about the query. These
callables are the default ``task_run_name`` of the package's tasks; pass
``task_run_name=`` (to ``gpu_task`` or ``.with_options``) to override them.
Prefect calls them with the task run's parameters
(``prefect._internal.engine.resolve_custom_task_run_name``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect_cudf_polars.blocks.results.result import GPUResult


def _query_name(query: Any) -> str | None:
    return query.name if isinstance(query, GPUResult) else None


def execute_run_name(parameters: dict[str, Any]) -> str:
    """``execute``: the ``name`` argument, else the input result's name, else ``"execute-query"``."""
    return parameters.get("name") or _query_name(parameters.get("query")) or "execute-query"


def collect_run_name(parameters: dict[str, Any]) -> str:
    """``collect``: ``"collect-<input result's name>"``, or ``"collect-query"`` for a LazyFrame."""
    return f"collect-{_query_name(parameters.get('query')) or 'query'}"


def fixed_run_name(name: str) -> Callable[..., str]:
    """A ``task_run_name`` callable that returns ``name`` (a ``gpu_task``'s query name)."""

    def run_name(parameters: dict[str, Any]) -> str:
        return name

    run_name.__name__ = f"run_name_{name}"
    return run_name
