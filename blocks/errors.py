"""
The errors users of prefect-cudf-polars catch.

Every error here carries ids and names (plain strings), never a result handle or
an engine: Prefect pickles a failed flow's exception into result storage, and a
handle must never leave its process (see :class:`~prefect_cudf_polars.tasks.GPUResult`).
All of them pickle and unpickle with their message and attributes intact.

The advice the messages give (what to do next) is written once here, as the
clauses under "What to do next", and every raise site builds its message from them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AdmissionError", "BlockNotFoundError", "CannotRecomputeError", "DeviceMemoryError", "GPUResultError",
           "HostPersistenceError", "NoEngineSessionError", "NoGPUError", "ResultConsumedError", "ResultReleasedError",
           "SessionError", "WrongEngineError"]

# ---- What to do next: each piece of advice the errors give, written once -------------------------
# A raise site says what happened, then uses one of these clauses (lower case, no final stop), so one
# piece of advice reads the same wherever it is given.

#: A result that two queries or tasks read.
SPLIT_WITH_TEE = ("split it first with `tee(result, 2)` (prefect_cudf_polars.tasks.tee), which makes independent "
                  "results that stay on the GPU")
#: A result whose data is gone (released, its engine shut down, its host copy dropped).
RUN_PRODUCER_AGAIN = "run the task that produced it again, in a flow run with an open engine session"
#: A GPU result someone wants kept: pickled, persisted, returned from its flow run.
KEEP_ON_HOST = ("to keep its data, collect it to the host (the `collect` task or gpu_task(collect=True)) and "
                "persist that, or write it to parquet")
#: What became of a GPU result a task asked to persist.
NOT_PERSISTED = ("a GPU result lives in GPU memory of this process and is never written to result storage: nothing "
                 "was persisted, and the result stays usable in this flow run")
#: A result whose lineage cannot be replayed (a retry, a ``tee``).
MAKE_RECOMPUTABLE = ("collect it to the host before it is read, or produce it in a gpu_task (or execute) fed by "
                     "scans or other GPU results, so it can be recomputed")
#: Held results leave an engine call too little device memory.
MAKE_ROOM = ('set spill_results="host" on the CudfPolarsEngine block (unread results move to host memory until a '
             "call fits) or raise its device_memory_limit, or release results sooner (`result.release()`)")
#: A subflow that reads its parent's results.
SHARE_PARENT_SESSION = "give the subflow no task runner, so it runs on its parent's session"
#: Task runs still running when their ``with block.session():`` block ends.
WAIT_FOR_SERVED = ("wait on their futures inside the `with block.session():` block, or raise teardown_timeout on "
                   "the CudfPolarsEngine block")
#: Save an engine block (``.format(name=..., backend=...)``).
SAVE_ENGINE = "`prefect-cudf-polars save-engine {name} --backend {backend}`"
#: No usable GPU here.
USE_CPU = "set backend='cpu' (or cpu_fallback=True) on the CudfPolarsEngine block to develop on the CPU"
#: A missing optional package (``.format(extra=...)``: cu13, cu12, ray, s3, check).
INSTALL = "`pip install -e '.[{extra}]'` in the prefect-cudf-polars checkout"
#: The RAPIDS packages' install, by CUDA driver.
INSTALL_RAPIDS = ("in the prefect-cudf-polars checkout, `pip install -e '.[cu13]'` (CUDA driver >= 580) or "
                  "`pip install -e '.[cu12]'` (older drivers)")
#: Create or resize an admission limit (``.format(name=..., slots=...)``).
SET_ADMISSION_LIMIT = "`prefect-cudf-polars admission-limit {name} --slots {slots}` (one slot per GiB of GPU memory)"
#: What every admission failure leaves.
NOTHING_STARTED = "the engine did not start and holds nothing"
#: The Prefect API did not answer.
CHECK_PREFECT_API = ("check that PREFECT_API_URL names a running Prefect server (or Prefect Cloud) this process "
                     "can reach, then run the flow again")
#: ``admission_limit`` without ``device_memory_limit`` (``.format(name=...)``).
ADMISSION_NEEDS_LIMIT = ("admission_limit={name!r} needs device_memory_limit: the slots a flow run occupies are its "
                         'device memory limit in GiB (set device_memory_limit, e.g. "40%")')
#: What ``admission_limit`` allows.
LIMIT_NAME_RULE = ("a Prefect global concurrency limit's name: a non-empty name without '/', '%', '&', '>' or '<' "
                   'and without spaces around it (e.g. "gpu-memory")')
#: What ``device_memory_limit`` and ``spill_device_limit`` allow (``.format(of=...)``).
MEMORY_AMOUNT_RULE = ('a percentage of {of} above 0% and at most 100% ("80%") or a number of bytes, at least 1 MiB '
                      '(60_000_000_000 or "60000000000")')
#: An external Dask cluster whose workers cannot run cudf-polars.
DASK_WORKERS = ("start one worker per GPU, on GPU machines, with cudf-polars' nanny preload (`dask worker "
                "<scheduler> --nworkers <GPUs> --nthreads 1 --preload-nanny cudf_polars.engine.dask`) or with "
                "dask-cuda (`dask cuda worker`)")
#: An external Dask cluster that cannot be used at all.
LOCAL_CLUSTER = "leave dask_scheduler_address empty to let the session start a LocalCUDACluster"
#: A write target that already holds data (``.format(what=...)``).
NEW_TARGET = "give a new {what}, or pass overwrite=True to delete what is there first"
#: A stored value another serializer wrote.
READ_WITH_ITS_SERIALIZER = "read it with the serializer named in its result record"


def invalid_fields(error: ValueError) -> str:
    """
    A pydantic ``ValidationError`` as one line: ``"field: what is wrong and what it allows; ..."``.

    Parameters
    ----------
    error : pydantic.ValidationError
        A block's refusal (its ``errors()``: each field's location and message).

    Returns
    -------
    str
        Each refused field with pydantic's message, less its ``"Value error, "`` prefix.
    """
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the block'}: {e['msg'].removeprefix('Value error, ')}"
                     for e in error.errors())


def wrong_type(what: str, wanted: str, got: object, then: str = "") -> str:
    """
    The message of a ``TypeError`` for an argument of the wrong type.

    Parameters
    ----------
    what : str
        What takes the argument (``"tee"``, ``"CudfPolarsTaskRunner(engine=...)"``).
    wanted : str
        What it takes (``"a GPUResult"``).
    got : object
        What it was given; its type is named.
    then : str, optional
        What to do instead, a clause.

    Returns
    -------
    str
        ``"<what> takes <wanted>, not <type>; <then>."`` (without ``then``: ``"... not <type>."``).
    """
    return f"{what} takes {wanted}, not {type(got).__name__}" + (f"; {then}." if then else ".")


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


NO_SESSION_MESSAGE = ("No cudf-polars engine session is active {where}. Give the flow one: "
                      "`@flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(...)))`, or open one in the flow body: "
                      "`with CudfPolarsEngine.load('name').session():`. GPU tasks must run inside that flow run, on its "
                      "thread-pool task runner.")

ENDED_WITH_BLOCK = ("The engine session {id} (`with block.session():`{where}) has ended, so it runs no more queries. "
                    "Task runs submitted inside the with block must finish before it exits: the session waits for them "
                    f"at most the block's teardown_timeout ({{limit:g}} s): {WAIT_FOR_SERVED}.")

ENDED_WITH_RUN = ("The engine session {id} ({by}{where}) has ended with its flow run, so it runs no more queries; open "
                  "a new session (a new flow run) to run more.")


class AdmissionError(SessionError):
    """
    A session could not occupy its admission slots, so its engine did not start.

    A :class:`~prefect_cudf_polars.blocks.CudfPolarsEngine` with ``admission_limit``
    occupies ``ceil(device_memory_limit / GiB)`` slots per GPU of that Prefect global
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


