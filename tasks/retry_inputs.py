"""
Inputs of a retried GPU task: recompute what the failed attempt read, or fail at once.

Developer notes
---------------
Prefect retries a task run by calling its function again with the same
arguments. A :class:`~prefect_cudf_polars.tasks.GPUResult` argument that the
failed attempt claimed is consumed (its partitions were moved out, or freed
when the attempt failed), so the retry would read nothing. Here each such
input — consumed by *this* task run (same task run id, the one Prefect keeps
across attempts) — is produced again from its lineage
(:mod:`~prefect_cudf_polars.blocks.results.lineage`) on the same session, and the retry
runs on the fresh result. An input consumed by *another* task run is a
fan-out mistake and keeps raising :class:`ResultConsumedError` (pointing to
``tee``). When the lineage cannot be replayed the attempt raises
:class:`CannotRecomputeError`, and :func:`retry_unless_cannot_recompute` (the
GPU tasks' ``retry_condition_fn``) stops Prefect from retrying again: the
task run fails at once with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect_cudf_polars.blocks import EngineSession, GPUResult
from prefect_cudf_polars.blocks.errors import CannotRecomputeError
from prefect_cudf_polars.blocks.results.lineage import replay_result
from prefect_cudf_polars.blocks.results.run_identity import current_run_id
from prefect_cudf_polars.blocks.results.walker import replace_gpu_results


def recompute_for_retry(
    obj: Any, session: EngineSession, fresh: list[GPUResult]
) -> Any:
    """
    ``obj`` with every input this task run already consumed replaced by a recomputed result.

    Parameters
    ----------
    obj
        The task's arguments (a tuple, dict, or any value holding results).
    session
        The flow run's open engine session.
    fresh
        Receives the recomputed results (the caller frees what stays unread).

    Returns
    -------
    Any
        ``obj`` rebuilt; unchanged outside a task run or on a first attempt.

    Raises
    ------
    CannotRecomputeError
        When a consumed input's lineage cannot be replayed (says why).
    """
    run_id = current_run_id()
    if run_id is None:
        return obj

    def swap(result: GPUResult) -> GPUResult:
        if result.state != "consumed" or result.consumed_by_id != run_id:
            return result
        reason = result.replay_problem
        if reason is not None:
            raise CannotRecomputeError(
                f"GPUResult {result.name!r} (id {result.id}) was consumed by an earlier "
                f"attempt of {result.consumed_by}, and this retry cannot recompute it: "
                f"{reason}. Not retrying again. Make the step that produced it a "
                "gpu_task (or execute) fed by scans or other GPU results, or collect it "
                "to the host before the step that may fail.",
                result_id=result.id,
                result_name=result.name,
                consumer=result.consumed_by,
                reason=reason,
            )
        new = replay_result(session, result)
        fresh.append(new)
        return new

    return replace_gpu_results(obj, swap)


def retry_unless_cannot_recompute(task: Any, task_run: Any, state: Any) -> bool:
    """
    Prefect ``retry_condition_fn``: retry, unless the attempt failed with :class:`CannotRecomputeError`.

    Parameters
    ----------
    task, task_run
        Prefect's task and task run (unused).
    state
        The failed state; its ``data`` is the exception.

    Returns
    -------
    bool
        False for :class:`CannotRecomputeError` (a retry would fail the same way).
    """
    return not isinstance(getattr(state, "data", None), CannotRecomputeError)


def combined_retry_condition(
    user_condition: Callable[..., Any] | None,
) -> Callable[..., Any]:
    """
    The GPU tasks' ``retry_condition_fn``: :func:`retry_unless_cannot_recompute`, then the user's own.

    Parameters
    ----------
    user_condition
        The user's ``retry_condition_fn`` (sync or async), or ``None``.
    """
    if user_condition is None:
        return retry_unless_cannot_recompute

    def condition(task: Any, task_run: Any, state: Any) -> Any:
        if not retry_unless_cannot_recompute(task, task_run, state):
            return False
        return user_condition(task, task_run, state)

    return condition
