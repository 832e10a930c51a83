"""The chunked AES-GCM stream format, on its own (BlobStore tests cover it in use)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shamal.artifacts._crypto import (
    HEADER_SIZE,
    TAG_SIZE,
    KeyEnvelope,
    decrypt_chunks,
    encrypt_chunks,
    new_data_key,
    new_nonce_prefix,
    plaintext_size,
    unwrap_data_key,
    wrap_data_key,
)
from shamal.errors import IntegrityCheckFailed

DIGEST_A = "a" * 64
DIGEST_B = "b" * 64


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


@settings(max_examples=300, deadline=None, database=None)
@given(
    data=st.binary(max_size=300),
    chunk_size=st.integers(min_value=1, max_value=40),
    cuts_in=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    cuts_out=st.lists(st.integers(min_value=0, max_value=1000), max_size=8),
)
def test_round_trip_with_any_chunking(
    data: bytes, chunk_size: int, cuts_in: list[int], cuts_out: list[int]
) -> None:
    key, prefix = new_data_key(), new_nonce_prefix()
    stored = b"".join(encrypt_chunks(_split(data, cuts_in), key, prefix, chunk_size))
    assert plaintext_size(len(stored), chunk_size) == len(data)
    plain = b"".join(decrypt_chunks(_split(stored, cuts_out), key, prefix, chunk_size))
    assert plain == data


@settings(max_examples=300, deadline=None, database=None)
@given(
    data=st.binary(min_size=0, max_size=120),
    chunk_size=st.integers(min_value=1, max_value=32),
    position=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
)
def test_any_bit_flip_fails(data: bytes, chunk_size: int, position: int, bit: int) -> None:
    key, prefix = new_data_key(), new_nonce_prefix()
    stored = bytearray(b"".join(encrypt_chunks([data], key, prefix, chunk_size)))
    stored[position % len(stored)] ^= 1 << bit
    with pytest.raises(IntegrityCheckFailed):
        b"".join(decrypt_chunks([bytes(stored)], key, prefix, chunk_size))


@settings(max_examples=200, deadline=None, database=None)
@given(data=st.binary(max_size=100), chunk_size=st.integers(1, 16), cut=st.integers(min_value=1))
def test_any_truncation_or_extension_fails(data: bytes, chunk_size: int, cut: int) -> None:
    key, prefix = new_data_key(), new_nonce_prefix()
    stored = b"".join(encrypt_chunks([data], key, prefix, chunk_size))
    shorter = stored[: len(stored) - 1 - cut % len(stored)]
    with pytest.raises(IntegrityCheckFailed):
        b"".join(decrypt_chunks([shorter], key, prefix, chunk_size))
    frame = stored[HEADER_SIZE : HEADER_SIZE + chunk_size + TAG_SIZE]
    with pytest.raises(IntegrityCheckFailed):
        b"".join(decrypt_chunks([stored, frame], key, prefix, chunk_size))


@pytest.mark.parametrize("frames_kept", [0, 1, 2])
def test_a_stream_cut_at_a_frame_boundary_fails(frames_kept: int) -> None:
    key, prefix = new_data_key(), new_nonce_prefix()
    stored = b"".join(encrypt_chunks([bytes(30)], key, prefix, 10))
    cut = stored[: HEADER_SIZE + frames_kept * (10 + TAG_SIZE)]
    with pytest.raises(IntegrityCheckFailed, match="authentication|truncated"):
        b"".join(decrypt_chunks([cut], key, prefix, 10))


def test_frames_are_released_only_after_their_tag_checks() -> None:
    key, prefix = new_data_key(), new_nonce_prefix()
    data = bytes(range(40))
    stored = bytearray(b"".join(encrypt_chunks([data], key, prefix, 10)))
    stored[HEADER_SIZE + 2 * (10 + TAG_SIZE) + 3] ^= 0x80  # third frame
    released: list[bytes] = []
    stream = decrypt_chunks([bytes(stored)], key, prefix, 10)
    with pytest.raises(IntegrityCheckFailed):
        released.extend(stream)  # keeps what was released before the failure
    assert b"".join(released) == data[:20]


def test_wrapped_key_is_bound_to_the_digest() -> None:
    master, data_key, prefix = new_data_key(), new_data_key(), new_nonce_prefix()
    envelope = wrap_data_key(master, "k1", data_key, digest=DIGEST_A, nonce_prefix=prefix)
    assert unwrap_data_key(master, envelope, digest=DIGEST_A) == data_key
    with pytest.raises(IntegrityCheckFailed):
        unwrap_data_key(master, envelope, digest=DIGEST_B)
    with pytest.raises(IntegrityCheckFailed):
        unwrap_data_key(new_data_key(), envelope, digest=DIGEST_A)
    relabelled = KeyEnvelope("k2", prefix, envelope.wrap_nonce, envelope.wrapped_key)
    with pytest.raises(IntegrityCheckFailed):
        unwrap_data_key(master, relabelled, digest=DIGEST_A)


def test_envelope_json_round_trip_and_strict_parsing() -> None:
    envelope = wrap_data_key(
        new_data_key(), "k1", new_data_key(), digest=DIGEST_A, nonce_prefix=new_nonce_prefix()
    )
    assert KeyEnvelope.from_json(envelope.to_json()) == envelope
    for garbage in [b"", b"{}", b"[]", b"null", envelope.to_json().replace(b'"k1"', b'"../x"')]:
        with pytest.raises(IntegrityCheckFailed):
            KeyEnvelope.from_json(garbage)


@pytest.mark.parametrize("stored_size", [0, HEADER_SIZE, HEADER_SIZE + TAG_SIZE - 1])
def test_impossible_sizes_are_refused(stored_size: int) -> None:
    with pytest.raises(IntegrityCheckFailed):
        plaintext_size(stored_size)


def test_a_final_frame_shorter_than_a_tag_is_an_impossible_size() -> None:
    with pytest.raises(IntegrityCheckFailed):
        plaintext_size(HEADER_SIZE + (10 + TAG_SIZE) + 5, chunk_size=10)
