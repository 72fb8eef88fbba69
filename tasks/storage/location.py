"""
``s3://`` URLs: parsing, and the checks made before an engine call touches them.

The checks ask the server (boto3, with the flow's credentials) before any data
moves, so a missing bucket, refused keys or an empty prefix fail with a clear
:class:`~prefect_cudf_polars.tasks.storage.errors.S3AccessError` before a GPU
result is claimed or a query is planned, whatever the backend; the engines' own
messages for the same failures differ (polars' object store, KvikIO) and quote
requests. :func:`client_errors` turns what boto3 raises into that error, and
:func:`delete_keys` deletes the keys under a sink's prefix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from typing import Any

from prefect_cudf_polars.tasks.storage.credentials import S3Access
from prefect_cudf_polars.tasks.storage.errors import S3AccessError, answer_of, explain

#: A glob character in a key or path.
GLOB = re.compile(r"[*?\[]")


@dataclasses.dataclass(frozen=True)
class S3Location:
    """
    A parsed ``s3://bucket/key`` URL.

    Attributes
    ----------
    url : str
        The URL as given.
    bucket : str
    key : str
        The object key, prefix or pattern after the bucket (may be empty).
    """

    url: str
    bucket: str
    key: str

    def folder_key(self, name: str) -> str:
        """The object key of ``name`` under this location taken as a folder."""
        prefix = self.key.rstrip("/")
        return f"{prefix}/{name}" if prefix else name


def is_s3_url(path: object) -> bool:
    """Whether ``path`` is a string starting with ``s3://``."""
    return isinstance(path, str) and path.lower().startswith("s3://")


def parse_s3_url(url: str) -> S3Location:
    """
    Split ``s3://bucket/key`` into bucket and key.

    Raises
    ------
    ValueError
        If ``url`` is not an ``s3://`` URL with a bucket name.
    """
    if not is_s3_url(url):
        raise ValueError(f"{url!r} is not an s3:// URL (expected s3://bucket/key).")
    bucket, _, key = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (expected s3://bucket/key).")
    return S3Location(url=url, bucket=bucket, key=key)


@contextlib.contextmanager
def client_errors(location: S3Location, access: S3Access, *, doing: str,
                  bucket_request: bool = False) -> Iterator[None]:
    """
    Raise what boto3 raises in the block as an :class:`S3AccessError` (the server's answer, :func:`explain`).

    Parameters
    ----------
    location
        The ``s3://`` URL concerned.
    access, doing, bucket_request
        As for :func:`~prefect_cudf_polars.tasks.storage.errors.explain`.

    Raises
    ------
    S3AccessError
        For any exception raised in the block.
    """
    try:
        yield
    except Exception as exc:
        code, status = answer_of(exc)
        raise explain(url=location.url, bucket=location.bucket, code=code, status=status, access=access, doing=doing,
                      detail=f"{type(exc).__name__}: {exc}", bucket_request=bucket_request) from None


def check_readable(location: S3Location, access: S3Access) -> None:
    """
    Check, before the engine reads it, that ``location`` names at least one object.

    The server is asked with ``ListObjectsV2`` (one key at most) rather than
    ``HeadBucket``: a HEAD answer has no body, so its 403 cannot tell refused keys from missing
    permission, while a listing's error code can (``InvalidAccessKeyId``,
    ``SignatureDoesNotMatch``, ``AccessDenied``, ``NoSuchBucket``).

    Parameters
    ----------
    location
        The URL of one object, a prefix or a glob pattern.
    access
        The credentials the engine will use.

    Raises
    ------
    S3AccessError
        Missing bucket, refused credentials, no permission, or no object under
        the URL (``reason="not-found"``).
    """
    prefix = GLOB.split(location.key, maxsplit=1)[0]  # the key up to its first glob character: what to list
    with client_errors(location, access, doing="read parquet from", bucket_request=True):
        listing = access.client().list_objects_v2(Bucket=location.bucket, Prefix=prefix, MaxKeys=1)
    if not listing.get("KeyCount"):
        raise S3AccessError(f"Could not read parquet from {location.url}: no object in bucket {location.bucket!r} at "
                            f"{access.describe()} starts with {prefix!r}. Check the key or pattern, or write the data "
                            "first.", url=location.url, reason="not-found")


def delete_keys(client: Any, location: S3Location, keys: list[str]) -> None:
    """Delete ``keys`` from the bucket of ``location``, 1000 per request (the ``DeleteObjects`` limit)."""
    for start in range(0, len(keys), 1000):
        batch = [{"Key": key} for key in keys[start : start + 1000]]
        client.delete_objects(Bucket=location.bucket, Delete={"Objects": batch, "Quiet": True})
