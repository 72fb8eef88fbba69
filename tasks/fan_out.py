"""
``tee``: one result in, N independent results out, all kept on the GPU.

A result is read once (cudf-polars moves its partitions out on read), so two
readers cannot share it. Copies 2..N are deep copies of its partitions into
new slots of the engine's store (``spmd``; the ``cpu`` backend copies its host
frame), made on the engine's owner thread
(:meth:`~prefect_cudf_polars.blocks.EngineSession.copies`); where that cannot
be (``dask``, ``ray``, a deferred result, one moved to host memory), they are
produced again from the result's lineage
(:func:`~prefect_cudf_polars.tasks.calls.replay`): the producing steps run
again on the same engine, from their scans. Either way the data never visits
host memory; the first copy takes over the original's partitions. A result
that can be neither copied nor replayed is refused before anything is claimed.
"""

from __future__ import annotations

from prefect_cudf_polars.blocks import GPUResult
from prefect_cudf_polars.blocks.errors import MAKE_RECOMPUTABLE, CannotRecomputeError, wrong_type
from prefect_cudf_polars.tasks.calls import EngineCall, replay
from prefect_cudf_polars.tasks.gpu_task_type import gpu_prefect_task as task
from prefect_cudf_polars.tasks.run_names import tee_run_name
from prefect_cudf_polars.tasks.task_defaults import gpu_task_defaults


@task(name="cudf-polars-tee", task_run_name=tee_run_name, **gpu_task_defaults())
def tee(result: GPUResult, n: int = 2) -> list[GPUResult]:
    """
    Split one result into ``n`` independent results (fan-out), on the GPU.

    A result is read once, so two downstream tasks cannot both read it; ``tee``
    splits it before the first read. Copies 2..N are device copies of its
    partitions on ``spmd`` (and host copies on ``cpu``); on ``dask`` and
    ``ray`` they are produced again from the result's lineage on the same
    engine (one re-run each). Each extra copy takes one more result's worth of
    engine memory; the data never visits host memory.

    A deferred result (``gpu_task(defer=True)``) splits into ``n`` deferred
    copies, and each copy's reader runs the deferred steps' plan in full in
    its own engine call: ``n`` readers run those steps ``n`` times. Where
    several tasks read one step's output, materialize that step (no
    ``defer``) so it runs once.

    Parameters
    ----------
    result : GPUResult
        A live result; it becomes ``"consumed"`` (by this task run).
    n : int
        How many results to return (>= 1). Default 2.

    Returns
    -------
    list of GPUResult
        ``n`` live results with the same rows and schema (deferred, for a
        deferred result); each is read once, by whichever task it is given to.

    Raises
    ------
    TypeError
        If ``result`` is not a GPUResult or ``n`` is not an int.
    ValueError
        If ``n < 1``.
    CannotRecomputeError
        If ``n > 1``, its partitions cannot be copied and its lineage cannot
        be replayed (nothing is claimed; ``result`` stays live).
    ResultReleasedError, ResultConsumedError, WrongEngineError
        If ``result`` cannot be read here.

    Examples
    --------
    >>> trips = execute(pl.scan_parquet("trips/*.parquet"))   # doctest: +SKIP
    >>> by_day, by_route = tee(trips, 2)                        # doctest: +SKIP
    >>> daily(by_day); routes(by_route)                         # doctest: +SKIP
    """
    if not isinstance(result, GPUResult):
        raise TypeError(wrong_type("tee", "a GPUResult", result, "pass what execute or a gpu_task returned"))
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"tee(result, n): n must be an int, not {type(n).__name__}.")
    if n < 1:
        raise ValueError(f"tee(result, n): n must be at least 1, not {n}.")
    with EngineCall(result) as call:
        result = call.args
        # Copies first: if one fails (a scanned file is gone), the original is still live and unread.
        copies = call.session.copies(result, n - 1) if n > 1 else []
        if copies is None and (reason := result.replay_problem) is not None:
            raise CannotRecomputeError(
                f"Cannot split GPUResult {result.name!r} (id {result.id}) into {n}: {reason}. It is still live "
                f"and unread: {MAKE_RECOMPUTABLE}.", result_id=result.id, result_name=result.name, reason=reason)
        copies = copies or []
        try:
            while len(copies) < n - 1:  # one by one: a failed replay releases the copies made before it
                copies.append(replay(call.session, result))
            return [call.session.adopt(result.hand_over(), like=result), *copies]
        except BaseException:
            for copy in copies:
                copy.release()
            raise
