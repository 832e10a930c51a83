"""Object store in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, moto ...)."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Generator, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any, cast

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from shamal.artifacts._objects import (
    DEFAULT_READ_CHUNK,
    check_key,
    check_prefix,
    check_read_args,
    primed,
)
from shamal.config import S3ArtifactSettings
from shamal.errors import InvalidParameter, NotFound, PayloadTooLarge, ServiceUnavailable

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, CopySourceTypeDef

    from shamal.config import Settings

__all__ = ["S3ObjectStore"]

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_MIN_PART_SIZE = 5 * _MIB  # S3's floor for every part but the last
_MAX_PARTS = 10_000
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def _error_code(exc: BaseException | None) -> str | None:
    if isinstance(exc, ClientError):
        return exc.response.get("Error", {}).get("Code")
    return None


@contextlib.contextmanager
def _backend_errors(action: str) -> Iterator[None]:
    """Map botocore failures to Shamal errors; the detail goes to the log only."""
    try:
        yield
    except ClientError as exc:
        if _error_code(exc) in _NOT_FOUND_CODES:
            raise NotFound("Object not found") from None
        logger.error("S3 %s failed: %s", action, exc)
        raise ServiceUnavailable("The artifact object store request failed") from exc
    except BotoCoreError as exc:
        logger.error("S3 %s failed: %s", action, exc)
        raise ServiceUnavailable("The artifact object store request failed") from exc


class _ViewReader(io.RawIOBase):
    """A seekable, read-only file over a memoryview, without copying it.

    botocore reads request bodies in blocks (signing, checksums, sending) and
    seeks back for retries; ``io.BytesIO`` would copy the whole part first.
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        # RawIOBase.read would fill a temporary bytearray and then copy it.
        end = len(self._view)
        if size is not None and size >= 0:
            end = min(end, self._pos + size)
        data = bytes(self._view[self._pos : end])
        self._pos = max(self._pos, end)
        return data

    def readinto(self, buffer: WriteableBuffer) -> int:
        target = memoryview(buffer).cast("B")
        n = max(0, min(len(target), len(self._view) - self._pos))
        target[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        origin = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, origin + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


class _PartBuffer:
    """One reusable part-sized buffer that chunks of any size are poured into."""

    def __init__(self, capacity: int) -> None:
        self._buf = bytearray(capacity)
        self.used = 0

    @property
    def full(self) -> bool:
        return self.used == len(self._buf)

    def fill(self, view: memoryview) -> memoryview:
        """Copy as much of ``view`` as fits; return the rest."""
        n = min(len(view), len(self._buf) - self.used)
        self._buf[self.used : self.used + n] = view[:n]
        self.used += n
        return view[n:]

    def body(self) -> IO[bytes]:
        return cast(IO[bytes], _ViewReader(memoryview(self._buf)[: self.used]))


class _MultipartUpload:
    """An S3 multipart upload in progress: parts go up one at a time."""

    def __init__(self, client: S3Client, bucket: str, key: str) -> None:
        self._client = client
        self._bucket = bucket
        self._key = key
        with _backend_errors("create_multipart_upload"):
            response = client.create_multipart_upload(Bucket=bucket, Key=key)
        self._upload_id = response["UploadId"]
        self._parts: list[CompletedPartTypeDef] = []

    def send(self, part: _PartBuffer) -> None:
        number = len(self._parts) + 1
        if number > _MAX_PARTS:
            raise PayloadTooLarge("The object is larger than the store's multipart limit")
        with _backend_errors("upload_part"):
            response = self._client.upload_part(
                Bucket=self._bucket,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                ContentLength=part.used,
                Body=part.body(),
            )
        self._parts.append({"ETag": response["ETag"], "PartNumber": number})
        part.used = 0

    def complete(self) -> None:
        with _backend_errors("complete_multipart_upload"):
            self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=self._key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )

    def abort(self) -> None:
        try:
            self._client.abort_multipart_upload(
                Bucket=self._bucket, Key=self._key, UploadId=self._upload_id
            )
        except (ClientError, BotoCoreError) as exc:  # the original error matters more
            logger.warning("could not abort S3 multipart upload %s: %s", self._upload_id, exc)


