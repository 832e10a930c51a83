"""The privacy core: policies (YAML and JSON, unknown keys refused), every transform on Arrow
batches, tokens per purpose, reversible tokens, erasure matching; and the keys of
shamal.security (HKDF per purpose, rotation that keeps old tokens revealable)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from shamal.artifacts import Keyring
from shamal.datasets._privacy import (
    PrivacyPolicy,
    Pseudonymizer,
    hmac_tokens,
    matching_rows,
    reveal,
    subject_hash,
    subject_tokens,
)
from shamal.errors import InvalidParameter, NotFound
from shamal.security import PseudonymKeys

POLICY = """
version: 1
columns:
  email: {action: hmac, purpose: crm}
  phone: {action: tokenize, purpose: support}
  name: drop
  born: {action: generalize, to: month}
  income: {action: generalize, width: 1000}
"""

BATCH = pa.record_batch(
    {
        "id": [1, 2, 3, 4],
        "email": ["a@x.ae", "b@x.ae", None, "a@x.ae"],
        "phone": ["+971 50 1", "+971 50 2", "+971 50 1", None],
        "name": ["Amal", "Badr", "Carim", "Dana"],
        "born": [dt.date(1990, 5, 17), dt.date(1985, 12, 1), None, dt.date(2001, 1, 31)],
        "income": [12_345, 999, -1, None],
    }
)


@pytest.fixture
def keys(tmp_path: Path) -> PseudonymKeys:
    path = tmp_path / "keys" / "pseudonyms.json"
    return PseudonymKeys(Keyring.load_or_create(path), path=path, load=Keyring.load)


def _pseudonymizer(keys: PseudonymKeys, policy: PrivacyPolicy) -> Pseudonymizer:
    chosen = {
        r.column: keys.active("hmac" if r.action == "hmac" else "siv", r.purpose or "")
        for r in policy.rules
        if r.keyed
    }
    return Pseudonymizer(policy, chosen)


def test_every_transform_on_a_batch(keys: PseudonymKeys) -> None:
    policy = PrivacyPolicy.from_text(POLICY)
    out = _pseudonymizer(keys, policy)(BATCH)
    assert out.schema.names == ["id", "email", "phone", "born", "income"]  # name dropped
    emails = out.column("email").to_pylist()
    assert emails[0] == emails[3] != emails[1]
    assert emails[2] is None
    assert all(e is None or e.startswith(f"{keys.active_id}:") for e in emails)
    assert all(e is None or len(e) == len(keys.active_id) + 25 for e in emails)
    phones = out.column("phone").to_pylist()
    assert phones[0] == phones[2] != phones[1]
    assert phones[3] is None
    assert "+971" not in "".join(p for p in phones if p)
    assert out.column("born").to_pylist() == [
        dt.date(1990, 5, 1),
        dt.date(1985, 12, 1),
        None,
        dt.date(2001, 1, 1),
    ]
    assert out.column("income").to_pylist() == [12_000, 0, -1000, None]
    assert out.column("income").type == pa.int64()
    recorded = _pseudonymizer(keys, policy).transformations()
    assert recorded[0] == {
        "column": "email",
        "action": "hmac",
        "purpose": "crm",
        "key": keys.active_id,
    }
    assert {"column": "name", "action": "drop"} in recorded


def test_generalize_timestamps_and_floats(keys: PseudonymKeys) -> None:
    policy = PrivacyPolicy.from_text(
        '{"columns": {"at": {"action": "generalize", "to": "year"},'
        ' "x": {"action": "generalize", "width": 0.5}}}'
    )
    batch = pa.record_batch(
        {
            "at": pa.array([dt.datetime(2024, 7, 3, 10, 11)], pa.timestamp("us", tz="UTC")),
            "x": [1.74],
        }
    )
    out = Pseudonymizer(policy, {})(batch)
    assert out.column("at").to_pylist()[0] == dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert out.column("x").to_pylist() == [1.5]
    with pytest.raises(InvalidParameter, match="needs dates or timestamps"):
        Pseudonymizer(policy, {})(pa.record_batch({"at": ["2024-07-03"], "x": [1.0]}))


def test_same_value_and_purpose_give_the_same_token_other_purposes_do_not(
    keys: PseudonymKeys,
) -> None:
    values = [b"a@x.ae", b"42"]
    crm = hmac_tokens(values, keys.active("hmac", "crm")).to_pylist()
    assert crm == hmac_tokens(values, keys.active("hmac", "crm")).to_pylist()
    fraud = hmac_tokens(values, keys.active("hmac", "fraud")).to_pylist()
    assert set(crm).isdisjoint(fraud)
    # A value is tokenized as its text: an integer column joins a text column.
    numbers = Pseudonymizer(
        PrivacyPolicy.from_text("columns: {id: {action: hmac, purpose: crm}}"),
        {"id": keys.active("hmac", "crm")},
    )(pa.record_batch({"id": [42]}))
    assert numbers.column("id").to_pylist() == [crm[1]]


def test_tokens_reveal_with_their_key_and_survive_rotation(keys: PseudonymKeys) -> None:
    old_key = keys.active("siv", "support")
    old = subject_tokens("+971 50 1", PrivacyPolicy.from_text(POLICY).rules[1], [old_key])[0]
    new_id = keys.rotate()
    assert keys.active_id == new_id != old_key.key_id
    new_key = keys.active("siv", "support")
    new = subject_tokens("+971 50 1", PrivacyPolicy.from_text(POLICY).rules[1], [new_key])[0]
    assert new != old
    every = {k.key_id: k for k in keys.every("siv", "support")}
    assert reveal([old, new, "junk", f"{new_id}:AAAA"], every) == [
        "+971 50 1",
        "+971 50 1",
        None,
        None,
    ]
    # Another purpose's keys reveal nothing.
    other = {k.key_id: k for k in keys.every("siv", "marketing")}
    assert reveal([old], other) == [None]
    # Another process reading the same file sees the rotation.
    path = keys._path
    assert path is not None
    again = PseudonymKeys(Keyring.load(path), path=path, load=Keyring.load)
    assert again.active_id == new_id
    assert again.by_id(old_key.key_id, "siv", "support").secret == old_key.secret
    with pytest.raises(NotFound):
        again.by_id("feedfacefeedface", "siv", "support")


def test_erasure_matching_and_subject_hash(keys: PseudonymKeys) -> None:
    rule = PrivacyPolicy.from_text(POLICY).rules[0]
    old = subject_tokens("a@x.ae", rule, keys.every("hmac", "crm"))
    keys.rotate()
    tokens = subject_tokens("a@x.ae", rule, keys.every("hmac", "crm"))
    assert old[0] in tokens
    assert len(tokens) == 2
    stored = pa.array([old[0], "zz", None, tokens[1]])
    assert matching_rows(stored, tokens).to_pylist() == [True, False, False, True]
    assert matching_rows(pa.array([42, 7]), ["42"]).to_pylist() == [True, False]
    key = keys.active("hmac", "shamal.erasure")
    assert subject_hash("a@x.ae", key) == subject_hash("a@x.ae", key)
    assert "a@x.ae" not in subject_hash("a@x.ae", key)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("columns: {email: {action: hmac, purpose: crm, salt: 1}}", "unknown key 'salt'"),
        ("version: 1\ncolumns: {a: drop}\nextra: 1", "unknown key 'extra'"),
        ("columns: {a: {action: shuffle}}", "'action' is one of"),
        ("columns: {a: {action: hmac}}", "needs a 'purpose'"),
        ("columns: {a: {action: hmac, purpose: shamal.erasure}}", "needs a 'purpose'"),
        ("columns: {a: {action: generalize}}", "takes 'to'"),
        ("columns: {a: {action: generalize, to: week}}", "'to' is one of"),
        ("columns: {a: {action: generalize, width: -3}}", "positive number"),
        ("columns: {}", "maps each personal column"),
        ("version: 2\ncolumns: {a: drop}", "'version' must be 1"),
        ("a: &x [1]\nb: *x", "aliases"),
        ("columns: [", "not valid YAML"),
        ("- 1", "a mapping"),
    ],
)
def test_malformed_policies_are_refused_with_the_key_named(text: str, message: str) -> None:
    with pytest.raises(InvalidParameter, match=message):
        PrivacyPolicy.from_text(text)


def test_a_policy_round_trips_and_a_source_must_hold_its_columns(keys: PseudonymKeys) -> None:
    policy = PrivacyPolicy.from_text(POLICY)
    assert PrivacyPolicy.from_text(policy.to_yaml()) == policy
    assert PrivacyPolicy.from_mapping(policy.to_json()) == policy
    assert policy.personal == ("email", "phone", "born", "income")
    # A headerless file's first row becomes its "names": refused, naming only the policy's.
    headerless = pa.record_batch({"a@x.ae": ["b@x.ae"], "Amal": ["Badr"]})
    with pytest.raises(InvalidParameter) as caught:
        _pseudonymizer(keys, policy)(headerless)
    assert "'email'" in str(caught.value)
    assert "a@x.ae" not in str(caught.value)
    assert "Amal" not in str(caught.value)


def test_tokens_are_rfc_2104_hmac_sha256(keys: PseudonymKeys) -> None:
    import base64
    import hmac

    key = keys.active("hmac", "crm")
    for value in (b"", b"a@x.ae", b"x" * 200):
        expected = base64.urlsafe_b64encode(hmac.digest(key.secret, value, "sha256")[:18])
        assert hmac_tokens([value], key)[0].as_py() == f"{key.key_id}:{expected.decode()}"


def test_mostly_distinct_and_repetitive_columns_give_the_same_tokens(
    keys: PseudonymKeys,
) -> None:
    key = keys.active("hmac", "crm")
    policy = PrivacyPolicy.from_text("columns: {e: {action: hmac, purpose: crm}}")
    distinct = [f"u{i}@x.ae" if i % 5 else None for i in range(5000)]  # hashed row by row
    repeated = [f"u{i % 3}@x.ae" if i % 5 else None for i in range(5000)]  # de-duplicated
    one = Pseudonymizer(policy, {"e": key})(pa.record_batch({"e": distinct})).column("e")
    two = Pseudonymizer(policy, {"e": key})(pa.record_batch({"e": repeated})).column("e")
    assert one.null_count == two.null_count == 1000
    assert one[1] == two[1]
    assert one[2] == two[2]
    assert one[4] != one[3]
    assert len(set(two.to_pylist())) == 4  # three tokens and null
