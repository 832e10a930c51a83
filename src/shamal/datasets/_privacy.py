"""Privacy policies and the transforms they make on Arrow batches, before any byte is stored.

A dataset's :class:`PrivacyPolicy` names its personal columns and what happens to each
during ingestion (YAML or JSON)::

    version: 1
    columns:
      email: {action: hmac, purpose: crm}          # keyed HMAC-SHA256 per purpose: joins work
      phone: {action: tokenize, purpose: support}  # AES-SIV: a privacy officer reveals it
      name: {action: drop}                         # never stored
      birth_date: {action: generalize, to: month}  # dates and timestamps: day, month, year
      income: {action: generalize, width: 1000}    # numbers: buckets of this width

Tokens read ``<key id>:<base64url>``: the key id names the ring secret that made the token
(see :class:`shamal.security.PseudonymKeys`), so rotation keeps old tokens revealable. A
value is tokenized as its text (an integer 42 and a string "42" give the same token: joins
across datasets whose types differ still work).

Pure: the keys come in as bytes (:class:`Keyed`); work is columnar (Arrow compute, one keyed
hash or encryption per *distinct* value of a batch, numpy for the token text).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped,unused-ignore]
import yaml  # type: ignore[import-untyped,unused-ignore]
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from shamal.errors import InvalidParameter

__all__ = [
    "ACTIONS",
    "MAX_POLICY_BYTES",
    "ColumnRule",
    "Keyed",
    "PrivacyPolicy",
    "Pseudonymizer",
    "hmac_tokens",
    "matching_rows",
    "reveal",
    "subject_hash",
    "subject_tokens",
    "tokenize",
]

Action = Literal["hmac", "tokenize", "drop", "generalize"]
ACTIONS: Final[tuple[str, ...]] = ("hmac", "tokenize", "drop", "generalize")
TRUNCATIONS: Final[tuple[str, ...]] = ("day", "month", "year")
MAX_POLICY_BYTES: Final = 64 * 1024
MAX_POLICY_COLUMNS: Final = 4096
MAX_NAME_CHARS: Final = 256
#: Bytes of HMAC-SHA256 a token keeps: 144 bits (24 base64 characters, no padding).
_HMAC_BYTES: Final = 18
_B64_CHARS: Final = 24
#: Rows looked at to tell whether de-duplicating a batch before hashing pays.
_SAMPLE: Final = 2048
_PURPOSE: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_RULE_KEYS: Final[dict[str, frozenset[str]]] = {
    "hmac": frozenset({"action", "purpose"}),
    "tokenize": frozenset({"action", "purpose"}),
    "drop": frozenset({"action"}),
    "generalize": frozenset({"action", "to", "width"}),
}


class Keyed(Protocol):
    """A derived key (:class:`shamal.security.PurposeKey` is one)."""

    @property
    def key_id(self) -> str: ...

    @property
    def secret(self) -> bytes: ...


# ---------------------------------------------------------------------- the policy


@dataclass(frozen=True, slots=True)
class ColumnRule:
    """What happens to one personal column: ``purpose`` for hmac and tokenize, ``to`` or
    ``width`` for generalize."""

    column: str
    action: Action
    purpose: str | None = None
    to: str | None = None
    width: int | float | None = None

    @property
    def stored(self) -> bool:
        """Whether the column is stored at all (all but ``drop``)."""
        return self.action != "drop"

    @property
    def keyed(self) -> bool:
        return self.action in ("hmac", "tokenize")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action}
        for key in ("purpose", "to", "width"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def _column_name(column: Any) -> str:
    if not isinstance(column, str) or not column or len(column) > MAX_NAME_CHARS:
        raise InvalidParameter(f"privacy: a column name is 1 to {MAX_NAME_CHARS} characters")
    if "\0" in column:
        raise InvalidParameter("privacy: a column name holds no NUL character")
    return column


def _rule(name: Any, raw: Any) -> ColumnRule:
    column = _column_name(name)
    where = f"privacy: columns.{column}"
    if isinstance(raw, str):
        raw = {"action": raw}
    if not isinstance(raw, Mapping):
        raise InvalidParameter(f"{where}: give a mapping with an 'action'")
    action = raw.get("action")
    if action not in _RULE_KEYS:
        raise InvalidParameter(f"{where}: 'action' is one of {', '.join(ACTIONS)}")
    unknown = sorted(str(k) for k in raw if k not in _RULE_KEYS[action])
    if unknown:
        allowed = ", ".join(sorted(_RULE_KEYS[action]))
        raise InvalidParameter(f"{where}: unknown key {unknown[0]!r}; {action} takes {allowed}")
    if action in ("hmac", "tokenize"):
        purpose = raw.get("purpose")
        if (
            not isinstance(purpose, str)
            or not _PURPOSE.match(purpose)
            or purpose.startswith("shamal.")
        ):
            raise InvalidParameter(
                f"{where}: {action} needs a 'purpose': 1 to 64 lowercase letters, digits, "
                "'.', '_' or '-', not starting 'shamal.' (tokens of two purposes cannot be "
                "linked)"
            )
        return ColumnRule(column, action, purpose=purpose)
    if action == "drop":
        return ColumnRule(column, "drop")
    return _generalize(column, where, raw.get("to"), raw.get("width"))


def _purpose(where: str, action: str, purpose: Any) -> str:
    if not isinstance(purpose, str) or not _PURPOSE.match(purpose) or purpose.startswith("shamal."):
        raise InvalidParameter(
            f"{where}: {action} needs a 'purpose': 1 to 64 lowercase letters, digits, "
            "'.', '_' or '-', not starting 'shamal.' (tokens of two purposes cannot be "
            "linked)"
        )
    return purpose


def _generalize(column: str, where: str, to: Any, width: Any) -> ColumnRule:
    if (to is None) == (width is None):
        raise InvalidParameter(
            f"{where}: generalize takes 'to' (day, month or year, for dates) or 'width' "
            "(a positive number, for numeric buckets)"
        )
    if to is not None:
        if to not in TRUNCATIONS:
            raise InvalidParameter(f"{where}: 'to' is one of {', '.join(TRUNCATIONS)}")
        return ColumnRule(column, "generalize", to=to)
    numeric = isinstance(width, int | float) and not isinstance(width, bool)
    if not numeric or not (0 < width < 1e18) or width != width:
        raise InvalidParameter(f"{where}: 'width' is a positive number")
    return ColumnRule(column, "generalize", width=width)


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """The safe loader, refusing aliases (they let a small file expand without bound)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise InvalidParameter("a privacy policy may not use YAML aliases")
        return super().compose_node(parent, index)