class S3ObjectStore:
    """:class:`~shamal.artifacts.ObjectStore` over an S3-compatible bucket.

    Objects are stored under ``prefix/`` in ``bucket``. Writes stream: objects
    up to one part go up with a single ``PutObject``; larger ones as a multipart
    upload of ``part_size`` parts through one reused buffer (aborted on any
    error, so no invisible parts are left to pay for). Reads stream the
    response body. ``rename`` is a server-side copy (a managed multipart copy
    above ``copy_threshold``) followed by a delete. The boto3 client is
    thread-safe, and so is this store.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str,
        client: S3Client,
        *,
        part_size: int = 8 * _MIB,
        copy_threshold: int = 512 * _MIB,
    ) -> None:
        """Wrap ``client`` for ``bucket``; ``prefix`` ("" or a safe relative path) scopes keys.

        Raises:
            InvalidParameter: a bad bucket, prefix or a part size below 5 MiB.
        """
        if not bucket or "/" in bucket:
            raise InvalidParameter("Invalid S3 bucket name")
        if part_size < _MIN_PART_SIZE:
            raise InvalidParameter("The S3 part size must be at least 5 MiB")
        stripped = prefix.strip("/")
        self._prefix = check_key(stripped) + "/" if stripped else ""
        self._bucket = bucket
        self._client = client
        self._part_size = part_size
        self._copy_threshold = copy_threshold

    @classmethod
    def from_artifact_settings(cls, config: S3ArtifactSettings) -> S3ObjectStore:
        """Build a store and its boto3 client from the ``artifacts`` settings.

        Credentials left out of the settings are found the standard AWS way.
        """
        custom_endpoint = config.endpoint_url is not None
        boto_config = BotoConfig(
            retries={"mode": "standard", "max_attempts": 5},
            # S3-compatible servers usually want path-style URLs and may not
            # know the newer default request checksums.
            s3={"addressing_style": "path"} if custom_endpoint else None,
            request_checksum_calculation="when_required" if custom_endpoint else None,
            response_checksum_validation="when_required" if custom_endpoint else None,
        )
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region,
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_access_key,
            config=boto_config,
        )
        return cls(config.bucket, config.prefix, client)

    @classmethod
    def from_settings(cls, settings: Settings) -> S3ObjectStore:
        """The store ``settings.artifacts`` describes.

        Raises:
            InvalidParameter: the settings are not S3 artifact settings.
        """
        if not isinstance(settings.artifacts, S3ArtifactSettings):
            raise InvalidParameter("The artifact settings are not of type 's3'")
        return cls.from_artifact_settings(settings.artifacts)

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self._bucket!r}, prefix={self._prefix!r})"

    def _full(self, key: str) -> str:
        return self._prefix + check_key(key)

    def _head_size(self, full: str) -> int:
        with _backend_errors("head_object"):
            return self._client.head_object(Bucket=self._bucket, Key=full)["ContentLength"]

    # ------------------------------------------------------------------ protocol
    def write(self, key: str, chunks: Iterable[bytes]) -> int:
        """See :meth:`ObjectStore.write`."""
        full = self._full(key)
        part = _PartBuffer(self._part_size)
        upload: _MultipartUpload | None = None
        total = 0
        try:
            for chunk in chunks:
                total += len(chunk)
                rest = memoryview(chunk).cast("B")
                while rest:
                    rest = part.fill(rest)
                    if part.full:
                        upload = upload or _MultipartUpload(self._client, self._bucket, full)
                        upload.send(part)
            if upload is None:
                with _backend_errors("put_object"):
                    self._client.put_object(
                        Bucket=self._bucket, Key=full, ContentLength=part.used, Body=part.body()
                    )
            else:
                if part.used:
                    upload.send(part)
                upload.complete()
        except BaseException:
            if upload is not None:
                upload.abort()
            raise
        return total

    def read(
        self, key: str, chunk_size: int = DEFAULT_READ_CHUNK, *, limit: int | None = None
    ) -> Iterator[bytes]:
        """See :meth:`ObjectStore.read`."""
        check_read_args(chunk_size, limit)
        full = self._full(key)
        with _backend_errors("get_object"):
            try:
                if limit is None:
                    response = self._client.get_object(Bucket=self._bucket, Key=full)
                else:
                    response = self._client.get_object(
                        Bucket=self._bucket, Key=full, Range=f"bytes=0-{limit - 1}"
                    )
            except ClientError as exc:
                # A range of an empty object is "unsatisfiable"; the answer is simply b"".
                if limit is not None and _error_code(exc) == "InvalidRange":
                    return iter(())
                raise
        return primed(self._stream(response["Body"], chunk_size))

    @staticmethod
    def _stream(body: Any, chunk_size: int) -> Generator[bytes, None, None]:
        try:
            yield b""
            with _backend_errors("get_object (body)"):
                yield from body.iter_chunks(chunk_size)
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        """See :meth:`ObjectStore.exists`."""
        try:
            self._head_size(self._full(key))
        except NotFound:
            return False
        return True

    def size(self, key: str) -> int:
        """See :meth:`ObjectStore.size`."""
        return self._head_size(self._full(key))

    def delete(self, key: str) -> bool:
        """See :meth:`ObjectStore.delete`."""
        full = self._full(key)
        existed = self.exists(key)
        if existed:
            with _backend_errors("delete_object"):
                self._client.delete_object(Bucket=self._bucket, Key=full)
        return existed

    def rename(self, src: str, dst: str) -> None:
        """See :meth:`ObjectStore.rename`."""
        src_full, dst_full = self._full(src), self._full(dst)
        size = self._head_size(src_full)
        source: CopySourceTypeDef = {"Bucket": self._bucket, "Key": src_full}
        with _backend_errors("copy"):
            if size <= self._copy_threshold:
                self._client.copy_object(Bucket=self._bucket, Key=dst_full, CopySource=source)
            else:
                config = TransferConfig(
                    multipart_threshold=self._copy_threshold,
                    multipart_chunksize=self._part_size,
                    use_threads=False,
                )
                self._client.copy(source, self._bucket, dst_full, Config=config)
        with _backend_errors("delete_object"):
            self._client.delete_object(Bucket=self._bucket, Key=src_full)

    def list(self, prefix: str = "") -> Iterator[str]:
        """See :meth:`ObjectStore.list`. Keys come in S3's (lexicographic) order."""
        check_prefix(prefix)
        return self._list(self._prefix + prefix)

    def _list(self, full_prefix: str) -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        with _backend_errors("list_objects_v2"):
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full_prefix):
                for item in page.get("Contents", []):
                    yield item["Key"][len(self._prefix) :]
