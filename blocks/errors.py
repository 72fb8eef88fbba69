"""
The errors users of prefect-cudf-polars catch.

Every error here carries ids and names (plain strings), never a result handle or
an engine: Prefect pickles a failed flow's exception into result storage, and a
handle must never leave its process (see :class:`~prefect_cudf_polars.tasks.GPUResult`).
All of them pickle and unpickle with their message and attributes intact.
"""

from __future__ import annotations

__all__ = [
    "AdmissionError", "BlockNotFoundError", "CannotRecomputeError", "DeviceMemoryError", "GPUResultError", "HostPersistenceError",
    "NoEngineSessionError", "NoGPUError", "ResultConsumedError", "ResultReleasedError", "SessionError",
    "WrongEngineError",
]


class GPUResultError(RuntimeError):
    """
    Base class of the errors about a :class:`~prefect_cudf_polars.tasks.GPUResult`.

    Parameters
    ----------
    message
        What happened and what to do next.
    **details
        Values of the error's attributes, by name (each class lists its own).

    Attributes
    ----------
    result_id : str or None
        The id (32 hex characters) of the result concerned.
    result_name : str or None
        The result's readable name (the query or task that produced it).

    Raises
    ------
    TypeError
        For a detail the error has no attribute for.
    """

    result_id: str | None = None
    result_name: str | None = None

    def __init__(self, message: str, **details: str | None) -> None:
        super().__init__(message)
        for name, value in details.items():
            if not hasattr(type(self), name):
                raise TypeError(f"{type(self).__name__} has no attribute {name!r}")
            setattr(self, name, value)  # kept through pickling (BaseException.__reduce__ carries __dict__)


class HostPersistenceError(GPUResultError):
    """
    A GPU result was about to be pickled or persisted to the host.

    Raised when a :class:`~prefect_cudf_polars.tasks.GPUResult` is pickled (for
    example by a process-based task runner, or by result persistence) and by
    :class:`~prefect_cudf_polars.tasks.GPUResultSerializer`. A GPU result lives
    in GPU memory of the process that holds its engine; it cannot be written to
    disk or sent to another process.
    """


class ResultConsumedError(GPUResultError):
    """
    A result was read a second time.

    Results are one-shot (cudf-polars moves each partition out of its store on
    read). The first ``.lazy()`` claims the result for a task run or flow run;
    any later claim raises this error.

    Attributes
    ----------
    result_id, result_name : str or None
        The result concerned.
    consumer : str or None
        Name of the task run (or flow run) whose claim consumed it.
    """

    consumer: str | None = None


class CannotRecomputeError(ResultConsumedError):
    """
    A result was consumed and cannot be recomputed from its lineage.

    Raised at once (never retried) when a retried task, a :func:`tee` or a
    replay needs a consumed result again and its recorded lineage cannot be run
    again, for example because its query was built from another result's
    ``.lazy()`` frame outside a GPU task. The message says which step of the
    lineage stops the replay and what to do instead.

    Attributes
    ----------
    result_id, result_name, consumer : str or None
        The result concerned and the run that consumed it.
    reason : str or None
        Why the lineage cannot be replayed (one sentence).
    """

    reason: str | None = None


class ResultReleasedError(GPUResultError):
    """
    A released result was read.

    A result is released by :meth:`~prefect_cudf_polars.tasks.GPUResult.release`,
    by leaving its ``with`` block, or when the session that produced it ends
    (the end of the flow run).
    """


class WrongEngineError(GPUResultError):
    """
    A result was used with a session other than the one that produced it.

    cudf-polars keeps a result's partitions in the producing engine's store;
    another engine cannot read them (and cudf-polars does not check this), so
    prefect-cudf-polars checks it before calling the engine.

    Attributes
    ----------
    result_id, result_name : str or None
        The result concerned.
    producer_session, current_session : str or None
        Ids of the session that produced the result and of the session that
        tried to use it.
    """

    producer_session: str | None = None
    current_session: str | None = None


class SessionError(RuntimeError):
    """An engine session was used against its lifecycle rules (for example, nested, or after it ended)."""


NO_SESSION_MESSAGE = (
    "No cudf-polars engine session is active {where}. Give the flow one: "
    "`@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(...)))`, or open one in the flow "
    "body: `with CudfPolarsEngine.load('name').session():`. GPU tasks must run inside that flow "
    "run, on its thread-pool task runner."
)

ENDED_WITH_BLOCK = (
    "The engine session {id} (`with block.session():`{where}) has ended, so it runs no more queries. Task "
    "runs submitted inside the with block must finish before it exits: the session waits for them at most "
    "the block's teardown_timeout ({limit:g} s). Wait on their futures inside the with block, or raise "
    "teardown_timeout."
)

ENDED_WITH_RUN = (
    "The engine session {id} ({by}{where}) has ended with its flow run, so it runs no more queries; open a "
    "new session (a new flow run) to run more."
)


class AdmissionError(SessionError):
    """
    A session could not occupy its admission slots, so its engine did not start.

    A :class:`~prefect_cudf_polars.blocks.CudfPolarsEngine` with ``admission_limit``
    occupies ``ceil(device_memory_limit / GiB)`` slots of that Prefect global
    concurrency limit before its engine starts. This error is raised (in the first
    GPU task run) when the limit does not exist, is smaller than the slots asked
    for, or the slots were not free within ``admission_timeout``
    seconds. The message names the limit, the slots and the seconds, and what to
    do next (``prefect gcl create NAME --limit N``, raise ``admission_timeout``,
    lower ``device_memory_limit``). Nothing was started and no slot is held.

    Attributes
    ----------
    limit_name : str or None
        The global concurrency limit's name.
    slots : int or None
        The slots (GiB of device memory) asked for.
    waited_seconds : float or None
        Seconds the session waited before it gave up.
    """

    def __init__(self, message: str = "", *, limit_name: str | None = None, slots: int | None = None,
                 waited_seconds: float | None = None) -> None:
        super().__init__(message)
        self.limit_name, self.slots, self.waited_seconds = limit_name, slots, waited_seconds
        # kept through pickling (BaseException.__reduce__ carries __dict__)


class NoEngineSessionError(SessionError):
    """No engine session is active for the current flow run or thread."""


class DeviceMemoryError(MemoryError):
    """
    The engine ran out of device memory while running a query.

    Wraps cudf-polars' ``MemoryError`` (whose hint names its own options) and
    says which :class:`~prefect_cudf_polars.blocks.CudfPolarsEngine` block
    fields act on it: ``spill_device_limit`` (spill to host above this device
    memory use), ``target_partition_size`` (smaller partitions, lower peak) and
    ``device_memory_resource="managed"`` (unified memory, can exceed the GPU's).
    The query's inputs that were claimed are freed; the session stays usable.

    Parameters
    ----------
    message
        What happened and what to do next, followed by cudf-polars' own hint.
    """


class BlockNotFoundError(LookupError, ValueError):
    """
    No saved engine block has the name given to ``CudfPolarsEngine.load``.

    The message says how to save one and how to list those saved. It is a
    ``LookupError``, and the ``ValueError`` Prefect's ``Block.load`` raises for
    an unknown name, so code catching either keeps working.
    """


class NoGPUError(RuntimeError):
    """
    A GPU backend was asked for, but no usable NVIDIA GPU or RAPIDS stack is here.

    The message says what was missing (driver, device, or the RAPIDS packages)
    and how to fix it, including ``cpu_fallback=True`` or ``backend="cpu"``.
    """
