"""The master keyring file: private, atomic, and loud when it is damaged."""

from __future__ import annotations

import base64
import json
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shamal.artifacts import Keyring
from shamal.errors import IntegrityCheckFailed, InvalidParameter, NotFound


def test_load_or_create_makes_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "home" / "keys" / "master.json"
    ring = Keyring.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "home").stat().st_mode) == 0o700
    again = Keyring.load_or_create(path)
    assert again.active_id == ring.active_id
    assert again.active_key() == ring.active_key()
    assert [p.name for p in path.parent.iterdir()] == ["master.json"]  # no temp files left


def test_concurrent_creation_yields_one_keyring(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "master.json"
    with ThreadPoolExecutor(max_workers=8) as pool:
        rings = list(pool.map(lambda _: Keyring.load_or_create(path), range(16)))
    assert len({r.active_key() for r in rings}) == 1
    assert Keyring.load(path).active_key() == rings[0].active_key()


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "master.json"
    ring = Keyring.generate()
    first = ring.active_id
    second = ring.add_key()
    assert ring.active_id == second != first
    ring.save(path)
    loaded = Keyring.load(path)
    assert loaded.key_ids == ring.key_ids
    assert loaded.active_key() == ring.active_key()
    assert loaded.key(first) == ring.key(first)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_retire(tmp_path: Path) -> None:
    ring = Keyring.generate()
    old = ring.active_id
    with pytest.raises(InvalidParameter):
        ring.retire(old)
    ring.add_key()
    ring.retire(old)
    assert old not in ring.key_ids
    with pytest.raises(NotFound):
        ring.key(old)
    with pytest.raises(NotFound):
        ring.retire(old)


def test_keys_stay_out_of_repr() -> None:
    ring = Keyring.generate()
    _, key = ring.active_key()
    text = repr(ring)
    assert base64.b64encode(key).decode() not in text
    assert key.hex() not in text
    assert ring.active_id in text


def test_load_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        Keyring.load(tmp_path / "absent.json")


def _saved(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    path = tmp_path / "master.json"
    ring = Keyring.generate()
    ring.add_key()
    ring.save(path)
    return path, json.loads(path.read_bytes())


def _flip_key_bit(doc: dict[str, object]) -> None:
    entry = doc["keys"][0]  # type: ignore[index]
    raw = bytearray(base64.b64decode(entry["key"]))
    raw[0] ^= 1
    entry["key"] = base64.b64encode(raw).decode()


def _short_key(doc: dict[str, object]) -> None:
    doc["keys"][0]["key"] = base64.b64encode(b"short").decode()  # type: ignore[index]


def _unknown_active(doc: dict[str, object]) -> None:
    doc["active"] = "nobody"


def _duplicate_id(doc: dict[str, object]) -> None:
    keys = doc["keys"]
    keys.append(dict(keys[0]))  # type: ignore[attr-defined]


def _extra_field(doc: dict[str, object]) -> None:
    doc["comment"] = "x"


def _bad_base64(doc: dict[str, object]) -> None:
    doc["keys"][0]["key"] = "not base64!"  # type: ignore[index]


def _no_keys(doc: dict[str, object]) -> None:
    doc["keys"] = []


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (_flip_key_bit, "check value"),
        (_short_key, "256 bits"),
        (_unknown_active, "active key"),
        (_duplicate_id, "twice"),
        (_extra_field, "wrong fields"),
        (_bad_base64, "base64"),
        (_no_keys, "no keys"),
    ],
)
def test_tampered_keyrings_fail_clearly(tmp_path: Path, tamper: object, reason: str) -> None:
    path, doc = _saved(tmp_path)
    tamper(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))
    with pytest.raises(IntegrityCheckFailed, match=reason) as excinfo:
        Keyring.load(path)
    assert str(tmp_path) not in excinfo.value.message


@pytest.mark.parametrize("garbage", [b"", b"\x00\xff garbage", b"[1, 2]", b'"text"', b"{}"])
def test_garbage_keyrings_fail_clearly(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "master.json"
    path.write_bytes(garbage)
    with pytest.raises(IntegrityCheckFailed, match="master keyring is malformed"):
        Keyring.load(path)
    with pytest.raises(IntegrityCheckFailed):
        Keyring.load_or_create(path)  # never silently replaced
    assert path.read_bytes() == garbage


def test_in_memory_keys_are_validated() -> None:
    with pytest.raises(InvalidParameter):
        Keyring({"k": b"short"}, "k")
    with pytest.raises(InvalidParameter):
        Keyring({"k": bytes(32)}, "other")
    with pytest.raises(InvalidParameter):
        Keyring({"bad id!": bytes(32)}, "bad id!")
