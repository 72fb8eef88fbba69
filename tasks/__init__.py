"""
What flows call: the Prefect tasks that produce, pass and collect GPU results.

Public names
------------
GPUResult
    The handle a GPU task returns (one-shot, session-bound, never pickled).
execute, collect
    Tasks: run a LazyFrame or GPUResult, return a GPUResult / a host DataFrame.
gpu_task
    Decorator: a function building a LazyFrame becomes a task returning a GPUResult.
tee
    Task: split one GPUResult into N independent ones (fan-out), on the GPU.
GPUResultSerializer
    The Prefect serializer (type ``"cudf-polars-gpu"``) that refuses host persistence.
read_parquet, sink_parquet, ParquetSinkSummary
    Tasks: read parquet (local or ``s3://``) into a result; write a result to a
    folder or ``s3://`` prefix from the engine.
PolarsDataFrameSerializer, persisted_collect
    The Prefect serializer (type ``"polars-dataframe"``) for host DataFrames, and
    ``collect`` with its DataFrame persisted to result storage (S3 included).
HostPersistenceError, ResultConsumedError, ResultReleasedError, WrongEngineError, GPUResultError
    The errors of the result rules.
CannotRecomputeError
    A consumed result whose lineage cannot be replayed.
DeviceMemoryError
    The engine ran out of device memory.
S3AccessError
    Object storage refused or could not find what a task asked for.

This package imports :mod:`prefect_cudf_polars.blocks` (the engine side) and is
never imported by it.
"""

from prefect_cudf_polars.blocks.errors import (CannotRecomputeError, DeviceMemoryError, GPUResultError,
                                               HostPersistenceError, ResultConsumedError, ResultReleasedError,
                                               WrongEngineError)
from prefect_cudf_polars.blocks.results import GPUResult
from prefect_cudf_polars.tasks.engine_tasks import collect, execute
from prefect_cudf_polars.tasks.fan_out import tee
from prefect_cudf_polars.tasks.gpu_task import gpu_task
from prefect_cudf_polars.tasks.serializer import GPUResultSerializer
from prefect_cudf_polars.tasks.storage.dataframe_serializer import PolarsDataFrameSerializer
from prefect_cudf_polars.tasks.storage.errors import S3AccessError
from prefect_cudf_polars.tasks.storage.persisted_collect import persisted_collect
from prefect_cudf_polars.tasks.storage.read import read_parquet
from prefect_cudf_polars.tasks.storage.sink import ParquetSinkSummary, sink_parquet

__all__ = ["CannotRecomputeError", "DeviceMemoryError", "GPUResult", "GPUResultError", "GPUResultSerializer",
           "HostPersistenceError", "ParquetSinkSummary", "PolarsDataFrameSerializer", "ResultConsumedError",
           "ResultReleasedError", "S3AccessError", "WrongEngineError", "collect", "execute", "gpu_task",
           "persisted_collect", "read_parquet", "sink_parquet", "tee"]
