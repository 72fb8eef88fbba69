"""
Reading parquet from ``s3://`` (or local paths) on every backend: the ``read_parquet`` task.

How the credentials reach each reader (see
:mod:`prefect_cudf_polars.tasks.storage.credentials`):

* ``cpu`` backend: polars' own reader, with the credentials as the scan's
  ``storage_options``.
* GPU backends (``spmd``, ``dask``, ``ray``): cudf-polars reads the objects
  on the GPU through libcudf and KvikIO, which take credentials from ``AWS_*``
  environment variables; they are set on the session's owner thread (and on
  every rank) for the one engine call
  (``environment`` of :meth:`~prefect_cudf_polars.blocks.EngineSession.execute`).
  The scan carries only the endpoint and region as ``storage_options`` (for
  polars' client-side schema lookup, whose object-store cache is keyed by
  them), never a key: cudf-polars ignores the scan's cloud options, and keeps
  them in its query plan, where a secret does not belong.

With ``raise_on_fail=True`` on the engine block (its default), a read that
cudf-polars cannot run on the GPU fails instead of falling back to the CPU.

The sources are the task run's upstream assets
(:mod:`~prefect_cudf_polars.tasks.storage.assets`): a ``sink_parquet`` of what
was computed from them records them as the written asset's upstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from prefect_cudf_polars.blocks import EngineSession, GPUResult
from prefect_cudf_polars.blocks.backends.engine_errors import iter_exceptions
from prefect_cudf_polars.tasks.calls import EngineCall
from prefect_cudf_polars.tasks.storage.assets import declare_sources
from prefect_cudf_polars.tasks.storage.credentials import S3Access, resolve_s3_access, scrub
from prefect_cudf_polars.tasks.storage.errors import S3AccessError, explain_engine_error
from prefect_cudf_polars.tasks.storage.location import S3Location, check_readable, is_s3_url, parse_s3_url
from prefect_cudf_polars.tasks.storage.run_names import read_parquet_run_name, source_name
from prefect_cudf_polars.tasks.gpu_task_type import gpu_prefect_task as task
from prefect_cudf_polars.tasks.task_defaults import gpu_task_defaults

if TYPE_CHECKING:
    from prefect_aws import AwsCredentials


def _sources(source: str | Sequence[str]) -> list[str]:
    sources = [source] if isinstance(source, str) else [str(s) for s in source]
    if not sources:
        raise ValueError("read_parquet needs at least one path or s3:// URL.")
    return sources


def scan_parquet(source: str | Sequence[str], access: S3Access | None, *, backend: str,
                 **scan_options: Any) -> pl.LazyFrame:
    """
    ``polars.scan_parquet`` with the options the given backend's reader needs.

    Parameters
    ----------
    source
        Local paths or ``s3://`` URLs (objects, prefixes ending in ``/``, or glob
        patterns such as ``s3://bucket/trips/*.parquet``).
    access
        From :func:`~prefect_cudf_polars.tasks.storage.credentials.resolve_s3_access`;
        ``None`` for local paths.
    backend
        The session's backend: ``"cpu"`` gets the credentials as
        ``storage_options``; GPU backends get only endpoint and region (run the
        frame with the ``environment`` of :meth:`~prefect_cudf_polars.blocks.EngineSession.execute`).
    **scan_options
        More ``polars.scan_parquet`` options (``hive_partitioning``, ...);
        ``storage_options`` is the one set here for ``s3://`` sources.

    Returns
    -------
    polars.LazyFrame
    """
    sources = _sources(source)
    if access is not None and any(is_s3_url(s) for s in sources):
        scan_options["storage_options"] = access.storage_options(keys=backend == "cpu")
    return pl.scan_parquet(sources if len(sources) > 1 else sources[0], **scan_options)


def run_reading_s3(session: EngineSession, access: S3Access, fn: Any, *args: Any, url: str, **kwargs: Any) -> Any:
    """
    Run an engine call (``session.execute``/``collect``) that reads ``s3://`` objects.

    GPU backends get the credentials as ``AWS_*`` variables for the call; engine
    errors that quote an S3 answer become :class:`S3AccessError` (secrets scrubbed).

    Raises
    ------
    S3AccessError
        When the engine's reader was refused or found nothing; when the GPU
        reader's error does not say why, the reason is the server's answer to
        a listing with the same credentials (:func:`_ask_the_server`).
    """
    environment = {} if session.backend == "cpu" else {"environment": access.environment()}
    try:
        return fn(*args, **environment, **kwargs)
    except Exception as exc:
        location = parse_s3_url(url)
        translated = explain_engine_error(exc, url=url, bucket=location.bucket, access=access,
                                          doing="read parquet from") or _ask_the_server(location, access, exc)
        if translated is None:
            raise
        raise translated from None


def _ask_the_server(location: S3Location, access: S3Access, exc: BaseException) -> S3AccessError | None:
    """
    Explain libcudf's failure to open a remote file through KvikIO: ask the server with boto3.

    With keys the server refuses, cudf-polars 26.10 (libcudf through KvikIO)
    fails the GPU read with ``RuntimeError('CUDF failure at: .../datasource.cpp:430:
    Error accessing the remote file. Reason: KvikIO detects an URL error at:
    .../url.cpp:114: Unsupported URL scheme')``: the server's answer is not in it.
    So the URL's prefix is listed with the same credentials (:func:`check_readable`);
    its answer (refused keys, no permission, no bucket, no object) becomes the
    error. If the server answers the listing, the error quotes the engine's
    message (secrets scrubbed) with ``reason="failed"``.

    Returns
    -------
    S3AccessError or None
        ``None`` when ``exc`` is not that failure (re-raise it as is).
    """
    if not any("error accessing the remote file" in str(e).lower() for e in iter_exceptions(exc)):
        return None
    try:
        check_readable(location, access)
    except S3AccessError as answer:
        return S3AccessError(f"{answer} (The GPU reader, KvikIO, reported only: "
                             f"{scrub((str(exc).strip().splitlines() or [type(exc).__name__])[-1], access)})",
                             url=answer.url, reason=answer.reason)
    return S3AccessError(
        f"Could not read parquet from {location.url} on the GPU: the reader (libcudf through KvikIO) failed with "
        f"{type(exc).__name__}: {scrub(str(exc), access)} although {access.describe()} lists the objects with the "
        "same credentials. Check that AWS_* variables of this process do not override the block, and that the "
        "objects are parquet files.", url=location.url, reason="failed")


@task(name="cudf-polars-read-parquet", task_run_name=read_parquet_run_name, **gpu_task_defaults())
def read_parquet(source: str | list[str], credentials: AwsCredentials | None = None, columns: list[str] | None = None,
                 predicate: pl.Expr | None = None, name: str | None = None) -> GPUResult:
    """
    Read parquet from ``s3://`` URLs or local paths into a result on the engine.

    On the GPU backends the read itself runs on the GPU (cudf-polars through
    KvikIO); on ``cpu``, polars reads. Columns and the predicate are pushed into
    the scan, so only what is needed is read.

    Parameters
    ----------
    source : str or list of str
        ``s3://bucket/key.parquet``, a prefix (``s3://bucket/trips/``), a glob
        (``s3://bucket/trips/*.parquet``), local paths, or a list of them.
    credentials : prefect_aws.AwsCredentials, optional
        The block with keys, region and (for MinIO or moto) the endpoint in
        ``aws_client_parameters.endpoint_url``. ``None``: anonymous access (public
        buckets) for ``s3://`` URLs.
    columns : list of str, optional
        Columns to read (default: all).
    predicate : polars.Expr, optional
        Rows to keep, e.g. ``pl.col("distance") > 0``.
    name : str, optional
        Readable name of the result (default: the file's stem or the folder's
        name, ``"trips"`` for ``s3://lake/trips/``). The task run is named
        ``read-parquet-<name>``.

    Returns
    -------
    GPUResult
        Live in the flow run's engine session. The sources are upstream assets
        of the task run (``file://`` URIs for local paths).

    Raises
    ------
    S3AccessError
        Before the read: the bucket does not exist, the server refused the
        credentials or denied access, or no object matches a URL (checked with
        boto3). During the read: the engine's reader was refused.
    NoEngineSessionError
        If the flow run has no engine session.
    ValueError
        If ``source`` is an empty list, or the block's endpoint URL is not ``http(s)://``.
    TypeError
        If ``credentials`` is not an ``AwsCredentials`` block (``s3://`` sources).
    FileNotFoundError, polars.exceptions.ColumnNotFoundError
        A local path does not exist, or ``columns`` or ``predicate`` names a
        column the files do not have; nothing was read.
    NotImplementedError
        cudf-polars cannot run the scan (the block's ``raise_on_fail``); nothing was read.
    DeviceMemoryError
        The engine ran out of device memory (the message names the block fields that help).
    SessionError
        The flow run's engine session has ended.
    """
    sources = _sources(source)
    remote = [s for s in sources if is_s3_url(s)]
    access = resolve_s3_access(credentials) if remote else None
    for url in remote:
        assert access is not None
        check_readable(parse_s3_url(url), access)
    declare_sources(sources)
    name = name or source_name(sources)
    with EngineCall(()) as call:
        lf = scan_parquet(sources, access, backend=call.session.backend or "cpu")
        if columns is not None:
            lf = lf.select(columns)
        if predicate is not None:
            lf = lf.filter(predicate)
        if access is None:  # local paths only
            return call.execute(lf, name=name)
        return run_reading_s3(call.session, access, call.execute, lf, url=remote[0], name=name)
