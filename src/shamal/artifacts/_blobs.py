"""Content-addressed blobs over an object store, optionally encrypted at rest.

Layout in the object store::

    blobs/ab/cd/<sha256 hex>        the blob (plaintext, or the encrypted stored form)
    blobs/ab/cd/<sha256 hex>.key    the key sidecar of an encrypted blob (JSON)
    tmp/<uuid>                      uploads in progress

The address is the sha256 of the *plaintext*, so encrypted and plain stores
deduplicate the same way. See :mod:`shamal.artifacts._crypto` for the format.

Publishing an encrypted blob touches two objects, and object stores offer no
transaction over two keys. The sidecar goes first, so a blob is never visible
without its key; a per-digest lock serializes publishers in one process; a
publisher then confirms that the blob in place and the sidecar belong together
(the blob's header carries the nonce prefix the sidecar names) and puts its own
sidecar back if a concurrent publisher in another process replaced it. A pair
that is still inconsistent is never read as data (it fails authentication) and
is replaced by the next upload of the same content.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
import uuid
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shamal.artifacts._crypto import (
    HEADER_SIZE,
    KeyEnvelope,
    decrypt_chunks,
    encrypt_chunks,
    header_nonce_prefix,
    new_data_key,
    new_nonce_prefix,
    plaintext_size,
    unwrap_data_key,
    wrap_data_key,
)
from shamal.artifacts._keyring import Keyring
from shamal.artifacts._objects import (
    ObjectStore,
    open_object_store,
    open_store_objects,
    primed,
)
from shamal.errors import Conflict, IntegrityCheckFailed, InvalidParameter, NotFound, ShamalError

if TYPE_CHECKING:
    from pathlib import Path

    from shamal.config import Settings

__all__ = ["BlobInfo", "BlobStore", "blob_key", "open_blob_store", "open_data_stores"]

logger = logging.getLogger(__name__)

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_SIDECAR_SUFFIX = ".key"
_MAX_SIDECAR_BYTES = 64 * 1024
_CONFIRM_ATTEMPTS = 3
_LOCK_STRIPES = 64


@dataclass(frozen=True)
class BlobInfo:
    """A stored blob: the hex sha256 of its plaintext and its plaintext size in bytes."""

    digest: str
    size: int


def _check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise InvalidParameter("Invalid blob digest: expected 64 lowercase hex characters")
    return digest


def blob_key(digest: str) -> str:
    """The object key of the blob ``digest``.

    Raises:
        InvalidParameter: ``digest`` is not 64 lowercase hex characters.
    """
    _check_digest(digest)
    return f"blobs/{digest[:2]}/{digest[2:4]}/{digest}"


def _close(stream: Iterator[bytes]) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        close()


class _Tap:
    """Passes chunks through, hashing and counting them."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self._hash = hashlib.sha256()
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self._hash.update(chunk)
            self.size += len(chunk)
            yield chunk

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class BlobStore:
    """Content-addressed, verified, optionally encrypted blobs. Thread-safe.

    Blobs are immutable: the same content always has the same address, and a
    second :meth:`put` of it stores nothing new. Every read is verified against
    the address (and, for encrypted blobs, every chunk against its GCM tag).

    With a ``keyring``, new blobs are encrypted (AES-256-GCM, a data key per
    blob wrapped by the keyring's active master key). Blobs stored in plain
    form before encryption was turned on stay readable; blobs stored encrypted
    cannot be read without the keyring.
    """

    def __init__(
        self,
        objects: ObjectStore,
        keyring: Keyring | None = None,
        *,
        encrypt: bool | None = None,
        keyring_file: Path | None = None,
    ) -> None:
        """Store blobs in ``objects``.

        Args:
            objects: the object store underneath.
            keyring: master keys; new blobs are encrypted with its active key.
            encrypt: whether new blobs are encrypted (default: when a keyring is
                given). ``False`` with a keyring still reads encrypted blobs.
            keyring_file: where the keyring lives; re-read once when a blob's
                key was wrapped by a master key this store does not hold yet
                (a rotation done by another process while this one runs).
        """
        self._objects = objects
        self._keyring = keyring
        self._encrypt = keyring is not None if encrypt is None else encrypt
        if self._encrypt and keyring is None:
            raise ValueError("encryption needs a keyring")
        self._keyring_file = keyring_file
        self._locks = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))

    @property
    def objects(self) -> ObjectStore:
        """The underlying object store."""
        return self._objects

    @property
    def keyring(self) -> Keyring | None:
        """The keyring new blobs are encrypted with, if any."""
        return self._keyring

    def _lock(self, digest: str) -> threading.Lock:
        return self._locks[int(digest[:4], 16) % _LOCK_STRIPES]

    # ------------------------------------------------------------------ writing
    def put(self, chunks: Iterable[bytes], *, expected_digest: str | None = None) -> BlobInfo:
        """Store a stream of bytes and return its address.

        The stream is consumed once, hashed on the way and written to a
        temporary object, which then becomes the blob (or is dropped when the
        blob exists already).

        Args:
            chunks: the content, in chunks of any size.
            expected_digest: if given, the content must hash to it.

        Returns:
            The digest and plaintext size.

        Raises:
            InvalidParameter: ``expected_digest`` is malformed or does not match
                (nothing is stored then).
            Conflict: a concurrent upload of the same content in another
                process interfered; retrying succeeds.
        """
        if expected_digest is not None:
            _check_digest(expected_digest)
        tmp = f"tmp/{uuid.uuid4().hex}"
        tap = _Tap(chunks)
        keyring = self._keyring if self._encrypt else None
        try:
            if keyring is None:
                self._objects.write(tmp, tap)
                digest = tap.hexdigest()
                self._check_expected(digest, expected_digest)
                with self._lock(digest):
                    self._publish_plain(tmp, digest)
            else:
                data_key, nonce_prefix = new_data_key(), new_nonce_prefix()
                self._objects.write(tmp, encrypt_chunks(tap, data_key, nonce_prefix))
                digest = tap.hexdigest()
                self._check_expected(digest, expected_digest)
                with self._lock(digest):
                    self._publish_encrypted(tmp, digest, keyring, data_key, nonce_prefix)
        except BaseException:
            self._discard(tmp)
            raise
        return BlobInfo(digest, tap.size)

    @staticmethod
    def _check_expected(digest: str, expected: str | None) -> None:
        if expected is not None and not hmac.compare_digest(digest, expected):
            raise InvalidParameter("The content does not match the expected digest")

    def _discard(self, tmp: str) -> None:
        try:
            self._objects.delete(tmp)
        except (ShamalError, OSError) as exc:  # the original error matters more
            logger.warning("could not remove temporary blob object %s: %s", tmp, exc)

    def _publish_plain(self, tmp: str, digest: str) -> None:
        final = blob_key(digest)
        if self._objects.exists(final):
            self._objects.delete(tmp)
        else:
            self._objects.rename(tmp, final)

    def _publish_encrypted(
        self, tmp: str, digest: str, keyring: Keyring, data_key: bytes, nonce_prefix: bytes
    ) -> None:
        final = blob_key(digest)
        if self._pair_intact(final):
            self._objects.delete(tmp)
            return
        key_id, master_key = keyring.active_key()
        envelope = wrap_data_key(
            master_key, key_id, data_key, digest=digest, nonce_prefix=nonce_prefix
        )
        sidecar = envelope.to_json()
        # The sidecar first: a blob must never be visible without its key.
        self._objects.write(final + _SIDECAR_SUFFIX, [sidecar])
        self._objects.rename(tmp, final)
        self._confirm(final, nonce_prefix, sidecar)

    def _pair_intact(self, final: str) -> bool:
        """True when a readable blob is in place under ``final``."""
        if not self._objects.exists(final):
            return False
        try:
            envelope = self._read_sidecar(final)
            stored_prefix = header_nonce_prefix(self._read_head(final))
        except (IntegrityCheckFailed, NotFound):
            return False
        if envelope is None:  # a blob stored in plain form
            return stored_prefix is None
        return stored_prefix == envelope.nonce_prefix

    def _confirm(self, final: str, nonce_prefix: bytes, sidecar: bytes) -> None:
        """Check that the blob in place and its sidecar match; repair ours if needed."""
        for _ in range(_CONFIRM_ATTEMPTS):
            try:
                stored_prefix = header_nonce_prefix(self._read_head(final))
                envelope = self._read_sidecar(final)
            except (IntegrityCheckFailed, NotFound):
                break
            if envelope is not None and envelope.nonce_prefix == stored_prefix:
                return  # ours, or a concurrent writer's copy of the same content
            if stored_prefix != nonce_prefix:
                break  # another writer's object is in place; it owns the repair
            logger.warning("key sidecar of blob %s replaced concurrently; restoring it", final)
            self._objects.write(final + _SIDECAR_SUFFIX, [sidecar])
        raise Conflict("A concurrent upload of the same content interfered; retry the upload")

    # ------------------------------------------------------------------ reading
    def _read_head(self, key: str) -> bytes:
        stream = self._objects.read(key, chunk_size=HEADER_SIZE, limit=HEADER_SIZE)
        head = b""
        try:
            for chunk in stream:
                head += chunk
                if len(head) >= HEADER_SIZE:
                    break
        finally:
            _close(stream)
        return head

    def _read_sidecar(self, final: str) -> KeyEnvelope | None:
        try:
            stream = self._objects.read(final + _SIDECAR_SUFFIX)
        except NotFound:
            return None
        data = bytearray()
        try:
            for chunk in stream:
                data += chunk
                if len(data) > _MAX_SIDECAR_BYTES:
                    raise IntegrityCheckFailed("The key sidecar of a blob is too large")
        finally:
            _close(stream)
        return KeyEnvelope.from_json(bytes(data))

    def _reloaded_keyring(self, key_id: str) -> Keyring | None:
        """The keyring file again, when it holds ``key_id`` and ours does not."""
        if self._keyring_file is None or not self._keyring_file.exists():
            return None
        fresh = Keyring.load(self._keyring_file)
        if key_id not in fresh.key_ids:
            return None
        logger.info("reloaded the master keyring: it holds key %s", key_id)
        self._keyring = fresh
        return fresh

    def _data_key(self, envelope: KeyEnvelope, digest: str, keyring: Keyring | None) -> bytes:
        if keyring is None or envelope.key_id not in keyring.key_ids:
            keyring = self._reloaded_keyring(envelope.key_id) or keyring
        if keyring is None:
            raise IntegrityCheckFailed("The blob is encrypted and no master keyring is configured")
        try:
            master_key = keyring.key(envelope.key_id)
        except NotFound:
            raise IntegrityCheckFailed(
                "The blob's key was wrapped by a master key that is not in the keyring"
            ) from None
        return unwrap_data_key(master_key, envelope, digest=digest)

    def open(self, digest: str) -> Iterator[bytes]:
        """Stream a blob's content, verified as it goes.

        The blob is opened (and its key unwrapped) before this returns.
        Encrypted chunks are authenticated before they are released; the sha256
        of the whole content is compared with ``digest`` after the last chunk.
        Close the iterator to stop early.

        Raises:
            InvalidParameter: ``digest`` is not 64 lowercase hex characters.
            NotFound: no such blob.
            IntegrityCheckFailed: (here or while iterating) the blob or its
                sidecar was altered, truncated, swapped or is undecryptable.
        """
        final = blob_key(digest)
        try:
            stored = self._objects.read(final)
        except NotFound:
            raise NotFound("Blob not found") from None
        try:
            envelope = self._read_sidecar(final)
            if envelope is None:
                plain = stored
            else:
                data_key = self._data_key(envelope, digest, self._keyring)
                plain = decrypt_chunks(stored, data_key, envelope.nonce_prefix, envelope.chunk_size)
        except BaseException:
            _close(stored)
            raise
        return primed(self._verified(plain, stored, digest))

    @staticmethod
    def _verified(
        plain: Iterator[bytes], stored: Iterator[bytes], digest: str
    ) -> Generator[bytes, None, None]:
        hasher = hashlib.sha256()
        try:
            yield b""
            for chunk in plain:
                if chunk:
                    hasher.update(chunk)
                    yield chunk
            if not hmac.compare_digest(hasher.hexdigest(), digest):
                logger.error("blob %s failed its sha256 check", digest)
                raise IntegrityCheckFailed("The blob's content does not match its digest")
        finally:
            _close(plain)
            _close(stored)

    def exists(self, digest: str) -> bool:
        """True when the blob is stored.

        Raises:
            InvalidParameter: ``digest`` is malformed.
        """
        return self._objects.exists(blob_key(digest))

    def size(self, digest: str) -> int:
        """The blob's plaintext size in bytes.

        Raises:
            InvalidParameter: ``digest`` is malformed.
            NotFound: no such blob.
            IntegrityCheckFailed: the stored size is impossible for its format.
        """
        final = blob_key(digest)
        try:
            stored_size = self._objects.size(final)
        except NotFound:
            raise NotFound("Blob not found") from None
        envelope = self._read_sidecar(final)
        return stored_size if envelope is None else plaintext_size(stored_size, envelope.chunk_size)

    def delete(self, digest: str) -> bool:
        """Remove a blob and its sidecar; True when the blob existed.

        Callers own the reference counting: a blob may be shared by many paths.

        Raises:
            InvalidParameter: ``digest`` is malformed.
        """
        final = blob_key(digest)
        with self._lock(digest):
            existed = self._objects.delete(final)
            self._objects.delete(final + _SIDECAR_SUFFIX)
        return existed

    # ------------------------------------------------------------------ keys
    def rotate_master_key(self, keyring: Keyring) -> int:
        """Re-wrap every sidecar not wrapped by ``keyring``'s active key.

        Blob objects are never read or rewritten; only sidecars are. The
        keyring must still hold the keys the sidecars name. Afterwards this
        store encrypts new blobs with ``keyring``. Safe to run again (it then
        re-wraps nothing); retire old keys only after a run that succeeded.

        Returns:
            The number of sidecars re-wrapped.

        Raises:
            IntegrityCheckFailed: some sidecars could not be unwrapped (the
                others are re-wrapped all the same; the details are logged).
        """
        active_id, active_key = keyring.active_key()
        rewrapped = failed = 0
        for key in self._objects.list("blobs/"):
            digest = key.rsplit("/", 1)[-1].removesuffix(_SIDECAR_SUFFIX)
            if not key.endswith(_SIDECAR_SUFFIX) or not _DIGEST.match(digest):
                continue
            try:
                with self._lock(digest):
                    rewrapped += self._rewrap(
                        blob_key(digest), digest, keyring, active_id, active_key
                    )
            except IntegrityCheckFailed as exc:
                failed += 1
                logger.error("could not re-wrap the key sidecar of blob %s: %s", digest, exc)
        self._keyring = keyring
        logger.info("master key rotation re-wrapped %d sidecars", rewrapped)
        if failed:
            raise IntegrityCheckFailed(f"{failed} key sidecars could not be re-wrapped")
        return rewrapped

    def _rewrap(
        self, final: str, digest: str, keyring: Keyring, active_id: str, active_key: bytes
    ) -> int:
        envelope = self._read_sidecar(final)
        if envelope is None or envelope.key_id == active_id:
            return 0
        data_key = self._data_key(envelope, digest, keyring)
        renewed = wrap_data_key(
            active_key,
            active_id,
            data_key,
            digest=digest,
            nonce_prefix=envelope.nonce_prefix,
            chunk_size=envelope.chunk_size,
        )
        self._objects.write(final + _SIDECAR_SUFFIX, [renewed.to_json()])
        return 1


