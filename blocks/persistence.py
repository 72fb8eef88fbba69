"""
A GPU result is never written to the host: the refusal every serializer meets, and the one exception, cache keys.

Prefect 3.9 reaches a value's bytes through two callers, and they share every
function below them:

* **Result persistence.** ``ResultRecord.serialize_result``
  (``prefect/_internal/result_records.py``) calls ``serializer.dumps(value)``:
  ``PickleSerializer`` (cloudpickle or pickle, also under ``compressed/``) pickles,
  which reaches :meth:`GPUResult.__reduce__`; ``JSONSerializer`` runs
  ``json.dumps(value, default=prefect_json_object_encoder)``, whose encoder calls
  ``custom_pydantic_encoder`` and so pydantic's ``to_jsonable_python``, which
  reaches ``GPUResult.__pydantic_serializer__``.
* **Cache keys.** ``prefect.utilities.hashing.hash_objects`` (called by the
  ``INPUTS`` and ``DEFAULT`` cache policies and by ``task_input_hash``) runs
  ``JSONSerializer(dumps_kwargs={"sort_keys": True}).dumps((args, kwargs))``,
  the same encoder chain, and falls back to cloudpickle. ``Inputs.compute_key``
  applies ``STABLE_TRANSFORMS`` only to top-level inputs, so a result inside a
  list or dict reaches the JSON encoder as itself.

Same encoder, same object, same arguments (a user's ``JSONSerializer`` may sort
keys too): the only difference between the two is the caller. So the JSON form
of a result is its id only while ``hash_objects`` is on this thread's stack
(:func:`computing_cache_key`), and everything else refuses
(:func:`refuse_host_persistence`): no serializer writes a record of a result,
and cache keys hash a result by its id, wherever it sits.

A refusal inside a task run also logs a WARNING on that task run, once per run:
Prefect logs the serializer's failure as "Encountered an error while serializing
result", without the reason, and completes the task run.
"""

from __future__ import annotations

import inspect
import threading
import traceback
from collections import OrderedDict
from typing import Any, NoReturn

from prefect.context import TaskRunContext

from prefect_cudf_polars.blocks.errors import KEEP_ON_HOST, NOT_PERSISTED, HostPersistenceError

REFUSAL_MESSAGE = ("GPUResult {name!r} (id {id}) cannot be pickled or persisted: its partitions live in GPU memory of "
                   "the process that holds the engine. Pass GPU results only between tasks of one flow run with the "
                   "thread-pool task runner (CudfPolarsTaskRunner, or Prefect's default ThreadPoolTaskRunner inside "
                   "`with block.session():`), not a process-based runner (Dask, Ray, ProcessPool), and do not persist "
                   f"them; {KEEP_ON_HOST}.")
NOT_PERSISTED_WARNING = (f"Task run %r returns GPUResult %r (id %s) and result persistence is on, but {NOT_PERSISTED}; "
                         f"{KEEP_ON_HOST}, and set persist_result=False on this task.")

#: Task runs already warned (most recent last); bounded, so a long process keeps no growing set.
_WARNED_RUNS: OrderedDict[Any, None] = OrderedDict()
_WARNED_LIMIT = 4096
_WARNED_LOCK = threading.Lock()


def computing_cache_key() -> bool:
    """
    Whether Prefect is hashing values for a cache key on this thread now.

    True while ``prefect.utilities.hashing.hash_objects`` (Prefect 3.9) is on
    the current thread's stack.

    Returns
    -------
    bool
    """
    from prefect.utilities.hashing import hash_objects

    return any(frame.f_code is hash_objects.__code__ for frame, _ in traceback.walk_stack(inspect.currentframe()))


def warn_once_in_task_run(message: str, *args: Any) -> bool:
    """
    Log a WARNING on the current task run, unless this run was warned already.

    Parameters
    ----------
    message, *args
        A %-format and its arguments.

    Returns
    -------
    bool
        True when the warning was logged; False outside a task run or when the
        run was warned before.
    """
    from prefect.logging import get_run_logger

    ctx = TaskRunContext.get()
    if ctx is None or ctx.task_run is None:
        return False
    with _WARNED_LOCK:
        if ctx.task_run.id in _WARNED_RUNS:
            return False
        _WARNED_RUNS[ctx.task_run.id] = None
        while len(_WARNED_RUNS) > _WARNED_LIMIT:
            _WARNED_RUNS.popitem(last=False)
    get_run_logger().warning(message, *args)
    return True


def refuse_host_persistence(result: Any) -> NoReturn:
    """
    Refuse to pickle or serialize ``result`` (a :class:`GPUResult`).

    Inside a task run (result persistence) this also logs a WARNING on the
    task run, once, saying that nothing was persisted and why; not while a
    cache key is computed.

    Parameters
    ----------
    result : GPUResult

    Raises
    ------
    HostPersistenceError
        Always.
    """
    if not computing_cache_key():
        run = getattr(TaskRunContext.get(), "task_run", None)
        warn_once_in_task_run(NOT_PERSISTED_WARNING, getattr(run, "name", None), result.name, result.id)
    raise HostPersistenceError(REFUSAL_MESSAGE.format(name=result.name, id=result.id), result_id=result.id,
                               result_name=result.name)


def cache_key_form(result: Any) -> dict[str, str]:
    """
    A result's JSON form: ``{"gpu_result_id": id}`` for a cache key, and a refusal otherwise.

    Parameters
    ----------
    result : GPUResult

    Returns
    -------
    dict
        While :func:`computing_cache_key` is true.

    Raises
    ------
    HostPersistenceError
        Anywhere else (a JSON serializer persisting a result); see
        :func:`refuse_host_persistence`.
    """
    if computing_cache_key():
        return {"gpu_result_id": result.id}
    refuse_host_persistence(result)
