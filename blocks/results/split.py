"""
Splitting one result into N independent results (what ``tee`` does), on the engine.

A result is read once (cudf-polars moves its partitions out on read), so two
readers cannot share it. Copies 2..N are produced again from the result's
lineage (:mod:`~prefect_cudf_polars.blocks.results.lineage`): the producing
steps run again on the same engine, from their scans, so the data never visits
host memory. The first copy takes over the original's partitions.

Cost: one re-run of the result's lineage and one more result's worth of engine
memory per extra copy. A result whose lineage cannot be replayed is refused
before anything is claimed, so nothing is lost.

A deferred result splits into deferred copies: the first takes over its plan
and the inputs it holds, the others are deferred replays of its lineage, and
each copy's plan runs in full in the engine call of whichever task reads it
(N copies read: N runs of the deferred steps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_cudf_polars.blocks.errors import CannotRecomputeError
from prefect_cudf_polars.blocks.results.lineage import replay_result
from prefect_cudf_polars.blocks.results.result import GPUResult

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.session.session import EngineSession


def split_result(session: EngineSession, result: GPUResult, n: int) -> list[GPUResult]:
    """
    ``n`` live results with the rows of ``result``, which becomes ``"consumed"``.

    Parameters
    ----------
    session : EngineSession
        The open session that produced ``result``.
    result : GPUResult
        A live result.
    n : int
        How many results to return (>= 1).

    Returns
    -------
    list of GPUResult
        The first wraps ``result``'s partitions (or, deferred, its plan); the
        others are replays (deferred, for a deferred result).

    Raises
    ------
    CannotRecomputeError
        If ``n > 1`` and the lineage cannot be replayed (nothing is claimed;
        ``result`` stays live).
    ResultReleasedError, ResultConsumedError, WrongEngineError
        If ``result`` cannot be read here.
    Exception
        Whatever the engine raises replaying the lineage (``result`` stays live
        and unread; the replays made so far are released).
    """
    result.check_readable()
    lineage = result.lineage
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
    # Replay first: if a replay fails (a scanned file is gone), the original is
    # still live and unread, and the replays made so far are released.
    extra: list[GPUResult] = []
    try:
        for _ in range(n - 1):
            extra.append(replay_result(session, result))
        handed = result.hand_over()
    except BaseException:
        for copy in extra:
            copy.release()
        raise
    first = session.adopt(handed, name=result.name, lineage=lineage)
    return [first, *extra]