def _parse(data: bytes) -> Any:
    try:
        # A SafeLoader (no object construction) that also refuses aliases; JSON is YAML.
        return yaml.load(data.decode("utf-8"), Loader=_Loader)  # nosec B506
    except UnicodeDecodeError:
        raise InvalidParameter("a privacy policy must be UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidParameter(f"a privacy policy is not valid YAML or JSON{where}") from None


@dataclass(frozen=True, slots=True)
class PrivacyPolicy:
    """The personal columns of a dataset and what ingestion does to each."""

    rules: tuple[ColumnRule, ...]

    @classmethod
    def from_text(cls, text: str | bytes) -> PrivacyPolicy:
        """A policy from YAML or JSON text (the module's docstring shows the format).

        Raises:
            InvalidParameter: too large, not YAML/JSON, an unknown key (named), a wrong
                action or parameter.
        """
        data = text.encode("utf-8") if isinstance(text, str) else text
        if len(data) > MAX_POLICY_BYTES:
            raise InvalidParameter(f"a privacy policy holds at most {MAX_POLICY_BYTES} bytes")
        return cls.from_mapping(_parse(data))

    @classmethod
    def from_mapping(cls, raw: Any) -> PrivacyPolicy:
        if not isinstance(raw, Mapping):
            raise InvalidParameter("a privacy policy is a mapping with 'version' and 'columns'")
        unknown = sorted(str(key) for key in raw if key not in ("version", "columns"))
        if unknown:
            raise InvalidParameter(
                f"privacy: unknown key {unknown[0]!r}; allowed: columns, version"
            )
        if raw.get("version", 1) != 1:
            raise InvalidParameter("privacy: 'version' must be 1")
        columns = raw.get("columns")
        if not isinstance(columns, Mapping) or not columns:
            raise InvalidParameter("privacy: 'columns' maps each personal column to its action")
        if len(columns) > MAX_POLICY_COLUMNS:
            raise InvalidParameter(f"privacy: at most {MAX_POLICY_COLUMNS} columns")
        return cls(tuple(_rule(name, rule) for name, rule in columns.items()))

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "columns": {r.column: r.to_json() for r in self.rules}}

    def to_yaml(self) -> str:
        return str(yaml.safe_dump(self.to_json(), sort_keys=False, allow_unicode=True))

    def rule(self, column: str) -> ColumnRule | None:
        for found in self.rules:
            if found.column == column:
                return found
        return None

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(r.column for r in self.rules)

    @property
    def personal(self) -> tuple[str, ...]:
        """The personal columns that are stored (transformed): profiles keep no value of
        theirs, validation samples redact them."""
        return tuple(r.column for r in self.rules if r.stored)

    @property
    def purposes(self) -> tuple[tuple[str, str], ...]:
        """(action, purpose) of every keyed rule."""
        return tuple((r.action, r.purpose) for r in self.rules if r.keyed and r.purpose)


