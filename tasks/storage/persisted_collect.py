"""
``persisted_collect``: the ``collect`` task with its host DataFrame kept in result storage.

``collect`` starts from the GPU tasks' defaults (no persistence, no input
caching). Turning persistence on takes three Prefect options together, which
this function sets: ``persist_result=True``, the storage block, a
:class:`~prefect_cudf_polars.tasks.PolarsDataFrameSerializer`, and a
``result_storage_key``. The key matters: with the GPU tasks' ``NO_CACHE``
policy Prefect computes no key and writes nothing, so a key template is
given and the cache policy cleared (Prefect then uses the key). The default
key names the flow run and task run, so every run writes its own record and
no later run reads an old one as a cache hit.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import Task

from prefect_cudf_polars.tasks.storage.dataframe_serializer import PolarsDataFrameSerializer
from prefect_cudf_polars.tasks.engine_tasks import collect

#: Default result key: one record per flow run and task run (Prefect fills the fields).
DEFAULT_KEY = "cudf-polars/{flow_run.id}/{task_run.id}"


def persisted_collect(result_storage: Any, *, key: str = DEFAULT_KEY, format: Literal["parquet", "ipc"] = "parquet",
                      **task_options: Any) -> Task[..., Any]:
    """
    ``collect``, persisting its DataFrame to ``result_storage``.

    Parameters
    ----------
    result_storage : prefect.filesystems.WritableFileSystem or str
        A saved result storage block (prefect-aws ``S3Bucket``, ``LocalFileSystem``,
        ``RemoteFileSystem``; Prefect refuses unsaved ones here) or a saved
        block's slug (``"s3-bucket/results"``).
    key : str
        The result's storage key; Prefect formats it with ``prefect.runtime``
        (``{flow_run.id}``, ``{task_run.id}``, ``{parameters[...]}``). A fixed key
        makes later runs read the stored record instead of running (Prefect's
        cache semantics for ``result_storage_key``).
    format : {"parquet", "ipc"}
        Serialization format (see :class:`PolarsDataFrameSerializer`).
    **task_options
        More ``Task.with_options`` options (``name``, ``retries``, ...).

    Returns
    -------
    prefect.Task
        Call it like ``collect``; ``state.result()`` or
        ``ResultStore(result_storage=...).read(key)`` reads the DataFrame back.
    """
    return collect.with_options(persist_result=True, result_storage=result_storage, result_storage_key=key,
                                result_serializer=PolarsDataFrameSerializer(format=format), cache_policy=None,
                                **task_options)
