"""
The results in a task's arguments: the one walk, Prefect's own.

Every place that looks for :class:`~prefect_cudf_polars.blocks.GPUResult` values inside
arguments (the engine-call protocol, the serializer's refusal) walks them with Prefect's
:func:`~prefect.utilities.collections.visit_collection` through the two functions here,
so what counts as a container is one rule: lists, tuples, sets, dict keys and values,
dataclasses and pydantic models; a ``polars.LazyFrame`` is a leaf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect.utilities.collections import visit_collection

from prefect_cudf_polars.blocks.results import GPUResult


def results_in(obj: Any) -> list[GPUResult]:
    """
    Every :class:`GPUResult` in ``obj``, each once, in the order first met.

    The one rule for containers is Prefect's :func:`~prefect.utilities.collections.visit_collection`
    (lists, tuples, sets, dict keys and values, dataclasses, pydantic models;
    a ``polars.LazyFrame`` is a leaf).
    """
    found: dict[str, GPUResult] = {}
    replace_results(obj, lambda result: found.setdefault(result.id, result), rebuild=False)
    return list(found.values())


def replace_results(obj: Any, fn: Callable[[GPUResult], Any], *, rebuild: bool = True) -> Any:
    """
    ``obj`` with every :class:`GPUResult` replaced by ``fn(result)``: one walk, ``fn`` once per distinct result.

    Containers are rebuilt only where something inside them changed; with ``rebuild=False`` nothing is
    rebuilt and ``None`` is returned.

    Raises
    ------
    Exception
        Whatever ``fn`` raises.
    """
    replaced: dict[str, Any] = {}

    def visit(value: Any) -> Any:
        if not isinstance(value, GPUResult):
            return value
        if value.id not in replaced:
            replaced[value.id] = fn(value)
        return replaced[value.id]

    return visit_collection(obj, visit, return_data=rebuild)