# ---------------------------------------------------------------------- transforms


def _as_text(array: pa.Array, column: str) -> pa.Array:
    """The values as UTF-8 text (binary stays bytes): what a keyed transform reads."""
    data_type = array.type
    if pa.types.is_dictionary(data_type):
        array = array.dictionary_decode()
        data_type = array.type
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return array.cast(pa.binary())
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return array.cast(pa.string())
    if pa.types.is_nested(data_type):
        raise InvalidParameter(
            f"column {column!r} is {data_type}: hmac and tokenize take columns of single values"
        )
    try:
        return pc.cast(array, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise InvalidParameter(
            f"column {column!r} is {data_type}, which cannot be read as text to tokenize"
        ) from None


def _fixed_width_strings(prefix: bytes, bodies: bytes, count: int, width: int) -> pa.Array:
    """``count`` strings of ``prefix`` + ``width`` bytes of ``bodies`` each, built in numpy."""
    size = len(prefix) + width
    out = np.empty((count, size), dtype=np.uint8)
    out[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    out[:, len(prefix) :] = np.frombuffer(bodies, dtype=np.uint8).reshape(count, width)
    offsets = np.arange(count + 1, dtype=np.int64) * size
    return pa.LargeStringArray.from_buffers(
        count, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())
    ).cast(pa.string())


def _per_distinct(
    array: pa.Array, column: str, make: Callable[[list[bytes]], pa.Array]
) -> pa.Array:
    """``make`` over the distinct values of ``array`` (as text), then spread back to every
    row; nulls stay null. A column whose first rows are mostly distinct (an e-mail address,
    an id) is not de-duplicated first: that would cost more than it saves."""
    text = _as_text(array, column)
    sample = text.slice(0, _SAMPLE).drop_null().to_pylist()
    if len(sample) >= _SAMPLE // 2 and len(set(sample)) > len(sample) // 2:
        values = text.cast(pa.binary()).fill_null(b"").to_pylist()
        made = make(values) if values else pa.array([], pa.string())
        if not text.null_count:
            return made
        return pc.if_else(text.is_null(), pa.scalar(None, pa.string()), made)
    encoded = pc.dictionary_encode(text)
    distinct = encoded.dictionary.cast(pa.binary()).to_pylist()
    made = make(distinct) if distinct else pa.array([], pa.string())
    return pc.take(made, encoded.indices)


def _hmac_sha256(secret: bytes, values: Sequence[bytes]) -> Iterator[bytes]:
    """HMAC-SHA256 (RFC 2104) of each value, from the keyed inner and outer states copied
    per value: the same digests as :func:`hmac.digest`, at less than half its cost per call
    (which sets up a new OpenSSL MAC context every time)."""
    padded = secret.ljust(64, b"\0") if len(secret) <= 64 else hashlib.sha256(secret).digest()
    padded = padded.ljust(64, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))
    for value in values:
        step = inner.copy()
        step.update(value)
        done = outer.copy()
        done.update(step.digest())
        yield done.digest()


