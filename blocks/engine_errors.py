"""
Engine errors users cannot act on, translated into ones they can.

cudf-polars reports a second read of a consumed result as an ``ExceptionGroup``
wrapping ``RuntimeError("A persisted query result is consumed on read ...")``
(seen on the H200); polars' CPU engine reports the ``cpu`` backend's identical
message inside a ``ComputeError``. Both become
:class:`~prefect_cudf_polars.tasks.ResultConsumedError`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefect_cudf_polars.tasks.errors import ResultConsumedError

_CONSUMED = "consumed on read"


def _walk(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                stack.append(nxt)


def translate_engine_error(exc: BaseException) -> BaseException:
    """
    Return the error to raise for ``exc`` from an engine call.

    Returns
    -------
    BaseException
        A :class:`ResultConsumedError` when ``exc`` says a persisted result was
        read twice (for example a self-join on one result); ``exc`` itself otherwise.
    """
    if any(_CONSUMED in str(e) for e in _walk(exc)):
        return ResultConsumedError(
            "The query reads a GPU result that was already consumed: results are "
            "read once (cudf-polars moves each partition out on read), so a query "
            "may scan a result's .lazy() frame only once (no self-joins on it). "
            "Run the producing task again for a fresh result."
        )
    return exc
