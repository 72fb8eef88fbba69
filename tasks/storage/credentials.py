"""
S3 access resolved from a Prefect credentials block, in the forms each reader needs.

Credentials come from prefect-aws' ``AwsCredentials`` block (saved, loaded and
edited in the Prefect UI; install with ``pip install -e '.[s3]'`` in the checkout).
:func:`resolve_s3_access` turns one into an :class:`S3Access`, which hands the
same credentials to the three readers and writers this package drives:

* polars' own reader (the ``cpu`` backend): ``storage_options``
  (:meth:`S3Access.storage_options`; polars' object-store keys);
* cudf-polars on the GPU backends: ``AWS_*`` environment variables
  (:meth:`S3Access.environment`). cudf-polars reads ``s3://`` through libcudf
  and KvikIO, which take the keys, region and endpoint from the environment
  (KvikIO's ``S3Endpoint``: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``, and ``AWS_SESSION_TOKEN`` for
  temporary ``ASIA...`` keys), not from the scan's ``storage_options``;
* boto3 (checks before a query, uploads of the parquet sink):
  :meth:`S3Access.client`.

Secrets stay wrapped in :class:`pydantic.SecretStr` here; ``repr`` and ``str``
of an :class:`S3Access` never show them, and :meth:`S3Access.secrets` lists
them so error messages can be scrubbed (:func:`scrub`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from prefect_cudf_polars.blocks.errors import INSTALL

if TYPE_CHECKING:
    from prefect_aws import AwsCredentials

#: Region used when neither the block nor the AWS configuration names one. S3-compatible
#: servers (MinIO, moto) accept any region; KvikIO requires one to sign requests.
DEFAULT_REGION = "us-east-1"


@dataclasses.dataclass(frozen=True, repr=False)
class S3Access:
    """
    Keys, region and endpoint for S3, as plain configuration.

    Build it with :func:`resolve_s3_access` from an ``AwsCredentials`` block.

    Attributes
    ----------
    access_key_id, secret_access_key : pydantic.SecretStr or None
        The key pair; ``None`` for anonymous access (public buckets).
    session_token : pydantic.SecretStr or None
        For temporary (STS) credentials.
    region : str
        AWS region (``"us-east-1"`` when none is configured).
    endpoint_url : str or None
        An S3-compatible endpoint (MinIO, moto: ``"http://127.0.0.1:9000"``),
        without a trailing slash; ``None`` for AWS itself.
    verify : bool
        Verify TLS certificates (boto3 ``verify``).
    """

    access_key_id: SecretStr | None
    secret_access_key: SecretStr | None
    session_token: SecretStr | None
    region: str
    endpoint_url: str | None
    verify: bool = True

    @property
    def anonymous(self) -> bool:
        """Whether no key pair is configured."""
        return self.access_key_id is None or self.secret_access_key is None

    def storage_options(self, *, keys: bool = True) -> dict[str, str]:
        """
        polars ``storage_options`` for ``scan_parquet``/``sink_parquet`` (polars' own reader).

        Parameters
        ----------
        keys
            With the credentials (polars reads); ``False``: only the region and
            endpoint, never a key (a scan cudf-polars runs, which keeps its
            options in its query plan and takes the keys from :meth:`environment`).

        Returns
        -------
        dict of str to str
            polars' object-store keys: ``aws_region`` and ``aws_endpoint_url``
            (polars allows an ``http://`` endpoint as given); with ``keys``,
            ``aws_access_key_id``, ``aws_secret_access_key`` and
            ``aws_session_token``, or ``aws_skip_signature`` when anonymous.
        """
        options = {"aws_region": self.region, "aws_endpoint_url": self.endpoint_url or None}
        if keys:
            options.update(aws_skip_signature="true" if self.anonymous else None, **self._keys())
        return {name: value for name, value in options.items() if value is not None}

    def environment(self) -> dict[str, str | None]:
        """
        ``AWS_*`` environment variables for KvikIO (cudf-polars' cloud reader).

        Returns
        -------
        dict of str to (str or None)
            Every variable KvikIO's ``S3Endpoint`` reads; ``None`` means "unset it
            for the call" (so a stale ``AWS_ENDPOINT_URL`` or session token of the
            process is not picked up).
        """
        return {"AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region, "AWS_ENDPOINT_URL": self.endpoint_url,
                **{name.upper(): value for name, value in self._keys().items()}}

    def client(self) -> Any:
        """
        A boto3 S3 client with these credentials and endpoint.

        Returns
        -------
        botocore.client.S3
        """
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", region_name=self.region, endpoint_url=self.endpoint_url, verify=self.verify,
            config=Config(signature_version=UNSIGNED) if self.anonymous else None, **self._keys())

    def _keys(self) -> dict[str, str | None]:
        """Key id, secret key and session token as plain text (``None`` each when anonymous), by boto3's names."""
        return {f"aws_{field}": None if self.anonymous else _reveal(getattr(self, field))
                for field in ("access_key_id", "secret_access_key", "session_token")}

    def secrets(self) -> list[str]:
        """The secret strings (key id, secret key, session token) to keep out of messages."""
        return [s for s in map(_reveal, (self.access_key_id, self.secret_access_key, self.session_token)) if s]

    def describe(self) -> str:
        """Where requests go, for messages: the endpoint (or AWS) and region; no secrets."""
        return f"{self.endpoint_url or 'AWS S3'} (region {self.region})"

    def __repr__(self) -> str:
        keys = "anonymous" if self.anonymous else "key pair set"
        return f"S3Access({keys}, endpoint={self.endpoint_url!r}, region={self.region!r})"

    def __reduce__(self) -> Any:
        raise TypeError("S3Access holds secrets and is not pickled: pass the AwsCredentials block (or its saved name) "
                        "and resolve it where it is used.")


def _reveal(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def resolve_s3_access(credentials: AwsCredentials | None) -> S3Access:
    """
    Resolve an ``AwsCredentials`` block into keys, region and endpoint.

    Parameters
    ----------
    credentials : prefect_aws.AwsCredentials or None
        The block. Explicit keys are used as they are; a block with a
        ``profile_name``, an ``assume_role_arn`` or no keys at all goes through
        boto3's credential chain (``get_boto3_session()``), so profiles, roles
        and instance credentials work too. The endpoint is
        ``aws_client_parameters.endpoint_url``. ``None`` means anonymous access
        to AWS S3 (public buckets).

    Returns
    -------
    S3Access

    Raises
    ------
    TypeError
        If ``credentials`` is not an ``AwsCredentials`` block.
    ValueError
        If the endpoint URL does not start with ``http://`` or ``https://``.
    """
    if credentials is None:
        return S3Access(None, None, None, DEFAULT_REGION, None)
    try:
        from prefect_aws import AwsCredentials
    except ImportError as exc:  # pragma: no cover - the s3 extra is missing
        raise ImportError(f"Reading and writing S3 needs prefect-aws: {INSTALL.format(extra='s3')}.") from exc
    if not isinstance(credentials, AwsCredentials):
        raise TypeError(f"credentials must be a prefect_aws.AwsCredentials block, not {type(credentials).__name__}; "
                        "load one with AwsCredentials.load('name').")
    params = credentials.aws_client_parameters
    endpoint = params.endpoint_url.rstrip("/") if params.endpoint_url else None
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"The AwsCredentials block's endpoint_url {endpoint!r} is not an http:// or https:// URL; set "
                         "aws_client_parameters.endpoint_url to the S3-compatible server's URL, for example "
                         "'http://127.0.0.1:9000'.")
    explicit = credentials.aws_access_key_id and credentials.aws_secret_access_key
    # assume_role_arn arrived in prefect-aws 0.7 (the floor in pyproject); read it defensively.
    if explicit and not getattr(credentials, "assume_role_arn", None):
        keys = (credentials.aws_access_key_id, _reveal(credentials.aws_secret_access_key),
                credentials.aws_session_token)
        region = credentials.region_name
    else:
        session = credentials.get_boto3_session()
        found = session.get_credentials()
        frozen = found.get_frozen_credentials() if found is not None else None
        keys = (frozen.access_key, frozen.secret_key, frozen.token) if frozen else (None, None, None)
        region = credentials.region_name or session.region_name
    return S3Access(*(SecretStr(key) if key else None for key in keys), region=region or DEFAULT_REGION,
                    endpoint_url=endpoint, verify=params.verify is not False)


def scrub(text: str, access: S3Access | None) -> str:
    """
    Replace every secret of ``access`` in ``text`` with ``"***"``.

    Parameters
    ----------
    text
        A message that may quote a request (an engine or object-store error).
    access
        The credentials whose secrets must not appear.

    Returns
    -------
    str
    """
    for secret in access.secrets() if access is not None else ():
        text = text.replace(secret, "***")
    return text