def hmac_tokens(values: Sequence[bytes], key: Keyed) -> pa.Array:
    """The HMAC-SHA256 tokens of ``values`` under ``key`` (one string each)."""
    digests = b"".join(d[:_HMAC_BYTES] for d in _hmac_sha256(key.secret, values))
    bodies = base64.urlsafe_b64encode(digests)
    return _fixed_width_strings(f"{key.key_id}:".encode(), bodies, len(values), _B64_CHARS)


def tokenize(values: Sequence[bytes], key: Keyed) -> pa.Array:
    """Deterministic AES-SIV tokens of ``values`` under ``key`` (reversible by
    :func:`reveal`)."""
    cipher = AESSIV(key.secret)
    prefix = f"{key.key_id}:"
    return pa.array(
        [
            prefix + base64.urlsafe_b64encode(cipher.encrypt(v, None)).decode().rstrip("=")
            for v in values
        ],
        pa.string(),
    )


def reveal(tokens: Sequence[str], keys: Mapping[str, Keyed]) -> list[str | None]:
    """The values behind tokenize tokens; None for a token that is not one of ``keys``'
    (malformed, another purpose's, an unknown key)."""
    out: list[str | None] = []
    ciphers = {key_id: AESSIV(key.secret) for key_id, key in keys.items()}
    for token in tokens:
        key_id, _, body = token.partition(":") if isinstance(token, str) else ("", "", "")
        cipher = ciphers.get(key_id)
        try:
            if cipher is None or not body:
                raise ValueError
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            out.append(cipher.decrypt(raw, None).decode("utf-8"))
        except (ValueError, InvalidTag, binascii.Error):
            out.append(None)
    return out


def _truncate(array: pa.Array, column: str, to: str) -> pa.Array:
    if not (pa.types.is_temporal(array.type) and not pa.types.is_time(array.type)):
        raise InvalidParameter(
            f"column {column!r} is {array.type}: generalize 'to: {to}' needs dates or "
            "timestamps (give ISO dates in the source)"
        )
    return pc.floor_temporal(array, unit=to)


def _buckets(array: pa.Array, column: str, width: float) -> pa.Array:
    data_type = array.type
    if pa.types.is_integer(data_type) and float(width).is_integer():
        values = array.fill_null(0).to_numpy(zero_copy_only=False)
        floored = np.floor_divide(values, int(width)) * int(width)
        return pa.array(floored, type=data_type, mask=array.is_null().to_numpy(False))
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type):
        as_float = pc.cast(array, pa.float64())
        # A fractional width over integers gives floating-point buckets.
        return pc.multiply(pc.floor(pc.divide(as_float, width)), width)
    raise InvalidParameter(
        f"column {column!r} is {data_type}: generalize 'width' needs a numeric column"
    )