def _keyring(settings: Settings) -> Keyring | None:
    key_file = settings.resolved_master_key_file
    if settings.encrypt_artifacts:
        return Keyring.load_or_create(key_file)
    return Keyring.load(key_file) if key_file.exists() else None  # older blobs stay readable


def open_data_stores(
    settings: Settings, keyring: Keyring | None = None
) -> dict[str, tuple[BlobStore, str | None]]:
    """The further named stores of ``settings.data_stores``: name -> (blob store, the
    region its ``region`` label names). Encrypted at rest as the artifact store is, with the
    same keyring (``keyring``, else loaded as :func:`open_blob_store` loads it)."""
    if not settings.data_stores:
        return {}
    keys = keyring if keyring is not None else _keyring(settings)
    stores: dict[str, tuple[BlobStore, str | None]] = {}
    for name, config in sorted(settings.data_stores.items()):
        objects = open_store_objects(config, settings.data_store_root(name))
        blobs = BlobStore(
            objects,
            keys,
            encrypt=settings.encrypt_artifacts,
            keyring_file=settings.resolved_master_key_file,
        )
        stores[name] = (blobs, config.labels.get("region") or None)
    return stores


def open_blob_store(settings: Settings) -> BlobStore:
    """The blob store the settings describe.

    The object store comes from ``settings.artifacts``; when
    ``settings.encrypt_artifacts`` is true, the master keyring is loaded from
    (or created at) ``settings.resolved_master_key_file``.

    Raises:
        InvalidParameter: unknown artifact store type.
        IntegrityCheckFailed: the keyring file exists but is not valid.
    """
    key_file = settings.resolved_master_key_file
    keyring = None
    if settings.encrypt_artifacts:
        keyring = Keyring.load_or_create(key_file)
    elif key_file.exists():
        keyring = Keyring.load(key_file)  # blobs encrypted earlier stay readable
    return BlobStore(
        open_object_store(settings),
        keyring,
        encrypt=settings.encrypt_artifacts,
        keyring_file=key_file,
    )
