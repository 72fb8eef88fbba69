"""Task arguments that carry queries: LazyFrames and GPU results, checked before any engine call."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from prefect_cudf_polars.tasks.result import GPUResult


def iter_gpu_results(obj: Any, _depth: int = 0) -> Iterator[GPUResult]:
    """
    Every :class:`GPUResult` in ``obj`` and the lists, tuples, sets and dicts inside it.

    Dict keys are searched too (a GPUResult is hashable). Containers are
    searched 20 levels deep at most.
    """
    if isinstance(obj, GPUResult):
        yield obj
    elif _depth < 20 and isinstance(obj, Mapping):
        for value in (*obj.keys(), *obj.values()):
            yield from iter_gpu_results(value, _depth + 1)
    elif _depth < 20 and isinstance(obj, (list, tuple, set, frozenset)):
        for value in obj:
            yield from iter_gpu_results(value, _depth + 1)


def as_query(query: Any, *, task: str) -> pl.LazyFrame:
    """
    The LazyFrame to run for a task's ``query`` argument.

    Parameters
    ----------
    query
        A ``polars.LazyFrame``, or a :class:`GPUResult` (claimed here).
    task
        The task's name, for the error message.

    Raises
    ------
    TypeError
        If ``query`` is neither (for example an eager ``polars.DataFrame``).
    ResultReleasedError, ResultConsumedError, WrongEngineError
        From :meth:`GPUResult.lazy`.
    """
    if isinstance(query, GPUResult):
        return query.lazy()
    if isinstance(query, pl.LazyFrame):
        return query
    hint = " (call .lazy() on it)" if isinstance(query, pl.DataFrame) else ""
    raise TypeError(
        f"{task} takes a polars LazyFrame or a GPUResult, not {type(query).__name__}"
        f"{hint}."
    )


def drop_claimed(results: list[GPUResult], *, release_live: bool = False) -> None:
    """
    Free whatever claimed inputs left in the engine's store.

    A claimed input is normally moved out when the query runs; when the user's
    function or the engine failed after the claim, its partitions would stay
    in GPU memory until the session ends. Live (unclaimed) inputs are left
    alone, unless ``release_live`` (inputs a retry recomputed for itself, which
    no other task can hold).
    """
    for result in results:
        if result.state == "consumed":
            result._drop()
        elif release_live and result.state == "live":
            result.release()
