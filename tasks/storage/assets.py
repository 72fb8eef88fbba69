"""
What the storage tasks read and write, as Prefect assets (``prefect.assets``, Prefect 3.9).

An asset key is a URI: an ``s3://`` URL as given (without a trailing ``/``), or
the ``file://`` URI of a local path (:func:`asset_key`).

* ``read_parquet`` declares its sources as upstream assets of its task run
  (:func:`declare_sources`), as ``asset_deps`` would if the sources were known
  when the task was defined. Prefect passes a task run's upstream assets on to
  every task run that receives its result (``AssetContext.update_tracked_assets``
  and ``AssetContext.from_task_and_inputs``), through GPU tasks, ``tee`` and
  tasks of your own.
* ``sink_parquet`` declares the target it writes as an asset its task run
  materializes, by ``cudf-polars`` (:func:`declare_target`), as ``@materialize``
  would if the target were known when the task was defined, and adds the rows,
  bytes, schema and backend written once the write succeeded
  (:func:`record_written`). When the task run ends, Prefect emits
  ``prefect.asset.referenced`` for each upstream asset and
  ``prefect.asset.materialization.succeeded`` (or ``.failed``) for the target,
  related to its upstream assets.

Outside a task run, or for a location no valid asset key names (a local path
with a space, say), nothing is recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.assets import Asset, AssetProperties
from prefect.context import AssetContext
from pydantic import ValidationError

from prefect_cudf_polars.tasks.storage.location import is_s3_url

#: The ``asset-materialized-by`` of the assets the storage tasks materialize.
MATERIALIZED_BY = "cudf-polars"


def asset_key(location: str) -> str | None:
    """
    The asset key of a local path or ``s3://`` URL, or ``None`` when no valid key names it.

    Parameters
    ----------
    location : str
        A local file or folder (made absolute), or an ``s3://`` URL.

    Returns
    -------
    str or None
        ``s3://bucket/prefix`` or ``file:///abs/path``; ``None`` for a location
        Prefect's asset keys cannot hold (Prefect refuses spaces and
        ``%?#&"'<>[]{}|\\^``).
    """
    key = location.rstrip("/") if is_s3_url(location) else Path(location).expanduser().resolve().as_uri()
    try:
        Asset(key=key)
    except ValidationError:
        return None
    return key


def declare_sources(locations: list[str]) -> None:
    """
    Declare ``locations`` as upstream assets of the current task run.

    Parameters
    ----------
    locations : list of str
        Local paths or ``s3://`` URLs read.
    """
    ctx = AssetContext.get()
    if ctx is None:
        return
    sources = {Asset(key=key) for key in map(asset_key, locations) if key is not None}
    ctx.direct_asset_dependencies = ctx.direct_asset_dependencies | sources
    ctx.update_tracked_assets()


def declare_target(location: str) -> str | None:
    """
    Declare ``location`` as the asset the current task run materializes.

    Parameters
    ----------
    location : str
        The folder or ``s3://`` prefix about to be written.

    Returns
    -------
    str or None
        Its asset key, or ``None`` when nothing was declared.
    """
    ctx = AssetContext.get()
    key = asset_key(location)
    if ctx is None or key is None:
        return None
    name = Path(location.rstrip("/")).name or location
    ctx.downstream_assets = ctx.downstream_assets | {Asset(key=key, properties=AssetProperties(name=name))}
    ctx.materialized_by = MATERIALIZED_BY
    ctx.update_tracked_assets()
    return key


def record_written(key: str | None, metadata: dict[str, Any]) -> None:
    """
    Add ``metadata`` (JSON values) to the materialization of the asset ``key`` in the task run here.

    Parameters
    ----------
    key : str or None
        The asset the current materialization declares (:func:`declare_target`'s, or a ``materialize``
        task's asset key); ``None``: nothing is recorded.
    metadata : dict
        For example ``rows``, ``bytes``, ``schema`` and ``backend``.
    """
    ctx = AssetContext.get()
    if ctx is not None and key is not None:
        ctx.add_asset_metadata(key, metadata)
