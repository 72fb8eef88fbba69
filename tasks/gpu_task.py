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
<prefect_cudf_polars.blocks.EngineSession.defer>`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any, overload

import polars as pl
from prefect import Task

from prefect_cudf_polars.blocks import get_engine_session
from prefect_cudf_polars.blocks.monitoring.run_names import gpu_task_run_name
from prefect_cudf_polars.blocks.results.lineage import Lineage
from prefect_cudf_polars.blocks.results.walker import gpu_results_in
from prefect_cudf_polars.tasks.gpu_task_type import GPUTask
from prefect_cudf_polars.tasks.inputs import drop_claimed, refuse_released, unclaimed
from prefect_cudf_polars.tasks.retry_inputs import combined_retry_condition, recompute_for_retry
from prefect_cudf_polars.tasks.task_defaults import (
    gpu_task_defaults,
    persistence_requests,
    warn_if_persistence_requested,
)


class GPUCall:
    """
    One run of a ``gpu_task``'s function: its inputs checked, its query run, its claimed inputs freed.

    The sync and the async task run the same steps; only how they wait differs.

    Attributes
    ----------
    args, kwargs
        The function's arguments, with inputs a retry recomputed swapped in.
    """

    def __init__(self, name: str, session: Any, lineage: Lineage, collect: bool, defer: bool = False) -> None:
        self.name = name
        self.session = session
        self.lineage = lineage
        self.collect = collect
        self.defer = defer
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.claimable: list[Any] = []
        self.fresh: list[Any] = []
        self.result: Any = None

    @classmethod
    def start(
        cls,
        name: str,
        user_fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        collect: bool,
        defer: bool = False,
    ) -> GPUCall:
        """
        Find the session, recompute what a retry needs, check every GPU input.

        Raises
        ------
        NoEngineSessionError, CannotRecomputeError, ResultReleasedError, ResultConsumedError, WrongEngineError
            See :func:`gpu_task` (what was recomputed is freed first).
        """
        refuse_released((args, kwargs))
        lineage = Lineage(user_fn, args, kwargs, label=f"gpu_task {name!r}", deferred=defer)
        call = cls(name, get_engine_session(), lineage, collect, defer)
        try:
            call.args, call.kwargs = recompute_for_retry((args, kwargs), call.session, call.fresh)
            inputs = gpu_results_in((call.args, call.kwargs))
            call.claimable = unclaimed(inputs)
            for result in inputs:
                result.check_readable()
        except BaseException:
            call.finish()
            raise
        return call

    def query(self, lf: Any) -> pl.LazyFrame:
        """The function's return value, which must be a LazyFrame."""
        if not isinstance(lf, pl.LazyFrame):
            raise TypeError(
                f"gpu_task {self.name!r} must return a polars LazyFrame (the query to "
                f"run on the GPU), but returned {type(lf).__name__}. Build the "
                "query with .lazy() on the inputs and return it uncollected."
            )
        return lf

    def run(self, lf: pl.LazyFrame) -> Any:
        """Run the query on the session: a GPUResult (deferred with ``defer``), or a host DataFrame (``collect``)."""
        if self.collect:
            return self.session.collect(lf, inputs=self.claimable)
        if self.defer:
            self.result = self.session.defer(lf, name=self.name, lineage=self.lineage, inputs=self.claimable)
            return self.result
        return self.session.execute(lf, name=self.name, lineage=self.lineage, inputs=self.claimable)

    def finish(self) -> None:
        """
        Free what the claimed inputs left, and the recomputed inputs the query did not read.

        Only inputs this call could claim (live when it started); inputs the
        returned deferred result holds stay: its reader frees them.
        """
        drop_claimed(self.claimable, held_by=self.result)
        drop_claimed(self.fresh, release_live=True, held_by=self.result)


@overload
def gpu_task(fn: Callable[..., pl.LazyFrame], /) -> Task[..., Any]: ...


@overload
def gpu_task(
    *, collect: bool = False, defer: bool = False, **task_options: Any
) -> Callable[[Callable[..., pl.LazyFrame]], Task[..., Any]]: ...


def gpu_task(
    fn: Callable[..., pl.LazyFrame] | None = None,
    /,
    *,
    collect: bool = False,
    defer: bool = False,
    **task_options: Any,
) -> Any:
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
        call, and lists this step in its artifact; the inputs this step read
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
        from its lineage (:mod:`~prefect_cudf_polars.tasks.retry_inputs`); your
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

        def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> GPUCall:
            if not collect:
                warn_if_persistence_requested(requested)
            return GPUCall.start(name, user_fn, args, kwargs, collect=collect, defer=defer)

        if inspect.iscoroutinefunction(user_fn):

            @functools.wraps(user_fn)
            async def run_on_engine(*args: Any, **kwargs: Any) -> Any:
                # Every step that may wait for the engine runs off the event loop (in a
                # copy of this context); the engine calls still queue on its owner thread.
                call = await asyncio.to_thread(start, args, kwargs)
                try:
                    lf = call.query(await user_fn(*call.args, **call.kwargs))
                    return await asyncio.to_thread(call.run, lf)
                finally:
                    await asyncio.to_thread(call.finish)

        else:

            @functools.wraps(user_fn)
            def run_on_engine(*args: Any, **kwargs: Any) -> Any:
                call = start(args, kwargs)
                try:
                    return call.run(call.query(user_fn(*call.args, **call.kwargs)))
                finally:
                    call.finish()

        options = {
            **gpu_task_defaults(returns_gpu_result=not collect),
            # Task runs are named after the query (the task's name) unless overridden.
            "task_run_name": gpu_task_run_name(name),
            **prefect_options,
        }
        options["retry_condition_fn"] = combined_retry_condition(
            prefect_options.get("retry_condition_fn")
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
