"""``gpu_task``: turn a function that builds a LazyFrame into a Prefect task that runs it on the GPU."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, overload

import polars as pl
from prefect import Task

from prefect_cudf_polars.blocks import get_engine_session
from prefect_cudf_polars.blocks.monitoring.run_names import fixed_run_name
from prefect_cudf_polars.blocks.results.lineage import Lineage
from prefect_cudf_polars.blocks.results.walker import gpu_results_in
from prefect_cudf_polars.tasks.gpu_task_type import GPUTask
from prefect_cudf_polars.tasks.inputs import drop_claimed
from prefect_cudf_polars.tasks.retry_inputs import combined_retry_condition, recompute_for_retry
from prefect_cudf_polars.tasks.task_defaults import (
    gpu_task_defaults,
    persistence_requests,
    warn_if_persistence_requested,
)


@overload
def gpu_task(fn: Callable[..., pl.LazyFrame], /) -> Task[..., Any]: ...


@overload
def gpu_task(
    *, collect: bool = False, **task_options: Any
) -> Callable[[Callable[..., pl.LazyFrame]], Task[..., Any]]: ...


def gpu_task(
    fn: Callable[..., pl.LazyFrame] | None = None,
    /,
    *,
    collect: bool = False,
    **task_options: Any,
) -> Any:
    """
    Make a Prefect task of a function that returns a ``polars.LazyFrame``.

    The function receives its arguments as given (call ``.lazy()`` on
    :class:`GPUResult` arguments to chain onto them) and returns a LazyFrame;
    the task runs it on the flow run's engine session and returns a
    :class:`GPUResult` (or, with ``collect=True``, a host ``polars.DataFrame``).

    Parameters
    ----------
    fn
        The function (when used as ``@gpu_task`` without parentheses).
    collect
        Return a host ``polars.DataFrame`` instead of a GPUResult.
    **task_options
        Prefect task options (``name``, ``retries``, ``retry_delay_seconds``,
        ``tags``, ``task_run_name``, ``timeout_seconds``, ...). Defaults: task runs
        named after the query (the task name), no
        persistence, no input caching (see
        :mod:`~prefect_cudf_polars.tasks.task_defaults`); asking for persistence
        logs a warning on each task run and persists nothing. With ``retries``,
        a retry whose earlier attempt read a GPU input recomputes that input
        from its lineage (:mod:`~prefect_cudf_polars.tasks.retry_inputs`); your
        ``retry_condition_fn`` runs after the check that stops retrying when the
        input cannot be recomputed.

    Returns
    -------
    prefect.Task
        Calling it in a flow runs it; ``.submit()`` and ``.map()`` work as usual.

    Raises
    ------
    TypeError
        At run time, if the function does not return a LazyFrame.
    NoEngineSessionError
        At run time, if the flow run has no engine session.
    ResultReleasedError, ResultConsumedError, WrongEngineError
        At run time, before the function is called, if a GPUResult argument
        cannot be read in this session.
    CannotRecomputeError
        At run time, on a retry, if an input the failed attempt read cannot be
        recomputed from its lineage (the task run then fails without more retries).

    Examples
    --------
    >>> import polars as pl
    >>> from prefect_cudf_polars.tasks import gpu_task
    >>> @gpu_task(retries=1)
    ... def late_flights(flights):
    ...     return flights.lazy().filter(pl.col("dep_delay") > 60)
    """

    def decorate(user_fn: Callable[..., pl.LazyFrame]) -> Task[..., Any]:
        name = task_options.pop("name", user_fn.__name__)
        requested = persistence_requests(task_options)  # GPU results are never persisted

        @functools.wraps(user_fn)
        def run_on_engine(*args: Any, **kwargs: Any) -> Any:
            if not collect:
                warn_if_persistence_requested(requested)
            session = get_engine_session()
            lineage = Lineage(user_fn, args, kwargs, label=f"gpu_task {name!r}")
            fresh: list[Any] = []
            try:
                args, kwargs = recompute_for_retry((args, kwargs), session, fresh)
            except BaseException:
                drop_claimed(fresh, release_live=True)
                raise
            inputs = gpu_results_in((args, kwargs))
            try:
                for result in inputs:
                    result.check_readable()
                lf = user_fn(*args, **kwargs)
                if not isinstance(lf, pl.LazyFrame):
                    raise TypeError(
                        f"gpu_task {name!r} must return a polars LazyFrame (the query to "
                        f"run on the GPU), but returned {type(lf).__name__}. Build the "
                        "query with .lazy() on the inputs and return it uncollected."
                    )
                if collect:
                    return session.collect(lf)
                return session.execute(lf, name=name, lineage=lineage)
            finally:
                drop_claimed(inputs)
                drop_claimed(fresh, release_live=True)

        options = {
            **gpu_task_defaults(returns_gpu_result=not collect),
            # Task runs are named after the query (the task's name) unless overridden.
            "task_run_name": fixed_run_name(name),
            **task_options,
        }
        options["retry_condition_fn"] = combined_retry_condition(
            task_options.get("retry_condition_fn")
        )
        if requested and not collect:
            # A GPU result is never persisted: keep Prefect from pickling it (or its
            # inputs, for a cache key) and warn on each task run instead.
            options.pop("result_storage_key", None)
            options.pop("cache_key_fn", None)
            options.update(gpu_task_defaults())
        return GPUTask(fn=run_on_engine, name=name, **options)

    if fn is not None:
        return decorate(fn)
    return decorate