# ---- the result rules' messages (GPUResult builds its errors from these) ----------------------------


def released_message(what: str, owner: Any) -> str:
    """Why ``what`` (``"GPUResult 'name' (id ...)"``) cannot be read: it was released, by ``owner``'s end if it has ended."""
    if not owner.closed:
        return f"{what} was released; its data is gone: {RUN_PRODUCER_AGAIN}."
    if owner.subflow:
        return (f"{what} was released when its engine session ended: the session of {owner.served_run}, which ended "
                "with that subflow run (a subflow with its own task runner has its own session, and its GPU results "
                f"never outlive it). Collect the result inside the subflow and return the host DataFrame, or "
                f"{SHARE_PARENT_SESSION}.")
    return (f"{what} was released when its engine session ended: its flow run is over, and a GPU result never "
            "outlives its flow run, so do not return it from a flow or keep it for later; collect it inside the flow "
            "run and return the host DataFrame.")


#: How :class:`~prefect_cudf_polars.blocks.runs.RunIdentity` names code outside any Prefect run.
OUTSIDE_RUNS = "code outside any Prefect run"


def consumed_message(what: str, by: str, how: str) -> str:
    """Why ``what`` cannot be claimed: ``by`` claimed it (``how``: ``"earlier attempt"``, ``"same run"`` or ``"other"``)."""
    if how == "earlier attempt":  # a retry reading a result it was not given: gpu_task's retries recompute arguments
        return (f"{what} was already read by an earlier attempt of this {by}, which Prefect is retrying: a retry "
                "recomputes only the results given to a `gpu_task` as arguments, from their lineage. Make the task "
                "a `gpu_task` and pass it the result as an argument, or collect the result before this task and "
                "pass it the host DataFrame.")
    if how == "same run":  # a read after a query of the run that claimed it ran
        by = "thread (code outside any Prefect run)" if by == OUTSIDE_RUNS else by
        return (f"{what} was already read by a query that ran in this same {by}: a GPU result is read by one "
                f"query (which may read it several times, as a self-join does). To read it in two queries, "
                f"{SPLIT_WITH_TEE}.")
    return (f"{what} was already consumed by {by}: a GPU result is read once (cudf-polars moves its partitions "
            f"out on read). To give it to several tasks, {SPLIT_WITH_TEE}; or run the producing task again, or "
            "collect it once and reuse the host DataFrame.")


def read_again_message(what: str | None = None) -> str:
    """Why a query may not read a frame an earlier query read (``what``: the result, when known)."""
    return (f"{what or 'The query reads a GPU result that'} was already read by an earlier query: a result is read by "
            "one query (cudf-polars moves each partition out when it runs), which may read it several times (a "
            f"self-join runs). To read one result in two queries, {SPLIT_WITH_TEE}; or run the producing task again.")


def wrong_engine_message(what: str, producer: str, backend: str, produced_in: str | None, reader: Any) -> str:
    """Why ``what``, produced by session ``producer``, cannot be read by the session ``reader``."""
    where = f"{backend}, {produced_in}" if produced_in else backend
    advice = (f"Pass the subflow a host DataFrame (collect the result before the subflow), or {SHARE_PARENT_SESSION}."
              if reader.subflow else
              "Produce the result in this flow run, or collect it in its own flow run and pass the host DataFrame.")
    return (f"{what} belongs to engine session {producer} ({where}), but {reader.served_run or 'the code here'} has "
            f"its own engine session {reader.id} ({reader.backend}): only the engine that produced a result can "
            f"read it. {advice}")
