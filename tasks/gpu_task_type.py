"""
``GPUTask``: the Prefect task type of every task that runs on the engine session.

It is Prefect's ``Task`` with two additions. Its ``retry_condition_fn`` is
always :func:`~prefect_cudf_polars.tasks.calls.retry_unless_cannot_recompute`
first, then the user's own (given to the decorator or to ``with_options``):
an attempt that failed with ``CannotRecomputeError`` is never retried. And a
run submitted with ``.submit()`` or ``.map()`` is registered with the innermost session provider
(:func:`serve_future`). A
``with block.session():`` then waits for the GPU task runs submitted inside it
before it ends (bounded by the block's ``teardown_timeout``); a
``CudfPolarsTaskRunner`` needs no registration (Prefect's thread pool waits
for its task runs before the runner closes the session).

Prefect 3.9's ``Task.with_options`` builds a plain ``Task``; :meth:`GPUTask.with_options`
keeps the type and the retry guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import Task

from prefect_cudf_polars.blocks.active import innermost
from prefect_cudf_polars.tasks.calls import combined_retry_condition


def serve_future(future: Any) -> None:
    """Tell the innermost session provider that ``future`` is a GPU task run it serves."""
    provider = innermost()
    if provider is not None:
        provider.serve(future)


class GPUTask(Task):  # type: ignore[type-arg]
    """A Prefect task that never retries what cannot be recomputed, and whose submitted runs keep a session open."""

    def __init__(self, *args: Any, retry_condition_fn: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, retry_condition_fn=combined_retry_condition(retry_condition_fn), **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        """Prefect's ``Task.submit``; the returned future is served by the innermost session."""
        submitted = super().submit(*args, **kwargs)
        if not kwargs.get("return_state"):
            serve_future(submitted)
        return submitted

    def map(self, *args: Any, **kwargs: Any) -> Any:
        """Prefect's ``Task.map``; each returned future is served by the innermost session."""
        submitted = super().map(*args, **kwargs)
        if not kwargs.get("return_state") and not kwargs.get("deferred"):
            for future in submitted:
                serve_future(future)
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
    if fn is None:
        return lambda user_fn: GPUTask(fn=user_fn, **options)
    return GPUTask(fn=fn, **options)
