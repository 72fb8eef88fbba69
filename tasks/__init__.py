"""
What flows call and what flows pass around: GPU result handles and the tasks that make them.

Public names
------------
GPUResult
    The handle a GPU task returns (one-shot, session-bound, never pickled).
GPUResultSerializer
    The Prefect serializer (type ``"cudf-polars-gpu"``) that refuses host persistence.
execute, collect
    Tasks: run a LazyFrame or GPUResult, return a GPUResult / a host DataFrame.
tee
    Task: split one GPUResult into N independent ones (fan-out), on the GPU.
gpu_task
    Decorator: a function building a LazyFrame becomes a task returning a GPUResult.
HostPersistenceError, ResultConsumedError, ResultReleasedError, WrongEngineError
    The errors of the result rules.
read_parquet, sink_parquet, ParquetSinkSummary
    Tasks: read parquet (local or ``s3://``) into a result; write a result to a
    folder or ``s3://`` prefix from the engine.
PolarsDataFrameSerializer, persisted_collect
    The Prefect serializer (type ``"polars-dataframe"``) for host DataFrames, and
    ``collect`` with its DataFrame persisted to result storage (S3 included).
S3AccessError
    Object storage refused or could not find what a task asked for.
    The errors of the result rules; CannotRecomputeError (a consumed result whose
    lineage cannot be replayed) and DeviceMemoryError (device memory exhausted).
"""

from prefect_cudf_polars.tasks.engine_tasks import collect, execute
from prefect_cudf_polars.tasks.errors import (
    CannotRecomputeError,
    DeviceMemoryError,
    GPUResultError,
    HostPersistenceError,
    ResultConsumedError,
    ResultReleasedError,
    WrongEngineError,
)
from prefect_cudf_polars.tasks.fan_out import tee
from prefect_cudf_polars.tasks.gpu_task import gpu_task
from prefect_cudf_polars.tasks.result import GPUResult
from prefect_cudf_polars.tasks.serializer import GPUResultSerializer
from prefect_cudf_polars.tasks.dataframe_serializer import PolarsDataFrameSerializer
from prefect_cudf_polars.tasks.persisted_collect import persisted_collect
from prefect_cudf_polars.tasks.s3_read import read_parquet
from prefect_cudf_polars.tasks.sink import ParquetSinkSummary, sink_parquet
from prefect_cudf_polars.tasks.storage_errors import S3AccessError

__all__ = [
    "CannotRecomputeError",
    "DeviceMemoryError",
    "GPUResult",
    "GPUResultError",
    "GPUResultSerializer",
    "HostPersistenceError",
    "ParquetSinkSummary",
    "PolarsDataFrameSerializer",
    "ResultConsumedError",
    "ResultReleasedError",
    "S3AccessError",
    "WrongEngineError",
    "collect",
    "execute",
    "gpu_task",
    "persisted_collect",
    "read_parquet",
    "sink_parquet",
    "tee",
]
