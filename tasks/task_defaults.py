"""
Prefect options every GPU task starts from, and the warning when persistence is asked for.

Defaults: no result persistence (``persist_result=False``, which beats
flow-level persistence and ``PREFECT_RESULTS_PERSIST_BY_DEFAULT``), no input
caching (``cache_policy=NO_CACHE``: Prefect's default policy would hash every
input), and :class:`~prefect_cudf_polars.tasks.GPUResultSerializer` as the
result serializer, which refuses host persistence if a user switches it on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prefect.cache_policies import NO_CACHE, CachePolicy

from prefect_cudf_polars.blocks.errors import KEEP_ON_HOST, NOT_PERSISTED
from prefect_cudf_polars.blocks.persistence import warn_once_in_task_run
from prefect_cudf_polars.tasks.serializer import GPUResultSerializer


def gpu_task_defaults(*, returns_gpu_result: bool = True) -> dict[str, Any]:
    """
    Prefect task options for a task that returns a GPU result (or a host DataFrame).

    Parameters
    ----------
    returns_gpu_result
        True for tasks returning a :class:`GPUResult` (they get the refusing
        serializer); False for tasks returning host values.

    Returns
    -------
    dict
        Keyword arguments for ``prefect.task``.
    """
    serializer = {"result_serializer": GPUResultSerializer()} if returns_gpu_result else {}
    return {"persist_result": False, "cache_policy": NO_CACHE, **serializer}


def persistence_requests(options: Mapping[str, Any] | Any) -> list[str]:
    """
    The options (of a decorator call or a Task) that ask for result persistence.

    Parameters
    ----------
    options
        A mapping of task options, or a ``prefect.Task``.

    Returns
    -------
    list of str
        Readable reasons, e.g. ``["persist_result=True"]``; empty when none.
    """
    get = options.get if isinstance(options, Mapping) else lambda k, d=None: getattr(options, k, d)
    policy = get("cache_policy")
    asked = {"persist_result=True": get("persist_result") is True,
             f"result_storage_key={get('result_storage_key')!r}": bool(get("result_storage_key")),
             f"cache_policy={type(policy).__name__}": isinstance(policy, CachePolicy)
             and not isinstance(policy, type(NO_CACHE)),
             "cache_key_fn": get("cache_key_fn") is not None}
    return [reason for reason, yes in asked.items() if yes]


def warn_if_persistence_requested(extra: Iterable[str] = ()) -> None:
    """
    Log a WARNING on the task run when its options ask for result persistence.

    Prefect's own warning for a refused serializer is generic (and absent when
    the decorator switched persistence off, since Prefect then never calls the
    serializer); this one names the task, says why nothing was persisted and
    what to do. A task run is warned once, by this or by the serializer's refusal.

    Parameters
    ----------
    extra
        Reasons known at decoration time (options the decorator neutralised).
    """
    from prefect.context import TaskRunContext
    from prefect.logging import get_run_logger

    ctx = TaskRunContext.get()
    if ctx is None or not (reasons := sorted(set(persistence_requests(ctx.task)) | set(extra))):
        return
    said = (f"Task {ctx.task.name!r} asks for result persistence ({', '.join(reasons)}), but {NOT_PERSISTED}; "
            f"{KEEP_ON_HOST}, and drop the persistence options from this task.")
    # Once per task run (the serializer's refusal, if Prefect calls it, warns no more), and
    # on the task run in the UI too, not only as a log line.
    if warn_once_in_task_run("%s", said):
        from prefect.artifacts import create_markdown_artifact

        try:
            create_markdown_artifact(markdown=f"### Result persistence refused: task `{ctx.task.name}`\n\n{said}\n",
                                     description=f"Result persistence refused for task {ctx.task.name!r}: nothing "
                                     "was persisted")
        except Exception as exc:  # the UI's view of a run must not fail the run
            get_run_logger().warning("Could not write the persistence-refusal artifact: %s", exc)
