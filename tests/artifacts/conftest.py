"""Fixtures of the artifact tests: object stores for real, local and S3 (moto's server).

The S3 store talks HTTP to moto's threaded server on 127.0.0.1, started once per
session; each test gets its own bucket. There is no skip: the S3 half of every
suite runs wherever the tests run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from moto.server import ThreadedMotoServer

from shamal.artifacts import BlobStore, Keyring, LocalObjectStore, ObjectStore, S3ObjectStore

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

MIB = 1024 * 1024
S3_PART_SIZE = 5 * MIB  # S3's (and moto's) smallest part, to exercise multipart uploads cheaply
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "shamal-test",
    "AWS_SECRET_ACCESS_KEY": "shamal-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a moto S3 server on loopback, with dummy credentials in the environment."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in DUMMY_CREDENTIALS.items():
            mp.setenv(name, value)
        # No profile or config file of the machine may leak in.
        empty = tmp_path_factory.mktemp("aws") / "none"
        mp.setenv("AWS_CONFIG_FILE", str(empty))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> S3Client:
    client: S3Client = boto3.session.Session().client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"],
        aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        config=BotoConfig(s3={"addressing_style": "path"}),
    )
    return client


@pytest.fixture
def s3_bucket(s3_client: S3Client) -> str:
    """A fresh, empty bucket for one test."""
    name = f"shamal-{uuid.uuid4().hex[:20]}"
    s3_client.create_bucket(Bucket=name)
    return name


def make_s3_store(client: S3Client, bucket: str, **kwargs: Any) -> S3ObjectStore:
    return S3ObjectStore(bucket, "tenant-a/artifacts", client, part_size=S3_PART_SIZE, **kwargs)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def object_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """Each test using this runs once on the local store and once on S3."""
    if request.param == "local":
        return LocalObjectStore(tmp_path / "store")
    client: S3Client = request.getfixturevalue("s3_client")
    bucket: str = request.getfixturevalue("s3_bucket")
    return make_s3_store(client, bucket)


@pytest.fixture(params=["plain", "encrypted"])
def keyring(request: pytest.FixtureRequest) -> Keyring | None:
    return Keyring.generate() if request.param == "encrypted" else None


@pytest.fixture
def blob_store(object_store: ObjectStore, keyring: Keyring | None) -> BlobStore:
    """Runs over {local, s3} x {plain, encrypted}."""
    return BlobStore(object_store, keyring)
