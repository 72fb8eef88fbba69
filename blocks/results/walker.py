"""
The one walker over task arguments: where the GPU results are in them.

Task arguments hold results at any depth: ``f(r)``, ``f([r1, r2])``,
``f({"left": r1})``, ``f(config_model)``. Every part of the package that looks
for results in arguments (the checks before an engine call, lineage and its
replay, the drops after a call, the serializer) walks them here, with one rule
for containers: Prefect's :func:`prefect.utilities.collections.visit_collection`,
the walker Prefect itself uses to find futures in task parameters. It descends
into lists, tuples (named tuples too), sets, dict keys and values, dataclasses
and pydantic models, and stops at everything else (a ``polars.LazyFrame`` is a
leaf). A result used as a dict key is found, and replaced, like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prefect.utilities.collections import visit_collection

from prefect_cudf_polars.blocks.results.result import GPUResult

T = TypeVar("T")


def instances_in(obj: Any, kind: type[T]) -> list[T]:
    """
    Every instance of ``kind`` in ``obj``, each object once, in the order first met.

    Parameters
    ----------
    obj : Any
        A value or a container of values (a task's ``(args, kwargs)``).
    kind : type
        The class to look for (``GPUResult``, ``polars.LazyFrame``).

    Returns
    -------
    list
    """
    found: dict[int, T] = {}

    def visit(value: Any) -> None:
        if isinstance(value, kind):
            found.setdefault(id(value), value)

    visit_collection(obj, visit, return_data=False)
    return list(found.values())


def gpu_results_in(obj: Any) -> list[GPUResult]:
    """Every :class:`GPUResult` in ``obj``, each once (see :func:`instances_in`)."""
    return instances_in(obj, GPUResult)


def replace_gpu_results(obj: Any, fn: Callable[[GPUResult], Any]) -> Any:
    """
    ``obj`` with every :class:`GPUResult` in it replaced by ``fn(result)``.

    ``fn`` is called once per distinct result: a result that appears twice is
    replaced by the same value in both places. Containers are rebuilt only
    where something inside them changed, so a value without results comes
    back as the very same object.

    Parameters
    ----------
    obj : Any
        A value or a container of values.
    fn : callable
        Maps a result to its replacement.

    Returns
    -------
    Any
        ``obj`` rebuilt.

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

    return visit_collection(obj, visit, return_data=True)
