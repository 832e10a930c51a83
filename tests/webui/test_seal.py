"""The session cookie's seal: opaque, refused when changed, made by another key or too old;
the forms' CSRF tokens bound to their session."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from shamal.webui import SessionSeal

TOKEN = "shm_" + "a" * 40


def test_a_sealed_token_opens_and_is_opaque() -> None:
    seal = SessionSeal(b"k" * 32)
    cookie = seal.seal(TOKEN)
    assert TOKEN not in cookie
    assert "a" * 10 not in cookie
    assert seal.open(cookie) == TOKEN
    assert seal.seal(TOKEN) != cookie  # a fresh IV each time


@pytest.mark.parametrize("position", [0, 1, 9, 30, 60, -1])
def test_a_changed_cookie_is_refused(position: int) -> None:
    """One bit of the version, the time, the IV, the ciphertext or the MAC flipped."""
    seal = SessionSeal(b"k" * 32)
    raw = bytearray(base64.urlsafe_b64decode(seal.seal(TOKEN)))
    raw[position] ^= 0x01
    assert seal.open(base64.urlsafe_b64encode(bytes(raw)).decode()) is None


def test_other_keys_garbage_and_old_cookies_are_refused() -> None:
    seal = SessionSeal(b"k" * 32)
    assert SessionSeal(b"j" * 32).open(seal.seal(TOKEN)) is None
    for garbage in ["", "x", "gAAAAA", "é" * 10, "A" * 5000]:
        assert seal.open(garbage) is None
    now = [1_800_000_000.0]
    timed = SessionSeal(b"k" * 32, max_age_s=3600, clock=lambda: now[0])
    cookie = timed.seal(TOKEN)
    now[0] += 3600
    assert timed.open(cookie) == TOKEN
    now[0] += 2
    assert timed.open(cookie) is None  # too old: sign in again


def test_csrf_tokens_belong_to_their_session() -> None:
    seal = SessionSeal(b"k" * 32)
    one, two = seal.seal(TOKEN), seal.seal(TOKEN)
    token = seal.csrf_token(one)
    assert seal.csrf_valid(one, token)
    assert not seal.csrf_valid(two, token)
    assert not seal.csrf_valid(one, "")
    assert not seal.csrf_valid("", seal.csrf_token(""))
    assert not SessionSeal(b"j" * 32).csrf_valid(one, token)


def test_the_key_file_is_made_once_for_its_owner_only(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    first = SessionSeal.from_keys_dir(keys)
    cookie = first.seal(TOKEN)
    key_file = keys / "ui-session.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert SessionSeal.from_keys_dir(keys).open(cookie) == TOKEN  # another worker, same key
    with pytest.raises(ValueError, match="32 bytes"):
        SessionSeal(b"short")