class Pseudonymizer:
    """Applies a policy to each batch on its way to storage (a ``BatchHook``).

    Args:
        policy: the dataset's policy.
        keys: the active key of each keyed column (hmac, tokenize), by column name.

    The first batch's schema must hold every column the policy names (a source whose
    header is missing or spelled otherwise would otherwise store raw values); the error
    names the policy's columns, never the source's (a headerless file's first row would be
    its "names").
    """

    def __init__(self, policy: PrivacyPolicy, keys: Mapping[str, Keyed]) -> None:
        missing_keys = [r.column for r in policy.rules if r.keyed and r.column not in keys]
        if missing_keys:
            raise InvalidParameter(f"no key for the keyed columns {', '.join(missing_keys)}")
        self._policy = policy
        self._keys = dict(keys)
        self._checked = False

    def transformations(self) -> list[dict[str, Any]]:
        """What the policy did, as a version records it (the key ids, never keys)."""
        done = []
        for rule in self._policy.rules:
            entry = {"column": rule.column, **rule.to_json()}
            if rule.keyed:
                entry["key"] = self._keys[rule.column].key_id
            done.append(entry)
        return done

    def _check(self, schema: pa.Schema) -> None:
        missing = [c for c in self._policy.columns if schema.get_field_index(c) < 0]
        if missing:
            raise InvalidParameter(
                "the source lacks columns the dataset's privacy policy names: "
                f"{', '.join(repr(c) for c in missing[:20])}; check the source's header "
                "(the policy's names match exactly)"
            )
        self._checked = True

    def _transformed(self, rule: ColumnRule, array: pa.Array) -> pa.Array:
        if rule.action == "hmac":
            key = self._keys[rule.column]
            return _per_distinct(array, rule.column, lambda v: hmac_tokens(v, key))
        if rule.action == "tokenize":
            key = self._keys[rule.column]
            return _per_distinct(array, rule.column, lambda v: tokenize(v, key))
        if rule.to is not None:
            return _truncate(array, rule.column, rule.to)
        assert rule.width is not None
        return _buckets(array, rule.column, float(rule.width))

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if not self._checked:
            self._check(batch.schema)
        arrays, fields = [], []
        for field, array in zip(batch.schema, batch.columns, strict=True):
            rule = self._policy.rule(field.name)
            if rule is None:
                arrays.append(array)
                fields.append(field)
            elif rule.stored:
                done = self._transformed(rule, array)
                arrays.append(done)
                fields.append(pa.field(field.name, done.type, nullable=field.nullable))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


# ---------------------------------------------------------------------- erasure


def subject_tokens(subject: str, rule: ColumnRule, keys: Sequence[Keyed]) -> list[str]:
    """The tokens ``subject`` has in a column under ``rule``, under each of ``keys`` (every
    secret of the ring: versions written before a rotation hold older tokens)."""
    value = [subject.encode("utf-8")]
    make = hmac_tokens if rule.action == "hmac" else tokenize
    return [str(make(value, key)[0].as_py()) for key in keys]


def matching_rows(array: pa.Array, candidates: Sequence[str]) -> pa.Array:
    """A boolean mask of the rows whose value, as text, is one of ``candidates``."""
    if pa.types.is_nested(array.type) or not len(array):
        return pa.array(np.zeros(len(array), dtype=bool), pa.bool_())
    text = _as_text(array, "")
    if pa.types.is_binary(text.type):
        wanted = pa.array([c.encode("utf-8") for c in candidates], pa.binary())
    else:
        wanted = pa.array(list(candidates), pa.string())
    return pc.fill_null(pc.is_in(text, value_set=wanted), False)


def subject_hash(subject: str, key: Keyed) -> str:
    """A keyed hash of an erased subject (what the erasure record keeps), ``<key id>:<hex>``:
    the same subject gives the same hash under the same key (so a privacy officer can tell
    whether a person was erased), and without the key it tells nothing."""
    digest = hmac.new(key.secret, subject.encode("utf-8"), "sha256").hexdigest()
    return f"{key.key_id}:{digest}"
