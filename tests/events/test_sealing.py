"""Webhook secrets at rest: sealed, bound to their webhook, still open after a rotation."""

from __future__ import annotations

import pytest

from shamal.artifacts import Keyring
from shamal.errors import InternalError
from shamal.events._sealing import SecretBox
from shamal.security import PseudonymKeys

SECRET = "whsec-0123456789abcdef"


def test_a_sealed_secret_opens_only_for_its_webhook() -> None:
    box = SecretBox(PseudonymKeys(Keyring.generate()))
    sealed = box.seal("a" * 32, SECRET)
    assert SECRET not in sealed
    assert sealed != box.seal("a" * 32, SECRET)  # a fresh nonce each time
    assert box.open("a" * 32, sealed) == SECRET
    with pytest.raises(InternalError, match="could not be read"):
        box.open("b" * 32, sealed)


def test_a_rotation_leaves_older_secrets_openable() -> None:
    keys = PseudonymKeys(Keyring.generate())
    box = SecretBox(keys)
    old = box.seal("w", SECRET)
    keys.rotate()
    new = box.seal("w", SECRET)
    assert old.split(":")[1] != new.split(":")[1]
    assert box.open("w", old) == box.open("w", new) == SECRET


@pytest.mark.parametrize("sealed", ["v1:nokey:AAAA", "v2:x:y", "garbage", "v1:x:!!!"])
def test_a_damaged_secret_is_an_error_that_says_nothing_of_it(sealed: str) -> None:
    box = SecretBox(PseudonymKeys(Keyring.generate()))
    with pytest.raises(InternalError) as caught:
        box.open("w", sealed)
    assert sealed not in caught.value.message


def test_a_secret_another_ring_sealed_does_not_open() -> None:
    sealed = SecretBox(PseudonymKeys(Keyring.generate())).seal("w", SECRET)
    with pytest.raises(InternalError):
        SecretBox(PseudonymKeys(Keyring.generate())).open("w", sealed)
