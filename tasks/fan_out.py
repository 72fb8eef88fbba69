"""
``tee``: one result in, N independent results out, all kept on the GPU.

A result is read once (cudf-polars moves its partitions out on read), so two
downstream tasks cannot both read it. ``tee`` splits it before the first read:

* copies 2..N are produced again from the result's lineage
  (:mod:`~prefect_cudf_polars.tasks.lineage`): the producing steps run again on
  the same engine, from their scans, so the data never visits host memory.

Cost: one re-run of the result's lineage and one more result's worth of engine
memory per extra copy. A result whose lineage cannot be replayed (its query
was built from another result's ``.lazy()`` outside a GPU task) is refused
before anything is claimed, so nothing is lost.
"""

from __future__ import annotations

from prefect import task

from prefect_cudf_polars.tasks.errors import CannotRecomputeError
from prefect_cudf_polars.tasks.result import GPUResult
from prefect_cudf_polars.tasks.task_defaults import gpu_task_defaults


@task(name="cudf-polars-tee", **gpu_task_defaults())
def tee(result: GPUResult, n: int = 2) -> list[GPUResult]:
    """
    Split one result into ``n`` independent results (fan-out), on the GPU.

    Parameters
    ----------
    result : GPUResult
        A live result; it becomes ``"consumed"`` (by this task run).
    n : int
        How many results to return (>= 1). Default 2.

    Returns
    -------
    list of GPUResult
        ``n`` live results with the same rows and schema; each is read once,
        by whichever task it is given to.

    Raises
    ------
    TypeError
        If ``result`` is not a GPUResult or ``n`` is not an int.
    ValueError
        If ``n < 1``.
    CannotRecomputeError
        If ``n > 1`` and the result's lineage cannot be replayed (nothing is
        claimed; ``result`` stays live).
    ResultReleasedError, ResultConsumedError, WrongEngineError
        If ``result`` cannot be read here.

    Examples
    --------
    >>> trips = execute(pl.scan_parquet("trips/*.parquet"))   # doctest: +SKIP
    >>> by_day, by_route = tee(trips, 2)                        # doctest: +SKIP
    >>> daily(by_day); routes(by_route)                         # doctest: +SKIP
    """
    from prefect_cudf_polars.blocks.active import get_engine_session

    if not isinstance(result, GPUResult):
        raise TypeError(f"tee takes a GPUResult, not {type(result).__name__}.")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"tee(result, n): n must be an int, not {type(n).__name__}.")
    if n < 1:
        raise ValueError(f"tee(result, n): n must be at least 1, not {n}.")
    session = get_engine_session()
    result.check_readable()
    if n > 1:
        reason = result.replay_problem
        if reason is not None:
            raise CannotRecomputeError(
                f"Cannot split GPUResult {result.name!r} (id {result.id}) into {n}: "
                f"{reason}. It is still live and unread. Collect it once and reuse the "
                "host DataFrame, or produce it in a gpu_task from scans or other GPU "
                "results so it can be recomputed.",
                result_id=result.id,
                result_name=result.name,
                reason=reason,
            )
    lineage = result.lineage
    # Replay first: if a replay fails (a scanned file is gone), the original is
    # still live and unread, and the replays made so far are released.
    extra: list[GPUResult] = []
    try:
        for _ in range(n - 1):
            extra.append(lineage.replay(session, name=result.name))  # type: ignore[union-attr]
        persisted = result._claim_for_copy()
    except BaseException:
        for copy in extra:
            copy.release()
        raise
    first = session._register(persisted, name=result.name, engine_seconds=0.0, lineage=lineage)
    return [first, *extra]
