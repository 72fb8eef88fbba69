"""
Engine errors users cannot act on, translated into ones they can.

cudf-polars reports a second read of a consumed result as an ``ExceptionGroup``
wrapping ``RuntimeError("A persisted query result is consumed on read ...")``
(cudf-polars 26.10); polars' CPU engine reports the ``cpu`` backend's identical
message inside a ``ComputeError``. Both become
:class:`~prefect_cudf_polars.tasks.ResultConsumedError`.

cudf-polars reports exhausted device memory as a ``MemoryError`` whose hint
names its own knobs (``target_partition_size``, ``RAPIDSMPF_SPILL_DEVICE_LIMIT``;
``cudf_polars.engine.core.execute_ir_on_rank``), sometimes inside an
``ExceptionGroup``; rmm's ``out_of_memory`` and ``std::bad_alloc`` can also
surface in other exceptions' text. All become
:class:`~prefect_cudf_polars.blocks.errors.DeviceMemoryError`, naming the block
fields to change, with cudf-polars' hint kept at the end.

cudf-polars runs a query as a network of actors and reports an actor's failure
inside an ``ExceptionGroup('unhandled errors in a TaskGroup', [...])``
(cudf-polars 26.10; for example a parquet file deleted before a re-scan). When the group holds one
error, that error is raised instead, so the task run shows
``FileNotFoundError: ...`` rather than "1 sub-exception".

A failed engine call's traceback frames hold the actors' local variables,
device buffers among them (a failed query's partial chunks). Prefect keeps a
failed task run's exception in its state until the flow run ends, and device
buffers freed after the engine has shut down would outlive their allocator, so
the frames' local variables are cleared (:func:`traceback.clear_frames`; the
traceback's file and line records stay printable).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import NoReturn

from prefect_cudf_polars.blocks.errors import MAKE_ROOM, DeviceMemoryError, ResultConsumedError, read_again_message

_CONSUMED = "consumed on read"
_OUT_OF_MEMORY = ("out_of_memory", "std::bad_alloc", "out of memory")

DEVICE_MEMORY_MESSAGE = ("The engine ran out of device memory running this query (its claimed inputs were freed; the "
                         'session stays usable): on the CudfPolarsEngine block lower `spill_device_limit` (e.g. "60%") '
                         "so rapidsmpf spills to host memory earlier; lower `target_partition_size` (bytes) for a lower "
                         f'peak; or use `device_memory_resource="managed"` (unified memory, can exceed GPU memory); or '
                         f"{MAKE_ROOM}. cudf-polars said: {{hint}}")


def iter_exceptions(exc: BaseException) -> Iterator[BaseException]:
    """Yield ``exc`` and every exception inside it (group members, causes, contexts), once each."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        if (e := stack.pop()) is not None and id(e) not in seen:
            seen.add(id(e))
            yield e
            stack.extend([*(e.exceptions if isinstance(e, BaseExceptionGroup) else ()), e.__cause__, e.__context__])


def _leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc``, nested groups included (``[exc]`` for one that is no group)."""
    return [leaf for e in exc.exceptions for leaf in _leaves(e)] if isinstance(exc, BaseExceptionGroup) else [exc]


def drop_frame_locals(exc: BaseException) -> None:
    """Clear the local variables of the finished frames in the tracebacks of ``exc`` and everything inside it."""
    for e in iter_exceptions(exc):
        traceback.clear_frames(e.__traceback__)  # a no-op for None


def error_text(exc: BaseException) -> str:
    """``exc`` as a log line gives it (``"MemoryError: std::bad_alloc: ..."``): a log record that keeps this text
    keeps neither the error nor its traceback's frames, which can hold partitions and the running engine (and
    with it the engine's device memory pool)."""
    return f"{type(exc).__name__}: {exc}"


def raise_engine_error(exc: BaseException, *, note: str | None = None) -> NoReturn:
    """
    Raise what an engine call that failed with ``exc`` should raise.

    Clears the failed call's frame locals (:func:`drop_frame_locals`), then
    raises :func:`translate_engine_error`'s error: ``exc`` itself, a single
    error unwrapped from cudf-polars' group, or ours chained ``from exc``.

    Parameters
    ----------
    exc : BaseException
        What the engine call raised.
    note : str, optional
        Added to the raised error's notes (``BaseException.add_note``), for
        example the deferred steps the call ran fused in.

    Raises
    ------
    BaseException
        Always; see :func:`translate_engine_error`.
    """
    drop_frame_locals(exc)
    translated = translate_engine_error(exc)
    if note:
        translated.add_note(note)
    if translated is exc:
        raise exc
    if translated in set(iter_exceptions(exc)):
        raise translated from None  # unwrapped: the group adds nothing but its wrapper
    raise translated from exc


def translate_engine_error(exc: BaseException) -> BaseException:
    """
    Return the error to raise for ``exc`` from an engine call.

    Returns
    -------
    BaseException
        A :class:`ResultConsumedError` when ``exc`` says a persisted result was
        read by a second query (the same frame run twice); a
        :class:`DeviceMemoryError` when it says device memory ran out; the
        single error inside ``exc`` when ``exc`` is a group of one; ``exc``
        itself otherwise.
    """
    if isinstance(exc, DeviceMemoryError):
        return exc
    for e in iter_exceptions(exc):
        if isinstance(e, MemoryError) or any(m in str(e) for m in _OUT_OF_MEMORY):
            return DeviceMemoryError(DEVICE_MEMORY_MESSAGE.format(hint=str(e) or type(e).__name__))
    if any(_CONSUMED in str(e) for e in iter_exceptions(exc)):
        return ResultConsumedError(read_again_message())
    if isinstance(exc, BaseExceptionGroup) and len(leaves := _leaves(exc)) == 1:
        return leaves[0]
    return exc
