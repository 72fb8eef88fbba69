"""
Engine errors users cannot act on, translated into ones they can.

cudf-polars reports a second read of a consumed result as an ``ExceptionGroup``
wrapping ``RuntimeError("A persisted query result is consumed on read ...")``
(seen on the H200); polars' CPU engine reports the ``cpu`` backend's identical
message inside a ``ComputeError``. Both become
:class:`~prefect_cudf_polars.tasks.ResultConsumedError`.

cudf-polars reports exhausted device memory as a ``MemoryError`` whose hint
names its own knobs (``target_partition_size``, ``RAPIDSMPF_SPILL_DEVICE_LIMIT``;
``cudf_polars.engine.core.execute_ir_on_rank``), sometimes inside an
``ExceptionGroup``; rmm's ``out_of_memory`` and ``std::bad_alloc`` can also
surface in other exceptions' text. All become
:class:`~prefect_cudf_polars.tasks.errors.DeviceMemoryError`, naming the block
fields to change, with cudf-polars' hint kept at the end.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefect_cudf_polars.tasks.errors import DeviceMemoryError, ResultConsumedError

_CONSUMED = "consumed on read"
_OUT_OF_MEMORY = ("out_of_memory", "std::bad_alloc", "out of memory")

DEVICE_MEMORY_MESSAGE = (
    "The engine ran out of device memory running this query; its claimed inputs "
    "were freed and the engine session stays usable. On the CudfPolarsEngine block: "
    'lower `spill_device_limit` (e.g. "60%") so rapidsmpf spills to host memory '
    "earlier; lower `target_partition_size` (bytes) for a lower peak; or use "
    '`device_memory_resource="managed"` (unified memory, can exceed GPU memory). '
    "Or release results you no longer need (`result.release()`). cudf-polars said: {hint}"
)


def iter_exceptions(exc: BaseException) -> Iterator[BaseException]:
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
        read twice (for example a self-join on one result); a
        :class:`DeviceMemoryError` when it says device memory ran out; ``exc``
        itself otherwise.
    """
    if isinstance(exc, DeviceMemoryError):
        return exc
    for e in iter_exceptions(exc):
        if isinstance(e, MemoryError) or any(m in str(e) for m in _OUT_OF_MEMORY):
            return DeviceMemoryError(DEVICE_MEMORY_MESSAGE.format(hint=str(e) or type(e).__name__))
    if any(_CONSUMED in str(e) for e in iter_exceptions(exc)):
        return ResultConsumedError(
            "The query reads a GPU result that was already consumed: results are "
            "read once (cudf-polars moves each partition out on read), so a query "
            "may scan a result's .lazy() frame only once (no self-joins on it). "
            "To read one result in two places, split it first with "
            "`tee(result, 2)` (prefect_cudf_polars.tasks.tee), or run the producing "
            "task again for a fresh result."
        )
    return exc
