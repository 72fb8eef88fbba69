"""
``gpu_task``: turn a function that builds a LazyFrame into a Prefect task that runs it on the GPU.

An ``async def`` function becomes an async task, for async flows: the task
awaits the function for its LazyFrame, then awaits the engine call in a worker
thread (``asyncio.to_thread``), so the flow's event loop keeps running while
the engine works; the session still runs engine calls one at a time on its
owner thread.

``defer=True`` makes a deferred step: its task run builds and checks the query
and returns a deferred ``GPUResult`` holding the plan; the task that reads it
runs both steps in one engine call (:meth:`EngineSession.defer
<prefect_cudf_polars.blocks.EngineSession.defer>`). Every run goes through the
one engine-call protocol (:class:`~prefect_cudf_polars.tasks.calls.EngineCall`).
"""

from __future__ import annotations

import asyncio
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
    engine call is awaited in a worker thread, so the event loop keeps running),
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
        raise ValueError(
            "gpu_task(collect=True, defer=True): a collecting step returns host data, so it "
            "cannot be deferred. Defer the steps before it; the collecting step runs them "
            "fused with its own query."
        )

    def decorate(user_fn: Callable[..., Any]) -> Task[..., Any]:
        # A decorator made once may decorate several functions: task_options is not changed.
        name = task_options.get("name", user_fn.__name__)
        prefect_options = {k: v for k, v in task_options.items() if k != "name"}
        requested = persistence_requests(prefect_options)  # GPU results are never persisted

        def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[EngineCall, Lineage]:
            if not collect:
                warn_if_persistence_requested(requested)
            return EngineCall((args, kwargs)), Lineage(user_fn, args, kwargs, label=f"gpu_task {name!r}", deferred=defer)

        def run(call: EngineCall, lineage: Lineage, lf: Any) -> Any:
            if collect:
                return call.collect(lf, name=name)
            return call.execute(lf, name=name, lineage=lineage, defer=defer)

        if inspect.iscoroutinefunction(user_fn):

            @functools.wraps(user_fn)
            async def run_on_engine(*args: Any, **kwargs: Any) -> Any:
                # Every step that may wait for the engine runs off the event loop (in a copy
                # of this context); the engine calls still queue on its owner thread.
                call, lineage = await asyncio.to_thread(start, args, kwargs)
                try:
                    a, k = call.args
                    return await asyncio.to_thread(run, call, lineage, await user_fn(*a, **k))
                finally:
                    await asyncio.to_thread(call.finish)

        else:

            @functools.wraps(user_fn)
            def run_on_engine(*args: Any, **kwargs: Any) -> Any:
                call, lineage = start(args, kwargs)
                with call:
                    a, k = call.args
                    return run(call, lineage, user_fn(*a, **k))

        options = {
            **gpu_task_defaults(returns_gpu_result=not collect),
            # Task runs are named after the query (the task's name) unless overridden.
            "task_run_name": gpu_task_run_name(name),
            **prefect_options,
        }
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
