"""
A real S3 server for the storage tests: moto's server (``python -m moto.server``) on
127.0.0.1, in a process of its own.

Its own process, not ``ThreadedMotoServer`` in the test process: a GPU read of
``s3://`` through KvikIO (cudf-polars 26.10) holds the GIL while it waits for
the server's answer, so an in-process server thread could never answer: the test
would hang, and pytest-timeout's thread method, which needs the GIL too, could
not end it.

Test modules import the fixtures (``from s3_fixtures import moto_s3, bucket, ...``):
a ``conftest.py`` here would shadow ``tests/conftest.py``'s ``from conftest import``.
Each module gets its own server (module scope).

The server enforces credentials (moto's IAM authentication): after it starts,
an IAM user with full S3 access and one that may only list and read are made
with moto's first unauthenticated calls, and from then on every request must
be signed with a key moto issued. Wrong keys get the answers AWS gives
(``InvalidAccessKeyId``, ``SignatureDoesNotMatch``, ``AccessDenied``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
import time
import uuid

import polars as pl
import pytest
import requests
from processes import free_port, stop

# May list and read, not write. AWS authorizes ListObjectsV2 (the sink's and the
# reader's checks) with the IAM action s3:ListBucket; moto 5.2.6's IAM check names
# the action after the API operation (s3:ListObjectsV2, s3:HeadBucket), so a policy
# of s3:ListBucket alone is refused there. s3:List* grants the listing under both.
READ_ONLY_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": ["s3:List*", "s3:GetObject"], "Resource": "*"}
    ],
}
FULL_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


@dataclasses.dataclass(frozen=True)
class MotoS3:
    """A running moto server and the keys it issued."""

    endpoint: str
    access_key_id: str
    secret_access_key: str
    reader_key_id: str
    reader_secret: str

    def set_auth(self, enforced: bool) -> None:
        """Switch moto's credential checks on or off (moto's ``reset-auth`` endpoint)."""
        body = b"0" if enforced else b"inf"
        requests.post(f"{self.endpoint}/moto-api/reset-auth", data=body, timeout=10).raise_for_status()

    def client(self, key_id: str | None = None, secret: str | None = None):
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=key_id or self.access_key_id,
            aws_secret_access_key=secret or self.secret_access_key,
            region_name="us-east-1",
        )

    def credentials(self, *, key_id: str | None = None, secret: str | None = None):
        """An AwsCredentials block for this server (prefect-aws)."""
        from prefect_aws import AwsClientParameters, AwsCredentials

        return AwsCredentials(
            aws_access_key_id=key_id or self.access_key_id,
            aws_secret_access_key=secret or self.secret_access_key,
            region_name="us-east-1",
            aws_client_parameters=AwsClientParameters(endpoint_url=self.endpoint),
        )


def _user(iam, name: str, policy: dict) -> tuple[str, str]:
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def _start_server() -> tuple[subprocess.Popen, str]:
    """Start ``python -m moto.server`` on a free port; return it once it answers (30 s at most)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            requests.get(f"{endpoint}/moto-api/data.json", timeout=2)
            return proc, endpoint
        except requests.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"moto server did not answer on {endpoint} within 30 s")


@pytest.fixture(scope="module")
def moto_s3():
    """moto's S3 server on 127.0.0.1 (a free port, its own process), enforcing credentials."""
    import boto3

    proc, endpoint = _start_server()
    try:
        # Six unauthenticated IAM calls make the two users; every later request is checked.
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"6", timeout=10).raise_for_status()
        iam = boto3.session.Session().client(
            "iam",
            endpoint_url=endpoint,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
            region_name="us-east-1",
        )
        suffix = uuid.uuid4().hex[:8]
        key_id, secret = _user(iam, f"etl-{suffix}", FULL_POLICY)
        reader_id, reader_secret = _user(iam, f"reader-{suffix}", READ_ONLY_POLICY)
        yield MotoS3(endpoint, key_id, secret, reader_id, reader_secret)
    finally:
        stop([proc], timeout=10)


@pytest.fixture()
def bucket(moto_s3: MotoS3) -> str:
    """A new, empty bucket on the moto server."""
    name = f"bkt-{uuid.uuid4().hex[:12]}"
    moto_s3.client().create_bucket(Bucket=name)
    return name


def trips(n: int = 3000, seed: int = 0) -> pl.DataFrame:
    """A small real table of trips (ints, floats, strings, dates)."""
    import datetime as dt
    import random

    rng = random.Random(seed)
    return pl.DataFrame(
        {
            "id": list(range(n)),
            "carrier": [rng.choice(["AA", "B6", "DL", "UA"]) for _ in range(n)],
            "distance": [rng.uniform(-10, 2500) for _ in range(n)],
            "day": [dt.date(2013, 1, 1) + dt.timedelta(days=i % 365) for i in range(n)],
        }
    )


def put_parquet(client, bucket: str, key: str, df: pl.DataFrame) -> None:
    """Upload ``df`` as a parquet object."""
    buffer = io.BytesIO()
    df.write_parquet(buffer)
    client.put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())


@pytest.fixture()
def trips_df() -> pl.DataFrame:
    """3,000 trips (see :func:`trips`)."""
    return trips()


@pytest.fixture()
def upload(moto_s3: MotoS3):
    """``upload(bucket, key, df)``: put ``df`` as a parquet object with the full-access key."""
    client = moto_s3.client()

    def put(bucket: str, key: str, df: pl.DataFrame) -> None:
        put_parquet(client, bucket, key, df)

    return put
