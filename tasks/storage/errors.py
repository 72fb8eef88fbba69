"""
``S3AccessError``: object storage refused or could not find what a task asked for.

Every message says what happened (the URL, the endpoint, the server's answer),
why it probably happened and what to do; secrets of the credentials in use are
scrubbed from it (:func:`~prefect_cudf_polars.tasks.storage.credentials.scrub`), so
it can be logged, shown in the UI and pickled into result storage.
"""

from __future__ import annotations

import re
from functools import partial

from prefect_cudf_polars.blocks.backends.engine_errors import iter_exceptions
from prefect_cudf_polars.tasks.storage.credentials import S3Access, scrub

__all__ = ["S3AccessError", "explain_engine_error"]

#: Server answers (S3 error codes and HTTP statuses) and what they mean for the user.
_CREDENTIALS = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "403"})
_DENIED = frozenset({"AccessDenied", "AllAccessDisabled"})
_NO_KEY = frozenset({"NoSuchKey", "404"})

#: Each reason's message, after "Could not {doing} {url}"; the other ``str.format`` fields are the
#: bucket, where (endpoint and region), code, answer (the code or HTTP status) and detail.
_MESSAGES = {
    "no-bucket": ": bucket {bucket!r} does not exist at {where}. Check the bucket name in the URL and the "
    "endpoint_url of the AwsCredentials block, or create the bucket.",
    "credentials": ": {where} refused the credentials ({answer}). Check the access key id and secret access "
    "key (and session token, if any) of the AwsCredentials block, and that the endpoint_url and "
    "region_name point at the server that issued them.",
    "denied": ": {where} denied access ({code}). The credentials are valid but lack permission on bucket "
    "{bucket!r}; grant them s3:GetObject / s3:ListBucket (reading) or s3:PutObject (writing).",
    "not-found": ": no object matches it in bucket {bucket!r} at {where}. Check the key or pattern (list the "
    "prefix with the AWS CLI or S3Bucket.list_objects).",
    "failed": " at {where}: {detail}. Check that the endpoint is reachable from this machine and retry.",
}


class S3AccessError(RuntimeError):
    """
    An S3 request failed: missing bucket or object, refused credentials, no permission.

    Parameters
    ----------
    message
        What happened and what to do next (no secrets).
    url
        The ``s3://`` URL concerned.
    reason
        ``"credentials"`` (the server refused the keys), ``"denied"`` (the keys
        lack permission), ``"no-bucket"``, ``"not-found"`` (no object matches),
        ``"exists"`` (a sink target is not empty) or ``"failed"`` (anything else).
    """

    def __init__(self, message: str, *, url: str, reason: str) -> None:
        super().__init__(message)
        self.url = url
        self.reason = reason

    def __reduce__(self):  # keep url and reason through pickling
        return partial(type(self), url=self.url, reason=self.reason), (str(self),)


_QUOTED_CODE = re.compile(r"An error occurred \((\w+)\)")


def answer_of(exc: BaseException) -> tuple[str, str]:
    """
    The S3 error code and HTTP status of a boto3/botocore error (or one wrapping it), either may be empty.

    Parameters
    ----------
    exc
        A ``botocore.exceptions.ClientError`` (server answer) or a connection error.
    """
    for seen in iter_exceptions(exc):  # it, and what caused it
        if response := getattr(seen, "response", None):
            return (str(response.get("Error", {}).get("Code", "")),
                    str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")))
    # boto3's S3UploadFailedError quotes the answer in its message only.
    match = _QUOTED_CODE.search(str(exc))
    code = match.group(1) if match else ""
    return (code, code) if code.isdigit() else (code, "")


def explain(*, url: str, bucket: str, code: str, status: str, access: S3Access, doing: str, detail: str,
            bucket_request: bool = False) -> S3AccessError:
    """
    Build the error for a server answer.

    Parameters
    ----------
    url
        The ``s3://`` URL concerned.
    bucket
        Its bucket.
    code, status
        The S3 error code (``"NoSuchBucket"``) and HTTP status (``"404"``), either may be empty.
    access
        The credentials used (only the endpoint and region are quoted).
    doing
        What was being done, e.g. ``"read parquet from"``.
    detail
        The original message (scrubbed here).
    bucket_request
        The answer was to a request on the bucket itself (a listing), whose
        "404" means the bucket does not exist.
    """
    reason = ("no-bucket" if code == "NoSuchBucket" or (bucket_request and status == "404") else
              "denied" if code in _DENIED else
              "credentials" if code in _CREDENTIALS or status == "403" else
              "not-found" if code in _NO_KEY or status == "404" else "failed")
    return S3AccessError(("Could not {doing} {url}" + _MESSAGES[reason]).format(
        doing=doing, url=url, bucket=bucket, where=access.describe(), code=code, answer=code or "HTTP " + status,
        detail=scrub(detail, access) or code or status), url=url, reason=reason)


def explain_engine_error(exc: BaseException, *, url: str, bucket: str, access: S3Access,
                         doing: str) -> S3AccessError | None:
    """
    Translate an engine error that quotes an S3 answer (polars' object store, KvikIO).

    Returns
    -------
    S3AccessError or None
        ``None`` when ``exc`` does not look like an S3 failure (re-raise it as is).
    """
    # cudf-polars wraps rank errors in ExceptionGroups, whose str() omits the inner ones.
    text = " | ".join(f"{type(e).__name__}: {e}" for e in iter_exceptions(exc))
    lowered = text.lower()
    if not any(m in lowered for m in ("s3", "object-store", "object store", "http", "curl", "403", "404")):
        return None
    codes = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "NoSuchBucket", "NoSuchKey")
    code = next((candidate for candidate in codes if candidate in text), "")
    status = ("403" if "403" in text or "forbidden" in lowered or "lacked the necessary privileges" in lowered else
              "404" if "404" in text or "not found" in lowered else "")
    if not (code or status):
        return None
    return explain(url=url, bucket=bucket, code=code, status=status, access=access, doing=doing, detail=text)
