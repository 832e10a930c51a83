"""BlobStore over {local, S3} x {plain, encrypted}: addressing, verification, encryption."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import shamal.artifacts
from shamal.artifacts import BlobStore, Keyring, LocalObjectStore, ObjectStore, open_blob_store
from shamal.artifacts._blobs import blob_key
from shamal.artifacts._crypto import CHUNK_SIZE, HEADER_SIZE, TAG_SIZE
from shamal.config import Settings
from shamal.errors import Conflict, IntegrityCheckFailed, InvalidParameter, NotFound

from .conftest import MIB

FRAME = CHUNK_SIZE + TAG_SIZE


def _content(size: int, seed: int = 0) -> bytes:
    block = hashlib.sha256(seed.to_bytes(8, "big")).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def _chunked(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _raw(store: BlobStore, key: str) -> bytes:
    return b"".join(store.objects.read(key))


def _read(store: BlobStore, digest: str) -> bytes:
    return b"".join(store.open(digest))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------- every combination
@pytest.mark.parametrize(
    "size", [0, 1, 1000, CHUNK_SIZE, CHUNK_SIZE + 1, 2 * CHUNK_SIZE, 5 * MIB // 2]
)
def test_round_trip(blob_store: BlobStore, size: int) -> None:
    data = _content(size, seed=size)
    info = blob_store.put(_chunked(data, 77_777))
    assert info.digest == _digest(data)
    assert info.size == size
    assert blob_store.exists(info.digest)
    assert blob_store.size(info.digest) == size
    assert _read(blob_store, info.digest) == data
    assert blob_store.objects.exists(blob_key(info.digest))
    assert blob_key(info.digest) == f"blobs/{info.digest[:2]}/{info.digest[2:4]}/{info.digest}"


def test_same_content_is_stored_once(blob_store: BlobStore) -> None:
    data = _content(300_000)
    first = blob_store.put([data])
    second = blob_store.put(_chunked(data, 1000))
    assert first == second
    expected = [blob_key(first.digest)]
    if blob_store.keyring is not None:
        expected.append(blob_key(first.digest) + ".key")
    assert sorted(blob_store.objects.list("")) == expected
    assert _read(blob_store, first.digest) == data


def test_empty_blob(blob_store: BlobStore) -> None:
    info = blob_store.put([])
    assert info.digest == _digest(b"")
    assert info.size == 0
    assert list(blob_store.open(info.digest)) == []
    assert blob_store.size(info.digest) == 0


def test_expected_digest(blob_store: BlobStore) -> None:
    data = b"some content"
    assert blob_store.put([data], expected_digest=_digest(data)).digest == _digest(data)
    with pytest.raises(InvalidParameter, match="expected digest"):
        blob_store.put([b"other content"], expected_digest=_digest(b"not it"))
    assert sorted(blob_store.objects.list("")) == sorted(
        k for k in blob_store.objects.list("blobs/") if _digest(data) in k
    )
    assert list(blob_store.objects.list("tmp/")) == []


@pytest.mark.parametrize("bad", ["", "abc", "A" * 64, "g" * 64, "../" + "a" * 61, "a" * 65])
def test_malformed_digests_are_refused(blob_store: BlobStore, bad: str) -> None:
    consumed: list[bytes] = []

    def producer() -> Iterator[bytes]:
        consumed.append(b"x")
        yield b"x"

    with pytest.raises(InvalidParameter):
        blob_store.put(producer(), expected_digest=bad)
    assert consumed == []  # refused before reading the stream
    for method in (blob_store.open, blob_store.exists, blob_store.size, blob_store.delete):
        with pytest.raises(InvalidParameter):
            method(bad)


def test_missing_blobs(blob_store: BlobStore) -> None:
    digest = _digest(b"never stored")
    with pytest.raises(NotFound):
        blob_store.open(digest)
    with pytest.raises(NotFound):
        blob_store.size(digest)
    assert not blob_store.exists(digest)
    assert blob_store.delete(digest) is False


def test_delete_removes_blob_and_sidecar(blob_store: BlobStore) -> None:
    info = blob_store.put([b"to be deleted"])
    assert blob_store.delete(info.digest) is True
    assert list(blob_store.objects.list("")) == []
    with pytest.raises(NotFound):
        blob_store.open(info.digest)


class _Boom(Exception):
    pass


def test_a_failing_stream_stores_nothing(blob_store: BlobStore) -> None:
    def producer() -> Iterator[bytes]:
        yield _content(3 * MIB)
        raise _Boom

    with pytest.raises(_Boom):
        blob_store.put(producer())
    assert list(blob_store.objects.list("")) == []


def _replace(data: bytes) -> bytes:
    return _content(len(data) or 1, seed=99)


def _flip_middle_bit(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(out) // 2] ^= 0x10
    return bytes(out)


def _drop_last_byte(data: bytes) -> bytes:
    return data[:-1]


def _append_byte(data: bytes) -> bytes:
    return data + b"\x00"


@pytest.mark.parametrize("corrupt", [_replace, _flip_middle_bit, _drop_last_byte, _append_byte])
def test_a_corrupted_stored_object_fails_verification(
    blob_store: BlobStore, corrupt: Callable[[bytes], bytes]
) -> None:
    data = _content(2 * CHUNK_SIZE + 500)
    info = blob_store.put([data])
    key = blob_key(info.digest)
    blob_store.objects.write(key, [corrupt(_raw(blob_store, key))])
    with pytest.raises(IntegrityCheckFailed):
        _read(blob_store, info.digest)


def test_abandoned_reads_release_their_resources(blob_store: BlobStore) -> None:
    info = blob_store.put([_content(3 * MIB)])
    unread = blob_store.open(info.digest)
    partly = blob_store.open(info.digest)
    assert len(next(partly)) > 0
    partly.close()  # type: ignore[attr-defined]
    del unread  # garbage-collected unread; under -W error a leak would fail the test
    assert _read(blob_store, info.digest) == _content(3 * MIB)


def test_concurrent_puts_of_the_same_content(blob_store: BlobStore) -> None:
    data = _content(CHUNK_SIZE + 12_345, seed=7)
    with ThreadPoolExecutor(max_workers=4) as pool:
        infos = list(pool.map(lambda _: blob_store.put(_chunked(data, 100_000)), range(8)))
    assert {i.digest for i in infos} == {_digest(data)}
    assert _read(blob_store, _digest(data)) == data
    assert list(blob_store.objects.list("tmp/")) == []


# --------------------------------------------------------------------- encrypted only
@pytest.fixture
def encrypted(object_store: ObjectStore) -> BlobStore:
    return BlobStore(object_store, Keyring.generate())


def _frames(stored: bytes) -> tuple[bytes, list[bytes]]:
    body = stored[HEADER_SIZE:]
    return stored[:HEADER_SIZE], [body[i : i + FRAME] for i in range(0, len(body), FRAME)]


def test_plaintext_never_reaches_the_store(encrypted: BlobStore) -> None:
    marker = os.urandom(32)
    data = marker * 40_000  # 1.2 MiB: two frames
    info = encrypted.put(_chunked(data, 4096))
    for key in encrypted.objects.list(""):
        stored = _raw(encrypted, key)
        assert marker not in stored
        assert marker[:16] not in stored
    assert len(_raw(encrypted, blob_key(info.digest))) == HEADER_SIZE + len(data) + 2 * TAG_SIZE
    sidecar = json.loads(_raw(encrypted, blob_key(info.digest) + ".key"))
    assert sidecar["key_id"] == encrypted.keyring.active_id  # type: ignore[union-attr]


def test_a_flipped_bit_fails_before_its_chunk_is_released(encrypted: BlobStore) -> None:
    data = _content(3 * CHUNK_SIZE)
    info = encrypted.put([data])
    key = blob_key(info.digest)
    stored = bytearray(_raw(encrypted, key))
    stored[HEADER_SIZE + FRAME + 100] ^= 0x01  # in the second frame
    encrypted.objects.write(key, [bytes(stored)])
    released: list[bytes] = []
    stream = encrypted.open(info.digest)
    with pytest.raises(IntegrityCheckFailed, match="authentication"):
        released.extend(stream)  # keeps what was released before the failure
    assert b"".join(released) == data[:CHUNK_SIZE]


def test_truncation_at_a_frame_boundary_fails(encrypted: BlobStore) -> None:
    info = encrypted.put([_content(3 * CHUNK_SIZE)])
    key = blob_key(info.digest)
    header, frames = _frames(_raw(encrypted, key))
    encrypted.objects.write(key, [header, *frames[:-1]])
    # Caught by the frames themselves, not only by the final sha256.
    with pytest.raises(IntegrityCheckFailed, match="authentication"):
        _read(encrypted, info.digest)
    encrypted.objects.write(key, [header])
    with pytest.raises(IntegrityCheckFailed, match="truncated"):
        _read(encrypted, info.digest)


def test_swapped_frames_fail(encrypted: BlobStore) -> None:
    info = encrypted.put([_content(3 * CHUNK_SIZE, seed=1)])
    key = blob_key(info.digest)
    header, frames = _frames(_raw(encrypted, key))
    encrypted.objects.write(key, [header, frames[1], frames[0], frames[2]])
    with pytest.raises(IntegrityCheckFailed):
        _read(encrypted, info.digest)


def test_sidecars_swapped_between_blobs_fail(encrypted: BlobStore) -> None:
    a = encrypted.put([b"blob a" * 1000])
    b = encrypted.put([b"blob b" * 1000])
    side_a, side_b = (_raw(encrypted, blob_key(x.digest) + ".key") for x in (a, b))
    encrypted.objects.write(blob_key(a.digest) + ".key", [side_b])
    encrypted.objects.write(blob_key(b.digest) + ".key", [side_a])
    for info in (a, b):
        with pytest.raises(IntegrityCheckFailed):
            _read(encrypted, info.digest)


def test_ciphertext_moved_to_another_blob_fails(encrypted: BlobStore) -> None:
    a = encrypted.put([b"blob a" * 1000])
    b = encrypted.put([b"blob b" * 1000])
    encrypted.objects.write(blob_key(b.digest), [_raw(encrypted, blob_key(a.digest))])
    encrypted.objects.write(blob_key(b.digest) + ".key", [b"{}"])
    with pytest.raises(IntegrityCheckFailed):
        _read(encrypted, b.digest)
    encrypted.objects.write(
        blob_key(b.digest) + ".key", [_raw(encrypted, blob_key(a.digest) + ".key")]
    )
    with pytest.raises(IntegrityCheckFailed):
        _read(encrypted, b.digest)


def test_a_missing_sidecar_fails(encrypted: BlobStore) -> None:
    info = encrypted.put([b"content" * 100])
    encrypted.objects.delete(blob_key(info.digest) + ".key")
    with pytest.raises(IntegrityCheckFailed):
        _read(encrypted, info.digest)


def test_encrypted_blobs_need_the_keyring(encrypted: BlobStore) -> None:
    info = encrypted.put([b"content"])
    with pytest.raises(IntegrityCheckFailed, match="no master keyring"):
        BlobStore(encrypted.objects).open(info.digest)
    with pytest.raises(IntegrityCheckFailed, match="not in the keyring"):
        BlobStore(encrypted.objects, Keyring.generate()).open(info.digest)


def test_plain_blobs_stay_readable_once_encryption_is_on(object_store: ObjectStore) -> None:
    data = b"stored before encryption was turned on"
    info = BlobStore(object_store).put([data])
    store = BlobStore(object_store, Keyring.generate())
    assert _read(store, info.digest) == data
    assert store.put([data]) == info  # deduplicated against the plain blob
    assert sorted(object_store.list("")) == [blob_key(info.digest)]


def test_rotation_rewraps_sidecars_only(object_store: ObjectStore) -> None:
    ring = Keyring.generate()
    old_id = ring.active_id
    store = BlobStore(object_store, ring)
    contents = [_content(n, seed=n) for n in (0, 10, CHUNK_SIZE + 1)]
    infos = [store.put([c]) for c in contents]
    plain_info = BlobStore(object_store).put([b"a plain blob"])
    blobs_before = {i.digest: _raw(store, blob_key(i.digest)) for i in infos}
    sidecars_before = {i.digest: _raw(store, blob_key(i.digest) + ".key") for i in infos}

    new_id = ring.add_key()
    assert store.rotate_master_key(ring) == len(infos)
    assert store.rotate_master_key(ring) == 0  # idempotent
    ring.retire(old_id)

    fresh = BlobStore(object_store, Keyring({new_id: ring.key(new_id)}, new_id))
    for info, data in zip(infos, contents, strict=True):
        assert _raw(store, blob_key(info.digest)) == blobs_before[info.digest]
        sidecar = _raw(store, blob_key(info.digest) + ".key")
        assert sidecar != sidecars_before[info.digest]
        assert json.loads(sidecar)["key_id"] == new_id
        assert _read(fresh, info.digest) == data
    assert _read(fresh, plain_info.digest) == b"a plain blob"
    newer = store.put([b"after rotation"])
    assert json.loads(_raw(store, blob_key(newer.digest) + ".key"))["key_id"] == new_id


def test_rotation_reports_sidecars_it_cannot_unwrap(object_store: ObjectStore) -> None:
    ring = Keyring.generate()
    store = BlobStore(object_store, ring)
    good = store.put([b"good"])
    bad = store.put([b"bad"])
    object_store.write(blob_key(bad.digest) + ".key", [_raw(store, blob_key(good.digest) + ".key")])
    ring.add_key()
    with pytest.raises(IntegrityCheckFailed, match="1 key sidecars"):
        store.rotate_master_key(ring)
    assert _read(store, good.digest) == b"good"  # the others were re-wrapped all the same
    assert json.loads(_raw(store, blob_key(good.digest) + ".key"))["key_id"] == ring.active_id


def test_reading_after_retiring_without_rotation_fails(encrypted: BlobStore) -> None:
    ring = encrypted.keyring
    assert ring is not None
    info = encrypted.put([b"content"])
    old = ring.active_id
    ring.add_key()
    ring.retire(old)
    with pytest.raises(IntegrityCheckFailed, match="not in the keyring"):
        encrypted.open(info.digest)


# --------------------------------------------------------------------- races across processes
class _InterleavingStore:
    """A real object store with one-shot hooks around the first rename into ``blobs/``.

    Two BlobStores over one of these, each with its own locks, behave like two
    processes sharing a bucket; the hooks place the other one's work exactly
    where a race would put it.
    """

    def __init__(
        self,
        inner: ObjectStore,
        before: Callable[[], None] | None = None,
        after: Callable[[str], None] | None = None,
    ) -> None:
        self._inner = inner
        self._before = before
        self._after = after

    def write(self, key: str, chunks: Iterable[bytes]) -> int:
        return self._inner.write(key, chunks)

    def read(self, key: str, chunk_size: int = MIB, *, limit: int | None = None) -> Iterator[bytes]:
        return self._inner.read(key, chunk_size, limit=limit)

    def exists(self, key: str) -> bool:
        return self._inner.exists(key)

    def size(self, key: str) -> int:
        return self._inner.size(key)

    def delete(self, key: str) -> bool:
        return self._inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        return self._inner.list(prefix)

    def rename(self, src: str, dst: str) -> None:
        hooked = dst.startswith("blobs/")
        if hooked and self._before is not None:
            before, self._before = self._before, None
            before()
        self._inner.rename(src, dst)
        if hooked and self._after is not None:
            after, self._after = self._after, None
            after(dst)


def test_a_sidecar_replaced_by_a_concurrent_writer_is_restored(object_store: ObjectStore) -> None:
    ring = Keyring.generate()
    data = _content(CHUNK_SIZE + 10, seed=5)
    other = BlobStore(object_store, ring)
    # The other process publishes the same content between our sidecar and our rename.
    ours = BlobStore(_InterleavingStore(object_store, before=lambda: other.put([data])), ring)
    info = ours.put([data])
    assert _read(ours, info.digest) == data
    assert _read(other, info.digest) == data
    assert list(object_store.list("tmp/")) == []


def test_an_unrepairable_race_is_reported_and_healed_by_a_retry(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    ring = Keyring.generate()
    data = _content(1000, seed=6)
    other = BlobStore(object_store, ring)
    # A third writer's encrypted copy of the same content (its sidecar never lands).
    third = BlobStore(LocalObjectStore(tmp_path / "third"), ring)
    third_blob = _raw(third, blob_key(third.put([data]).digest))

    def stale_blob_lands_after_ours(key: str) -> None:
        object_store.write(key, [third_blob])  # now: a third blob beside the other's sidecar

    def other_publishes_first() -> None:
        other.put([data])

    ours = BlobStore(
        _InterleavingStore(object_store, other_publishes_first, stale_blob_lands_after_ours), ring
    )
    with pytest.raises(Conflict):
        ours.put([data])
    with pytest.raises(IntegrityCheckFailed):
        _read(ours, _digest(data))
    assert ours.put([data]).digest == _digest(data)  # the retry replaces the broken pair
    assert _read(other, _digest(data)) == data


# --------------------------------------------------------------------- settings
def test_open_blob_store_with_encryption(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", encrypt_artifacts=True)
    store = open_blob_store(settings)
    key_file = settings.resolved_master_key_file
    assert (key_file.stat().st_mode & 0o777) == 0o600
    info = store.put([b"encrypted at rest"])
    assert store.objects.exists(blob_key(info.digest) + ".key")
    again = open_blob_store(settings)  # same keyring file
    assert _read(again, info.digest) == b"encrypted at rest"


def test_open_blob_store_without_encryption(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    store = open_blob_store(settings)
    assert isinstance(store.objects, LocalObjectStore)
    info = store.put([b"plain"])
    assert not store.objects.exists(blob_key(info.digest) + ".key")
    assert not settings.resolved_master_key_file.exists()
    assert _raw(store, blob_key(info.digest)) == b"plain"


# --------------------------------------------------------------------- memory
STREAM_SIZE = 64 * MIB
MEMORY_LIMIT = 16 * MIB


def _generated(total: int) -> Iterator[bytes]:
    """Distinct 1 MiB chunks made on the fly: the stream never exists as a whole."""
    for i in range(total // MIB):
        yield hashlib.sha256(i.to_bytes(8, "big")).digest() * (MIB // 32)


def _generated_digest(total: int) -> str:
    h = hashlib.sha256()
    for chunk in _generated(total):
        h.update(chunk)
    return h.hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "encrypted"])
def test_local_put_and_open_stream_in_bounded_memory(tmp_path: Path, encrypt: bool) -> None:
    store = BlobStore(LocalObjectStore(tmp_path), Keyring.generate() if encrypt else None)
    expected = _generated_digest(STREAM_SIZE)
    tracemalloc.start()
    try:
        info = store.put(_generated(STREAM_SIZE))
        h, n = hashlib.sha256(), 0
        for chunk in store.open(info.digest):
            h.update(chunk)
            n += len(chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.digest == expected == h.hexdigest()
    assert n == STREAM_SIZE
    assert peak < MEMORY_LIMIT, f"peak {peak / MIB:.1f} MiB"


# moto's server keeps whole objects in memory, and runs in this process: the
# client side is measured in a process of its own.
_CHILD = """
import hashlib, json, sys, tracemalloc
from shamal.artifacts import BlobStore, Keyring, S3ObjectStore
from shamal.config import S3ArtifactSettings
endpoint, bucket, encrypt, total = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
config = S3ArtifactSettings(bucket=bucket, prefix="memory", endpoint_url=endpoint)
objects = S3ObjectStore.from_artifact_settings(config)  # the production defaults: 8 MiB parts
store = BlobStore(objects, Keyring.generate() if encrypt else None)
MIB = 1024 * 1024
def generated():
    for i in range(total // MIB):
        yield hashlib.sha256(i.to_bytes(8, "big")).digest() * (MIB // 32)
tracemalloc.start()
info = store.put(generated())
put_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.reset_peak()
h, n = hashlib.sha256(), 0
for chunk in store.open(info.digest):
    h.update(chunk)
    n += len(chunk)
read_peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"digest": info.digest, "read_digest": h.hexdigest(), "read_size": n,
                  "put_peak": put_peak, "read_peak": read_peak}))
"""


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "encrypted"])
def test_s3_put_and_open_stream_in_bounded_memory(
    s3_endpoint: str, s3_bucket: str, encrypt: bool
) -> None:
    src = Path(shamal.artifacts.__file__).parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [s3_endpoint, s3_bucket, "1" if encrypt else "0", str(STREAM_SIZE)]
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _CHILD, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    expected = _generated_digest(STREAM_SIZE)
    assert result["digest"] == result["read_digest"] == expected
    assert result["read_size"] == STREAM_SIZE
    assert result["put_peak"] < MEMORY_LIMIT, f"put peak {result['put_peak'] / MIB:.1f} MiB"
    assert result["read_peak"] < MEMORY_LIMIT, f"read peak {result['read_peak'] / MIB:.1f} MiB"
