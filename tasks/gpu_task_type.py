"""
``GPUTask``: the Prefect task type of every task that runs on the engine session.

It is Prefect's ``Task`` with three additions. Calling, submitting or mapping
it opens the flow run's engine session first, so the engine's start is not
charged to the first task run's ``timeout_seconds``. Its ``retry_condition_fn`` is
always :func:`~prefect_cudf_polars.tasks.calls.retry_unless_cannot_recompute`
first, then the user's own (given to the decorator or to ``with_options``):
an attempt that failed with ``CannotRecomputeError`` is never retried. And a
run submitted with ``.submit()`` or ``.map()`` is registered with the innermost session provider
(:func:`serve_futures`). A ``with block.session():`` then waits for the GPU task runs submitted inside it
before it ends (bounded by the block's ``teardown_timeout``); a
``CudfPolarsTaskRunner`` needs no registration (Prefect's thread pool waits
for its task runs before the runner closes the session).

Prefect 3.9's ``Task.with_options`` builds a plain ``Task``; :meth:`GPUTask.with_options`
keeps the type and the retry guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import Any

from prefect import Task

from prefect_cudf_polars.blocks.active import innermost
from prefect_cudf_polars.tasks.calls import combined_retry_condition


def open_session_first() -> None:
    """
    Open the flow run's engine session before a GPU task run starts, so the engine's start is not charged to
    that task run's ``timeout_seconds``. An engine that cannot start is not raised here: the session provider
    keeps the error, and the task run raises it (and fails) when it asks for its session.
    """
    if (provider := innermost()) is not None and provider.provided_session is None:
        with contextlib.suppress(Exception):  # kept by the provider: the task run raises it
            provider.provide_session()


async def _after_session_opens(run: Any) -> Any:
    """Await ``run`` (an async task's run) once the engine session is open, its start off the event loop."""
    try:
        if (provider := innermost()) is not None and provider.provided_session is None:
            await asyncio.to_thread(open_session_first)
    except BaseException:
        run.close()
        raise
    return await run


def serve_futures(futures: Iterable[Any]) -> None:
    """Tell the innermost session provider that each of ``futures`` is a GPU task run it serves."""
    if (provider := innermost()) is not None:
        for future in futures:
            provider.serve(future)


class GPUTask(Task):  # type: ignore[type-arg]
    """A Prefect task that never retries what cannot be recomputed, and whose submitted runs keep a session open."""

    def __init__(self, *args: Any, retry_condition_fn: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, retry_condition_fn=combined_retry_condition(retry_condition_fn), **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Prefect's ``Task.__call__``, with the flow run's engine started first (:func:`open_session_first`)."""
        if self.isasync:
            return _after_session_opens(super().__call__(*args, **kwargs))
        open_session_first()
        return super().__call__(*args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        """Prefect's ``Task.submit``, the engine started first; the returned future is served by the innermost session.

        ``submit`` is synchronous: from an async flow the engine's start (and an admission wait) runs on the event
        loop's thread; await a GPU task first there to start it off the loop."""
        open_session_first()
        submitted = super().submit(*args, **kwargs)
        if not kwargs.get("return_state"):
            serve_futures([submitted])
        return submitted

    def map(self, *args: Any, **kwargs: Any) -> Any:
        """Prefect's ``Task.map``, the engine started first (on this thread, as for :meth:`submit`); each returned
        future is served by the innermost session."""
        open_session_first()
        submitted = super().map(*args, **kwargs)
        if not (kwargs.get("return_state") or kwargs.get("deferred")):
            serve_futures(submitted)
        return submitted

    def with_options(self, *args: Any, **kwargs: Any) -> GPUTask:
        """Prefect's ``Task.with_options``, returning a ``GPUTask``; a new ``retry_condition_fn`` runs after the guard."""
        if kwargs.get("retry_condition_fn") is not None:
            kwargs["retry_condition_fn"] = combined_retry_condition(kwargs["retry_condition_fn"])
        copy = super().with_options(*args, **kwargs)
        copy.__class__ = type(self)
        return copy


def gpu_prefect_task(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """``prefect.task`` for engine tasks: the same options, a :class:`GPUTask`."""
    return functools.partial(gpu_prefect_task, **options) if fn is None else GPUTask(fn=fn, **options)
