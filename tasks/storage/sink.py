"""
``sink_parquet``: write a result to a local folder or an ``s3://`` prefix from the engine.

The result's LazyFrame is sunk with ``polars.LazyFrame.sink_parquet`` and run
by the session's engine, so on the GPU backends libcudf writes the parquet
files straight from GPU memory (cudf-polars' streaming sink, one file per
partition: ``part.000000.parquet``, ``part.000001.parquet``, ...; with several
ranks ``part.<rank>.<n>.parquet``); the result is never collected to the host.

``s3://`` targets: cudf-polars' sink writes to local paths only (its streaming
sink creates the folder with ``Path.mkdir``; libcudf has no object-store
writer), so the engine writes the part files to a local staging folder, and
each file is then uploaded with boto3 (multipart for large files, streamed
from disk) and deleted locally. If an upload fails, the staged files are kept
and the error says where. The ``cpu`` backend takes the same path, which is
what lets CI test the upload without a GPU.

Before anything is claimed or written, the target is checked: the bucket must
exist and accept the credentials, and the folder or prefix must be empty
(``overwrite=True`` deletes what is there first). A bad target therefore loses
nothing: the result stays live and can be written elsewhere.

The target is a Prefect asset the task run materializes, with the rows, bytes,
schema and backend written, and the sources ``read_parquet`` read as its
upstream assets (:mod:`~prefect_cudf_polars.tasks.storage.assets`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from pydantic import BaseModel, Field

from prefect_cudf_polars.blocks import GPUResult
from prefect_cudf_polars.blocks.errors import NEW_TARGET, wrong_type
from prefect_cudf_polars.tasks.calls import EngineCall
from prefect_cudf_polars.tasks.storage.assets import declare_target, record_written
from prefect_cudf_polars.tasks.storage.credentials import S3Access, resolve_s3_access
from prefect_cudf_polars.tasks.storage.location import S3Location, client_errors, delete_keys, is_s3_url, parse_s3_url
from prefect_cudf_polars.tasks.storage.errors import S3AccessError
from prefect_cudf_polars.tasks.storage.run_names import sink_parquet_run_name
from prefect_cudf_polars.tasks.gpu_task_type import gpu_prefect_task as task
from prefect_cudf_polars.tasks.task_defaults import gpu_task_defaults

if TYPE_CHECKING:
    from prefect_aws import AwsCredentials

#: Compression codecs both polars and cudf-polars write.
COMPRESSIONS = ("zstd", "snappy", "lz4", "uncompressed")


class ParquetSinkSummary(BaseModel):
    """
    What :func:`sink_parquet` wrote (a small host value; safe to persist).

    Attributes
    ----------
    target : str
        The folder or ``s3://`` prefix written.
    files : list of str
        Every file written (local paths or ``s3://`` URLs), in name order.
    rows : int
        Rows written, summed from the files' parquet footers.
    bytes : int
        Bytes written, summed over the files.
    backend : str
        The engine's backend (``spmd``, ``dask``, ``ray`` or ``cpu``).
    """

    target: str
    files: list[str] = Field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    backend: str


def _check_local_target(folder: Path, *, overwrite: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"sink_parquet target {str(folder)!r} is a file, not a folder. Give a folder path (the "
                              "engine writes one parquet file per partition into it).")
    if folder.is_dir() and any(folder.iterdir()):
        if not overwrite:
            raise FileExistsError(f"sink_parquet target {str(folder)!r} is not empty: "
                                  f"{NEW_TARGET.format(what='or empty folder')}.")
        shutil.rmtree(folder)


def _check_s3_target(location: S3Location, access: S3Access, *, overwrite: bool) -> Any:
    client = access.client()
    # One listing of the prefix asks for the bucket too (its errors as check_readable's) and finds what it holds.
    with client_errors(location, access, doing="write parquet to", bucket_request=True):
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=location.folder_key(""))
        keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    if keys and not overwrite:
        raise S3AccessError(f"Could not write parquet to {location.url}: the prefix already holds {len(keys)} "
                            f"object(s) (e.g. {keys[0]!r}); {NEW_TARGET.format(what='prefix')}.", url=location.url,
                            reason="exists")
    with client_errors(location, access, doing="write parquet to"):
        delete_keys(client, location, keys)
    return client


def _upload(files: list[Path], folder: Path, *, location: S3Location, access: S3Access, client: Any) -> list[str]:
    """Upload the staged part ``files`` under ``location`` and remove the staging ``folder``; their ``s3://`` URLs.
    A failed upload deletes the keys it wrote and keeps ``folder`` (the :class:`S3AccessError` says where)."""
    keys: list[str] = []
    for path in files:
        key = location.folder_key(path.relative_to(folder).as_posix())
        try:
            with client_errors(location, access, doing="write parquet to"):
                client.upload_file(str(path), location.bucket, key)
        except S3AccessError as error:
            cleaned = "deleted again"
            try:  # the prefix is empty again, as the task found it: a retry can write it
                delete_keys(client, location, keys)
            except Exception:
                cleaned = "left in place (deleting them failed too)"
            raise S3AccessError(
                f"{error} The engine had written all {len(files)} part file(s); the {len(keys)} uploaded were "
                f"{cleaned}, and every part is kept in {str(folder)!r} for you to upload or inspect.",
                url=location.url, reason=error.reason) from None
        keys.append(key)
    shutil.rmtree(folder, ignore_errors=True)
    return [f"s3://{location.bucket}/{k}" for k in keys]


@task(name="cudf-polars-sink-parquet", task_run_name=sink_parquet_run_name,
      **gpu_task_defaults(returns_gpu_result=False))
def sink_parquet(result: GPUResult, target: str, credentials: AwsCredentials | None = None, overwrite: bool = False,
                 compression: str = "zstd", staging_dir: str | None = None) -> ParquetSinkSummary:
    """
    Write a result to parquet from the engine (the GPU on GPU backends) and consume it.

    Parameters
    ----------
    result : GPUResult
        A live result of this flow run's session; it is consumed (read once).
    target : str
        A local folder (created if absent) or an ``s3://bucket/prefix``.
    credentials : prefect_aws.AwsCredentials, optional
        For ``s3://`` targets: keys, region and endpoint
        (``aws_client_parameters.endpoint_url`` for MinIO or moto).
    overwrite : bool
        Delete what the folder or prefix holds before writing (default False:
        a non-empty target is an error).
    compression : {"zstd", "snappy", "lz4", "uncompressed"}
        Parquet compression codec.
    staging_dir : str, optional
        Where part files wait for upload to S3 (default: the system temporary
        folder). Needs room for the whole result; on the ``dask`` and ``ray``
        backends it must be reachable by every rank (one machine, or a shared
        file system).

    Returns
    -------
    ParquetSinkSummary
        Files written, rows and bytes (from the files' parquet footers and sizes).
        The target is an asset the task run materializes (``file://`` URI for a
        folder), with those figures, the schema and the backend as metadata.

    Raises
    ------
    FileExistsError
        A local target is a file, or a non-empty folder without ``overwrite``.
    S3AccessError
        Before writing: the bucket does not exist, the credentials are refused or
        lack permission, or the prefix is not empty without ``overwrite``. After
        writing: an upload failed (the staged files are kept; the message says where).
    ValueError
        Unknown ``compression``, or the block's endpoint URL is not ``http(s)://``.
    TypeError
        If ``result`` is not a :class:`GPUResult`, or ``credentials`` is not an
        ``AwsCredentials`` block (``s3://`` targets).
    ResultReleasedError, ResultConsumedError, WrongEngineError
        If ``result`` cannot be read in this session (checked before anything is written).
    CannotRecomputeError
        A retry of this task run needs ``result`` again, and the attempt before
        read it and its lineage cannot be run again.
    NotImplementedError, DeviceMemoryError
        cudf-polars cannot run the write, or ran out of device memory; the
        partial parts are removed.
    NoEngineSessionError, SessionError
        If the flow run has no engine session, or it has ended.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression={compression!r} is not one of {', '.join(COMPRESSIONS)}.")
    if not isinstance(result, GPUResult):
        raise TypeError(wrong_type("sink_parquet", "a GPUResult", result, "write host data with polars"))
    upload = None  # for s3:// targets: what uploads the staged part files
    with EngineCall(result) as call:  # the result is checked first: overwrite deletes only for a readable one
        result, session = call.args, call.session
        if is_s3_url(target):  # a refused target claims nothing: the result stays live
            location, access = parse_s3_url(target), resolve_s3_access(credentials)
            upload = partial(_upload, location=location, access=access,
                             client=_check_s3_target(location, access, overwrite=overwrite))
            folder = Path(tempfile.mkdtemp(prefix="cudf-polars-sink-", dir=staging_dir))
            os.rmdir(folder)  # the engine creates it (cudf-polars refuses none on spmd)
        else:
            folder = Path(target).expanduser().resolve()
            _check_local_target(folder, overwrite=overwrite)
            target = str(folder)
        asset = declare_target(target)
        schema = {name: str(dtype) for name, dtype in result.schema.items()}
        # polars' CPU sink writes one file; cudf-polars' streaming engines a folder of parts.
        sink_path = folder / "part.000000.parquet" if session.backend == "cpu" else folder
        try:
            call.collect(result.lazy().sink_parquet(str(sink_path), compression=compression,  # type: ignore[arg-type]
                                                    mkdir=True, lazy=True))
        except BaseException:
            # Partial parts are of no use; the folder was empty or new: a retry finds it so again.
            shutil.rmtree(folder, ignore_errors=True)
            raise

    files = sorted(path for path in folder.rglob("*.parquet") if path.is_file())
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    size = sum(f.stat().st_size for f in files)
    written = [str(f) for f in files] if upload is None else upload(files, folder)
    summary = ParquetSinkSummary(target=target, files=written, rows=rows, bytes=size,
                                 backend=session.backend or "unknown")
    record_written(asset, {"rows": rows, "bytes": size, "schema": schema, "backend": summary.backend,
                           "files": len(written)})
    return summary
