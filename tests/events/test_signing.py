"""Webhook signatures: MLflow 3's own signer is the judge of the format.

The installed MLflow client ships no verification helper (``mlflow.webhooks`` has only the
signer, ``delivery._generate_hmac_signature``); so a receiver written for MLflow recomputes
what that signer makes, and ours must make the same bytes, and accept what it makes.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.events._signing import (
    DELIVERY_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
    signature_headers,
    verify,
)
from tests import needs

mlflow_delivery = needs.module("mlflow.webhooks.delivery")
mlflow_constants = needs.module("mlflow.webhooks.constants")

NOW = 1_790_000_000
secrets = st.text(min_size=1, max_size=40)
delivery_ids = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60
)
bodies = st.text(max_size=300)  # MLflow signs the JSON text; its UTF-8 bytes are the body


def test_headers_are_mlflows_names() -> None:
    assert SIGNATURE_HEADER == mlflow_constants.WEBHOOK_SIGNATURE_HEADER
    assert TIMESTAMP_HEADER == mlflow_constants.WEBHOOK_TIMESTAMP_HEADER
    assert DELIVERY_ID_HEADER == mlflow_constants.WEBHOOK_DELIVERY_ID_HEADER


@given(secret=secrets, delivery_id=delivery_ids, timestamp=st.integers(0, 2**40), text=bodies)
def test_sign_makes_what_mlflow_makes(
    secret: str, delivery_id: str, timestamp: int, text: str
) -> None:
    theirs = mlflow_delivery._generate_hmac_signature(secret, delivery_id, str(timestamp), text)
    assert sign(secret, delivery_id, timestamp, text.encode()) == theirs


@given(secret=secrets, delivery_id=delivery_ids, text=bodies)
def test_verify_accepts_what_mlflow_signs(secret: str, delivery_id: str, text: str) -> None:
    headers = {
        mlflow_constants.WEBHOOK_DELIVERY_ID_HEADER: delivery_id,
        mlflow_constants.WEBHOOK_TIMESTAMP_HEADER: str(NOW - 10),
        mlflow_constants.WEBHOOK_SIGNATURE_HEADER: mlflow_delivery._generate_hmac_signature(
            secret, delivery_id, str(NOW - 10), text
        ),
    }
    assert verify(secret, headers, text.encode(), now=NOW)


def _signed(body: bytes = b'{"a": 1}', secret: str = "s3cret", at: int = NOW) -> dict[str, str]:
    return signature_headers(secret, "d-1", at, body)


def test_signature_headers_carry_type_agent_id_and_time() -> None:
    headers = _signed()
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"] == "shamal-webhooks"
    assert headers[DELIVERY_ID_HEADER] == "d-1"
    assert headers[TIMESTAMP_HEADER] == str(NOW)
    assert headers[SIGNATURE_HEADER] == sign("s3cret", "d-1", NOW, b'{"a": 1}')


def test_no_secret_sends_unsigned_like_mlflow() -> None:
    headers = signature_headers("", "d-1", NOW, b"{}")
    assert SIGNATURE_HEADER not in headers
    assert not verify("", headers, b"{}", now=NOW)


def test_header_names_in_any_case() -> None:
    lowered = {key.lower(): value for key, value in _signed().items()}
    assert verify("s3cret", lowered, b'{"a": 1}', now=NOW)


@pytest.mark.parametrize(
    ("secret", "body", "now"),
    [
        ("other", b'{"a": 1}', NOW),  # wrong secret
        ("s3cret", b'{"a": 2}', NOW),  # body changed
        ("s3cret", b'{"a": 1} ', NOW),  # one byte more
        ("s3cret", b'{"a": 1}', NOW + 301),  # stale: a replay
        ("s3cret", b'{"a": 1}', NOW - 301),  # from the future
    ],
)
def test_verify_refuses(secret: str, body: bytes, now: int) -> None:
    assert not verify(secret, _signed(), body, now=now)


def test_verify_tolerance_edge() -> None:
    assert verify("s3cret", _signed(), b'{"a": 1}', now=NOW + 300)
    assert not verify("s3cret", _signed(), b'{"a": 1}', now=NOW + 300, tolerance_s=299)


@pytest.mark.parametrize(
    "change",
    [
        {TIMESTAMP_HEADER: None},
        {DELIVERY_ID_HEADER: None},
        {SIGNATURE_HEADER: None},
        {DELIVERY_ID_HEADER: "d-2"},  # the id is signed
        {TIMESTAMP_HEADER: f"+{NOW}"},
        {TIMESTAMP_HEADER: f" {NOW}"},
        {TIMESTAMP_HEADER: "1_790_000_000"},
        {TIMESTAMP_HEADER: "9" * 400},
        {SIGNATURE_HEADER: "v1,not base64!"},
        {SIGNATURE_HEADER: ""},
    ],
)
def test_verify_refuses_bad_headers(change: dict[str, str | None]) -> None:
    headers: dict[str, str] = {}
    for key, value in {**_signed(), **change}.items():
        if value is not None:
            headers[key] = value
    assert not verify("s3cret", headers, b'{"a": 1}', now=NOW)


def test_other_versions_ignored_and_rotation_list_accepted() -> None:
    headers = _signed()
    good = headers[SIGNATURE_HEADER]
    digest = good.split(",", 1)[1]
    assert not verify("s3cret", {**headers, SIGNATURE_HEADER: f"v2,{digest}"}, b'{"a": 1}', now=NOW)
    rotated = f"v1,{sign('old', 'd-1', NOW, b'x').split(',', 1)[1]} {good}"
    assert verify("s3cret", {**headers, SIGNATURE_HEADER: rotated}, b'{"a": 1}', now=NOW)


@pytest.mark.parametrize("delivery_id", ["", "a\r\nX-Injected: 1", "a b", "é", "x" * 201])
def test_delivery_id_fit_for_a_header(delivery_id: str) -> None:
    with pytest.raises(InvalidParameter):
        sign("s", delivery_id, NOW, b"{}")
    with pytest.raises(InvalidParameter):
        signature_headers("s", delivery_id, NOW, b"{}")


def test_sign_needs_a_secret_and_a_sane_time() -> None:
    with pytest.raises(InvalidParameter):
        sign("", "d", NOW, b"{}")
    with pytest.raises(InvalidParameter):
        sign("s", "d", -1, b"{}")
