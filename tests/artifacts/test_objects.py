"""One contract suite for every ObjectStore, plus what only one backend can show."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from shamal.artifacts import (
    LocalObjectStore,
    ObjectStore,
    S3ObjectStore,
    open_object_store,
)
from shamal.config import LocalArtifactSettings, S3ArtifactSettings, Settings
from shamal.errors import Conflict, IntegrityCheckFailed, InvalidParameter, NotFound

from .conftest import DUMMY_CREDENTIALS, MIB, S3_PART_SIZE, make_s3_store

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


def _pattern(size: int, seed: int = 0) -> bytes:
    block = bytes((i * 31 + seed) % 251 for i in range(4096))
    return (block * (size // len(block) + 1))[:size]


def _chunked(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _read_all(store: ObjectStore, key: str) -> bytes:
    return b"".join(store.read(key))


# --------------------------------------------------------------------- contract
def test_implements_the_protocol(object_store: ObjectStore) -> None:
    assert isinstance(object_store, ObjectStore)


@pytest.mark.parametrize("size", [0, 1, 1000, MIB + 7])
def test_round_trip(object_store: ObjectStore, size: int) -> None:
    data = _pattern(size)
    assert object_store.write("a/b/obj.bin", _chunked(data, 4096)) == size
    assert object_store.exists("a/b/obj.bin")
    assert object_store.size("a/b/obj.bin") == size
    assert _read_all(object_store, "a/b/obj.bin") == data


def test_large_object_goes_up_in_parts_and_back(object_store: ObjectStore) -> None:
    # More than two S3 parts, fed in odd chunk sizes, one of them larger than a part.
    data = _pattern(2 * S3_PART_SIZE + 123_457, seed=3)
    pieces = [data[:10], data[10 : 10 + S3_PART_SIZE + 1], data[10 + S3_PART_SIZE + 1 :]]
    assert object_store.write("big", pieces) == len(data)
    assert object_store.size("big") == len(data)
    assert _read_all(object_store, "big") == data


def test_a_multiple_of_the_part_size_round_trips(object_store: ObjectStore) -> None:
    data = _pattern(2 * S3_PART_SIZE, seed=5)
    object_store.write("exact", _chunked(data, MIB))
    assert _read_all(object_store, "exact") == data


def test_read_respects_the_chunk_size(object_store: ObjectStore) -> None:
    data = _pattern(10_000)
    object_store.write("k", [data])
    chunks = list(object_store.read("k", chunk_size=1024))
    assert b"".join(chunks) == data
    assert all(0 < len(c) <= 1024 for c in chunks)
    assert len(chunks) >= 10


@pytest.mark.parametrize(("size", "limit"), [(0, 16), (10, 1), (10, 16), (100_000, 16), (10, 10)])
def test_ranged_reads_return_the_first_bytes(
    object_store: ObjectStore, size: int, limit: int
) -> None:
    data = _pattern(size)
    object_store.write("k", [data])
    assert b"".join(object_store.read("k", chunk_size=3, limit=limit)) == data[:limit]
    with pytest.raises(NotFound):
        object_store.read("missing", limit=limit)


@pytest.mark.parametrize(("chunk_size", "limit"), [(0, None), (-1, None), (1, 0), (1, -5)])
def test_read_sizes_must_be_positive(
    object_store: ObjectStore, chunk_size: int, limit: int | None
) -> None:
    object_store.write("k", [b"data"])
    with pytest.raises(InvalidParameter):
        object_store.read("k", chunk_size=chunk_size, limit=limit)


def test_missing_objects(object_store: ObjectStore) -> None:
    with pytest.raises(NotFound):
        object_store.read("nope")  # raises on the call, before any next()
    with pytest.raises(NotFound):
        object_store.size("nope")
    assert not object_store.exists("nope")
    assert object_store.delete("nope") is False
    with pytest.raises(NotFound):
        object_store.rename("nope", "other")
    assert not object_store.exists("other")


def test_overwrite_replaces_the_whole_object(object_store: ObjectStore) -> None:
    object_store.write("k", [b"first version, longer"])
    object_store.write("k", [b"second"])
    assert _read_all(object_store, "k") == b"second"


def test_delete(object_store: ObjectStore) -> None:
    object_store.write("d/k", [b"x"])
    assert object_store.delete("d/k") is True
    assert not object_store.exists("d/k")
    assert object_store.delete("d/k") is False


def test_rename_moves_and_replaces(object_store: ObjectStore) -> None:
    object_store.write("src/a", [b"new"])
    object_store.write("dst/b", [b"old"])
    object_store.rename("src/a", "dst/b")
    assert not object_store.exists("src/a")
    assert _read_all(object_store, "dst/b") == b"new"


def test_list_is_a_string_prefix_scan(object_store: ObjectStore) -> None:
    for key in ["a/b/1", "a/b/2", "a/bc/3", "a/c", "b/1", "top"]:
        object_store.write(key, [key.encode()])
    assert sorted(object_store.list("")) == ["a/b/1", "a/b/2", "a/bc/3", "a/c", "b/1", "top"]
    assert sorted(object_store.list("a/")) == ["a/b/1", "a/b/2", "a/bc/3", "a/c"]
    assert sorted(object_store.list("a/b/")) == ["a/b/1", "a/b/2"]
    assert sorted(object_store.list("a/b")) == ["a/b/1", "a/b/2", "a/bc/3"]
    assert sorted(object_store.list("t")) == ["top"]
    assert list(object_store.list("zzz/")) == []


def test_writes_are_atomic_for_readers(object_store: ObjectStore) -> None:
    object_store.write("k", [b"old content"])
    seen: list[bytes] = []

    def producer() -> Iterator[bytes]:
        yield b"new "
        # Mid-write, the old object is still whole and the new one invisible.
        seen.append(_read_all(object_store, "k"))
        seen.append(b"exists" if object_store.exists("fresh") else b"absent")
        yield b"content"

    object_store.write("k", producer())
    assert _read_all(object_store, "k") == b"new content"

    def fresh_producer() -> Iterator[bytes]:
        yield b"x" * (S3_PART_SIZE + 10)  # the S3 store is mid-multipart here
        seen.append(b"exists" if object_store.exists("fresh") else b"absent")
        yield b"y"

    object_store.write("fresh", fresh_producer())
    assert seen == [b"old content", b"absent", b"absent"]


class _ProducerFailed(Exception):
    pass


@pytest.mark.parametrize("fail_after", [0, 100, S3_PART_SIZE + 100])
def test_a_failed_write_leaves_nothing(object_store: ObjectStore, fail_after: int) -> None:
    object_store.write("keep", [b"old"])

    def producer() -> Iterator[bytes]:
        if fail_after:
            yield b"z" * fail_after
        raise _ProducerFailed

    with pytest.raises(_ProducerFailed):
        object_store.write("keep", producer())
    with pytest.raises(_ProducerFailed):
        object_store.write("new", producer())
    assert _read_all(object_store, "keep") == b"old"
    assert sorted(object_store.list("")) == ["keep"]


def test_abandoned_reads_release_their_resources(object_store: ObjectStore) -> None:
    object_store.write("k", [_pattern(100_000)])
    unread = object_store.read("k")
    partly = object_store.read("k", chunk_size=10)
    assert next(partly) == _pattern(10)
    # Under -W error an unclosed file or connection would fail the test (ResourceWarning).
    del unread, partly
    assert _read_all(object_store, "k") == _pattern(100_000)


@pytest.mark.parametrize("key", ["../x", "/abs", "a/../b", "a//b", "a\\b", "%2e%2e/x", ""])
def test_unsafe_keys_are_refused(object_store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidParameter):
        object_store.write(key, [b"x"])
    with pytest.raises(InvalidParameter):
        object_store.read(key)
    with pytest.raises(InvalidParameter):
        object_store.exists(key)
    with pytest.raises(InvalidParameter):
        object_store.rename("fine", key)
    with pytest.raises(InvalidParameter):
        list(object_store.list(key + "/"))


def test_concurrent_writers(object_store: ObjectStore) -> None:
    payloads = {i: _pattern(200_000 + i, seed=i) for i in range(8)}

    def work(i: int) -> None:
        object_store.write(f"own/{i}", _chunked(payloads[i], 65_536))
        object_store.write("shared", _chunked(payloads[i], 65_536))

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(work, payloads))
    for i, data in payloads.items():
        assert _read_all(object_store, f"own/{i}") == data
    assert _read_all(object_store, "shared") in payloads.values()


# --------------------------------------------------------------------- local only
def test_local_files_and_directories_are_private(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "home" / "artifacts")
    store.write("x/y/z", [b"secret"])
    root = tmp_path / "home"
    for directory in [root, root / "artifacts", root / "artifacts" / "x", root / "artifacts/x/y"]:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE((root / "artifacts/x/y/z").stat().st_mode) == 0o600
    assert list((root / "artifacts" / ".tmp").iterdir()) == []


def test_local_symlinks_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    sentinel = outside / "passwd"
    sentinel.write_text("root:x:0:0")
    store = LocalObjectStore(tmp_path / "store")
    (store.root / "l").symlink_to(outside)
    (store.root / "f").symlink_to(sentinel)
    for key in ["l/passwd", "f"]:
        with pytest.raises(InvalidParameter):
            _read_all(store, key)
        with pytest.raises(InvalidParameter):
            store.write(key, [b"pwned"])
        with pytest.raises(InvalidParameter):
            store.delete(key)
    with pytest.raises(InvalidParameter):
        store.write("l/new-file", [b"pwned"])
    assert sentinel.read_text() == "root:x:0:0"
    assert sorted(p.name for p in outside.iterdir()) == ["passwd"]
    assert list(store.list("")) == []


def test_local_hard_links_out_of_the_store_are_refused(tmp_path: Path) -> None:
    sentinel = tmp_path / "outside-secret"
    sentinel.write_text("secret")
    store = LocalObjectStore(tmp_path / "store")
    os.link(sentinel, store.root / "h")
    with pytest.raises(IntegrityCheckFailed, match="hard links"):
        store.read("h")
    store.write("h", [b"replaced"])  # replaces the directory entry, never writes through
    assert sentinel.read_text() == "secret"
    assert _read_all(store, "h") == b"replaced"


def test_local_reserves_the_temporary_directory(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    with pytest.raises(InvalidParameter, match="reserved"):
        store.write(".tmp/x", [b"x"])
    store.write("a", [b"x"])
    (store.root / ".tmp" / "leftover").write_bytes(b"partial")
    assert list(store.list("")) == ["a"]
    assert list(store.list(".tmp/")) == []


def test_local_key_that_is_a_prefix_of_others_conflicts(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.write("a/b", [b"x"])
    with pytest.raises(Conflict):
        store.write("a", [b"y"])
    assert not store.exists("a")
    assert list((store.root / ".tmp").iterdir()) == []


# --------------------------------------------------------------------- S3 only
@pytest.mark.s3
def test_s3_failed_multipart_upload_is_aborted(s3_client: S3Client, s3_bucket: str) -> None:
    store = make_s3_store(s3_client, s3_bucket)

    def producer() -> Iterator[bytes]:
        yield b"p" * (2 * S3_PART_SIZE + 1)
        raise _ProducerFailed

    with pytest.raises(_ProducerFailed):
        store.write("doomed", producer())
    uploads = s3_client.list_multipart_uploads(Bucket=s3_bucket)
    assert uploads.get("Uploads", []) == []
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


@pytest.mark.s3
def test_s3_keys_live_under_the_prefix(s3_client: S3Client, s3_bucket: str) -> None:
    store = make_s3_store(s3_client, s3_bucket)
    store.write("a/b", [b"x"])
    listed = s3_client.list_objects_v2(Bucket=s3_bucket)
    assert [o["Key"] for o in listed["Contents"]] == ["tenant-a/artifacts/a/b"]
    other = S3ObjectStore(s3_bucket, "tenant-b", s3_client)
    assert list(other.list("")) == []
    assert not other.exists("a/b")


@pytest.mark.s3
def test_s3_rename_of_a_big_object_uses_a_multipart_copy(
    s3_client: S3Client, s3_bucket: str
) -> None:
    store = make_s3_store(s3_client, s3_bucket, copy_threshold=S3_PART_SIZE)
    data = _pattern(2 * S3_PART_SIZE + 99, seed=9)
    store.write("from", _chunked(data, MIB))
    store.rename("from", "to")
    assert _read_all(store, "to") == data
    assert not store.exists("from")
    head = s3_client.head_object(Bucket=s3_bucket, Key="tenant-a/artifacts/to")
    assert head["ETag"].strip('"').endswith("-3")  # assembled from 3 copied parts


@pytest.mark.s3
def test_s3_store_refuses_bad_configuration(s3_client: S3Client) -> None:
    with pytest.raises(InvalidParameter):
        S3ObjectStore("bucket", "../up", s3_client)
    with pytest.raises(InvalidParameter):
        S3ObjectStore("bucket", "", s3_client, part_size=MIB)
    with pytest.raises(InvalidParameter):
        S3ObjectStore("a/b", "", s3_client)


# --------------------------------------------------------------------- factory
def test_open_object_store_local(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    store = open_object_store(settings)
    assert isinstance(store, LocalObjectStore)
    assert store.root == (tmp_path / "home" / "artifacts").resolve()
    explicit = Settings(home=tmp_path, artifacts=LocalArtifactSettings(root=tmp_path / "elsewhere"))
    store = open_object_store(explicit)
    assert isinstance(store, LocalObjectStore)
    assert store.root == (tmp_path / "elsewhere").resolve()


@pytest.mark.s3
def test_open_object_store_s3(s3_endpoint: str, s3_bucket: str, tmp_path: Path) -> None:
    artifacts = S3ArtifactSettings(
        bucket=s3_bucket,
        prefix="from-settings",
        endpoint_url=s3_endpoint,
        region=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"],
        access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    store = open_object_store(Settings(home=tmp_path, artifacts=artifacts))
    assert isinstance(store, S3ObjectStore)
    store.write("k", [b"through settings"])
    assert _read_all(store, "k") == b"through settings"
    assert list(store.list("")) == ["k"]
    assert "secret" not in repr(store)


def test_s3_from_settings_refuses_local_settings(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter):
        S3ObjectStore.from_settings(Settings(home=tmp_path))


def test_object_store_files_are_not_world_readable_by_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        store = LocalObjectStore(tmp_path / "s")
        store.write("a/b", [b"x"])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "s" / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "s" / "a" / "b").stat().st_mode) == 0o600
