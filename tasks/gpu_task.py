"""
``gpu_task``: turn a function that builds a LazyFrame into a Prefect task that runs it on the GPU.

An ``async def`` function becomes an async task, for async flows: the task
awaits the function for its LazyFrame, then awaits the engine call's future on
the event loop (no thread of its own), so the loop keeps running while the
engine works; the session still runs engine calls one at a time on its owner
thread. A timeout or cancellation while the call runs releases its result the
moment the call returns, as for a sync task.

``defer=True`` makes a deferred step: its task run builds and checks the query
and returns a deferred ``GPUResult`` holding the plan; the task that reads it
runs both steps in one engine call (:meth:`EngineSession.defer
<prefect_cudf_polars.blocks.EngineSession.defer>`). Every run goes through the
one engine-call protocol (:class:`~prefect_cudf_polars.tasks.calls.EngineCall`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, overload

import polars as pl
from prefect import Task

from prefect_cudf_polars.blocks.lineage import Lineage
from prefect_cudf_polars.tasks.calls import EngineCall
from prefect_cudf_polars.tasks.gpu_task_type import GPUTask
from prefect_cudf_polars.tasks.run_names import gpu_task_run_name
from prefect_cudf_polars.tasks.task_defaults import gpu_task_defaults, persistence_requests, warn_if_persistence_requested


@overload
def gpu_task(fn: Callable[..., pl.LazyFrame], /) -> Task[..., Any]: ...


@overload
def gpu_task(*, collect: bool = False, defer: bool = False,
             **task_options: Any) -> Callable[[Callable[..., pl.LazyFrame]], Task[..., Any]]: ...


def gpu_task(fn: Callable[..., pl.LazyFrame] | None = None, /, *, collect: bool = False, defer: bool = False,
             **task_options: Any) -> Any:
    """
    Make a Prefect task of a function that returns a ``polars.LazyFrame``.

    The function receives its arguments as given (call ``.lazy()`` on
    :class:`GPUResult` arguments to chain onto them) and returns a LazyFrame;
    the task runs it on the flow run's engine session and returns a
    :class:`GPUResult` (or, with ``collect=True``, a host ``polars.DataFrame``).
    An ``async def`` function makes an async task: await it in async flows (the
    engine call is awaited on the event loop, so the loop keeps running),
    or ``.submit()`` it from sync ones.

    Parameters
    ----------
    fn
        The function, sync or ``async def`` (when used as ``@gpu_task`` without
        parentheses).
    collect
        Return a host ``polars.DataFrame`` instead of a GPUResult.
    defer
        Make a deferred step: the task run builds the query, resolves its
        schema (a column that does not exist fails this task run) and checks
        its plan (on the ``cpu`` backend, as cudf-polars would), runs nothing
        on the engine, and returns a deferred GPUResult holding the plan. The
        task that reads it runs this step's plan and its own in one engine
        call, and its ``result.created`` event lists this step among its
        ``fused_steps``; the inputs this step read
        are freed after that call. The same rules as any result apply (read
        once, this session only, released at the flow run's end, retries
        replay it). Default False.
    **task_options
        Prefect task options (``name``, ``retries``, ``retry_delay_seconds``,
        ``tags``, ``task_run_name``, ``timeout_seconds``, ...). Defaults: task runs
        named after the query (the task name), no
        persistence, no input caching (see
        :mod:`~prefect_cudf_polars.tasks.task_defaults`); asking for persistence
        logs a warning on each task run and persists nothing. With ``retries``,
        a retry whose earlier attempt read a GPU input recomputes that input
        from its lineage (:mod:`~prefect_cudf_polars.tasks.calls`); your
        ``retry_condition_fn`` runs after the check that stops retrying when the
        input cannot be recomputed.

    Returns
    -------
    prefect.Task
        Calling it in a flow runs it; ``.submit()`` and ``.map()`` work as usual
        (mapped runs are named apart: the name, then ``-1``, ``-2``, ...).

    Raises
    ------
    ValueError
        At decoration, for ``collect=True`` with ``defer=True``.
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
    NotImplementedError, DeviceMemoryError, SessionError
        At run time, from the engine call, as for
        :func:`~prefect_cudf_polars.tasks.execute`.
    polars.exceptions.PolarsError, NotImplementedError
        At run time, with ``defer``: the query's schema cannot be resolved
        (polars' own error, for example ``ColumnNotFoundError``), or
        its plan is refused (see :meth:`EngineSession.defer
        <prefect_cudf_polars.blocks.EngineSession.defer>`).

    Examples
    --------
    >>> import polars as pl
    >>> from prefect_cudf_polars.tasks import gpu_task
    >>> @gpu_task(retries=1)
    ... def late_flights(flights):
    ...     return flights.lazy().filter(pl.col("dep_delay") > 60)
    """

    if collect and defer:
        raise ValueError("gpu_task(collect=True, defer=True): a collecting step returns host data, so it cannot be "
                         "deferred. Defer the steps before it; the collecting step runs them fused with its own query.")

    def decorate(user_fn: Callable[..., Any]) -> Task[..., Any]:
        # A decorator made once may decorate several functions: task_options is not changed.
        name = task_options.get("name", user_fn.__name__)
        requested = persistence_requests(task_options)  # GPU results are never persisted

        def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[EngineCall, dict[str, Any]]:
            """The run's engine call, and the keywords of its ``collect`` or ``execute``."""
            if collect:
                return EngineCall((args, kwargs)), {"name": name}
            warn_if_persistence_requested(requested)
            lineage = Lineage(user_fn, args, kwargs, label=f"gpu_task {name!r}", deferred=defer)
            return EngineCall((args, kwargs)), {"name": name, "lineage": lineage, "defer": defer}

        if inspect.iscoroutinefunction(user_fn):

            @functools.wraps(user_fn)
            async def run_on_engine(*args: Any, **kwargs: Any) -> Any:
                call, how = start(args, kwargs)
                with call:
                    lf = await user_fn(*call.args[0], **call.args[1])
                    return await (call.collect_async if collect else call.execute_async)(lf, **how)

        else:

            @functools.wraps(user_fn)
            def run_on_engine(*args: Any, **kwargs: Any) -> Any:
                call, how = start(args, kwargs)
                with call:
                    return (call.collect if collect else call.execute)(user_fn(*call.args[0], **call.args[1]), **how)

        # Prefect binds a task's arguments to its function's signature on every call; inspect's answer, once.
        run_on_engine.__signature__ = inspect.signature(user_fn)  # type: ignore[attr-defined]
        # Task runs are named after the query (the task's name) unless overridden.
        options = {**gpu_task_defaults(returns_gpu_result=not collect), "task_run_name": gpu_task_run_name(name),
                   **task_options, "name": name}
        if requested and not collect:
            # A GPU result is never persisted: keep Prefect from pickling it (or its
            # inputs, for a cache key) and warn on each task run instead.
            options = {k: v for k, v in options.items() if k not in ("result_storage_key", "cache_key_fn")}
            options.update(gpu_task_defaults())
        return GPUTask(fn=run_on_engine, **options)

    return decorate if fn is None else decorate(fn)
