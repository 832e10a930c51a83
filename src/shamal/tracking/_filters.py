"""The MLflow search grammar: filters, ``order_by`` items and page tokens, parsed by hand.

Pure code: no SQL, no I/O. A filter becomes a list of :class:`Comparison` (an AND of
clauses), an ``order_by`` list a list of :class:`OrderBy`; the compilers in
``tracking._search`` and ``registry._search`` turn them into SQLAlchemy expressions
with bound parameters. What each searchable thing allows is a :class:`Grammar`
(``RUNS``, ``EXPERIMENTS``, ``REGISTERED_MODELS``, ``MODEL_VERSIONS``,
``LOGGED_MODELS``, ``TRACES``): a whitelist of (entity, key, comparator, value type).

Grammar (keywords and comparators are case-insensitive)::

    filter     := clause ( AND clause )*          -- no OR, NOT, parentheses grouping
    clause     := identifier comparator value | identifier IS [NOT] NULL
    identifier := [entity "."] key                 -- no entity = attribute
    key        := bare | "double-quoted" | `backticked`
    value      := 'string' | "string" | number | "(" item ("," item)* ")"   -- lists: IN / NOT IN
    order_by   := identifier [ASC | DESC]          -- logged models: objects, see
                                                   -- parse_order_by_objects

Bare keys are ASCII letters, digits and ``_``, optionally dot-separated after an
entity (``metrics.a.b`` has the key ``a.b``); anything else needs quotes. Inside a
quoted string or key the quote is written twice (``'it''s'``) or backslash-escaped
(``'it\\'s'``), and ``\\\\`` is one backslash; every other backslash stays as
written, so ``LIKE '100\\%'`` reaches the pattern matcher as an escaped ``%``.
Attribute and dataset keys are matched case-insensitively and normalized to their
canonical spelling (``"run name"`` -> ``run_name``, ``created`` -> ``start_time``).

Every error is :class:`~shamal.errors.InvalidParameter` (HTTP 400
``INVALID_PARAMETER_VALUE``) with a short fixed message and a position, never an
echo of the input.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from shamal.errors import InvalidParameter

__all__ = [
    "EXPERIMENTS",
    "LOGGED_MODELS",
    "MODEL_VERSIONS",
    "REGISTERED_MODELS",
    "RUNS",
    "TRACES",
    "Comparison",
    "DatasetFilter",
    "Entity",
    "Grammar",
    "Op",
    "OrderBy",
    "Rule",
    "decode_page_token",
    "encode_page_token",
    "parse_dataset_filters",
    "parse_filter",
    "parse_order_by",
    "parse_order_by_objects",
]

logger = logging.getLogger(__name__)

Entity = Literal["metric", "param", "tag", "attribute", "dataset", "metadata", "span"]
Op = Literal[
    "=", "!=", ">", ">=", "<", "<=", "LIKE", "ILIKE", "IN", "NOT IN", "IS NULL", "IS NOT NULL"
]
#: "id": a quoted string holding a decimal integer (experiment ids), kept in canonical form.
ValueKind = Literal["number", "string", "id"]

MAX_FILTER_LENGTH: Final = 20_000
MAX_CLAUSES: Final = 100
MAX_IN_ITEMS: Final = 1_000
MAX_STRING_LENGTH: Final = 6_000
MAX_KEY_LENGTH: Final = 250
MAX_ORDER_BY_ITEMS: Final = 20
MAX_ORDER_BY_ITEM_LENGTH: Final = 1_000
MAX_DATASET_FIELD_LENGTH: Final = 500
MAX_DATASET_FILTERS: Final = 100
MAX_PAGE_OFFSET: Final = 2**31 - 1
MAX_PAGE_TOKEN_LENGTH: Final = 200

NUMERIC_OPS: Final[frozenset[Op]] = frozenset({"=", "!=", ">", ">=", "<", "<="})
STRING_OPS: Final[frozenset[Op]] = frozenset({"=", "!=", "LIKE", "ILIKE"})
LIST_OPS: Final[frozenset[Op]] = frozenset({"IN", "NOT IN"})
#: Whether the thing has the key at all (tags, params): no value follows.
NULL_OPS: Final[frozenset[Op]] = frozenset({"IS NULL", "IS NOT NULL"})
MAX_ID_DIGITS: Final = 18

_ENTITIES: Final[Mapping[str, Entity]] = MappingProxyType(
    {
        "metric": "metric",
        "metrics": "metric",
        "param": "param",
        "params": "param",
        "parameter": "param",
        "parameters": "param",
        "tag": "tag",
        "tags": "tag",
        "attribute": "attribute",
        "attributes": "attribute",
        "attr": "attribute",
        "run": "attribute",
        "dataset": "dataset",
        "datasets": "dataset",
        # A trace's metadata and its spans: only the TRACES grammar has keys for them.
        "metadata": "metadata",
        "request_metadata": "metadata",
        "span": "span",
    }
)
_SYMBOLS: Final[tuple[Op, ...]] = ("!=", ">=", "<=", "=", ">", "<")
_WORD_OPS: Final[Mapping[str, Op]] = MappingProxyType(
    {"LIKE": "LIKE", "ILIKE": "ILIKE", "IN": "IN"}
)
_SPACE: Final = " \t\r\n"


@dataclass(frozen=True, slots=True)
class Comparison:
    """One clause of a filter: ``<entity>.<key> <op> <value>``.

    ``value`` is a float for numeric comparisons, a str for string comparisons and a
    tuple of str for ``IN`` / ``NOT IN`` (integers in canonical decimal form for a
    numeric key such as ``version_number`` and for ids), the empty tuple for
    ``IS NULL`` / ``IS NOT NULL``.
    """

    entity: Entity
    key: str
    op: Op
    value: str | float | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OrderBy:
    """One ``order_by`` item.

    ``dataset_name`` and ``dataset_digest`` narrow a logged model's metric to the points
    logged against that dataset (None: every point); other searches leave them None.
    """

    entity: Entity
    key: str
    ascending: bool
    dataset_name: str | None = None
    dataset_digest: str | None = None


@dataclass(frozen=True, slots=True)
class DatasetFilter:
    """One item of a logged-model search's ``datasets``: metrics logged against this dataset.

    ``digest`` None means any digest of the named dataset.
    """

    name: str
    digest: str | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """The comparators and the value type allowed for one key."""

    kind: ValueKind
    ops: frozenset[Op]


@dataclass(frozen=True, slots=True, eq=False)
class Grammar:
    """What one searchable thing allows.

    Attributes:
        name: the searched thing, for log lines.
        any_key: entities whose keys are free (metrics, params, tags) and their rule.
        keys: rules of the fixed keys, by (entity, canonical key).
        aliases: other spellings of attribute keys (lower-case) -> canonical key.
        order_any_key: entities whose free keys may be sorted on.
        order_keys: attribute keys that may be sorted on.
        lowercase_lists: attribute keys (ids) whose ``IN`` lists drop items with upper case.
        quoted_integers: numeric attribute keys that also take an integer written as a
            quoted string (``version_number = '2'``), as a stock server does.
        integer_text: string attribute keys whose values are integers compared as text (a
            logged model's ``experiment_id``): they also take an unquoted number, and
            ``=``, ``!=``, ``IN`` and ``NOT IN`` compare a decimal integer in canonical
            form (``'06'`` -> ``'6'``), as a stock server matches them; ``LIKE`` and
            ``ILIKE`` patterns stay as written.
        prefixes: entity prefixes only this grammar knows (lower-case) -> entity
            (``trace.status`` is ``attribute.status`` for traces, and unknown to runs).
    """

    name: str
    any_key: Mapping[Entity, Rule]
    keys: Mapping[tuple[Entity, str], Rule]
    aliases: Mapping[str, str]
    order_any_key: frozenset[Entity]
    order_keys: frozenset[str]
    lowercase_lists: frozenset[str] = frozenset()
    quoted_integers: frozenset[str] = frozenset()
    integer_text: frozenset[str] = frozenset()
    prefixes: Mapping[str, Entity] = dataclasses.field(default_factory=lambda: MappingProxyType({}))


def _grammar(
    name: str,
    any_key: dict[Entity, Rule],
    keys: dict[tuple[Entity, str], Rule],
    aliases: dict[str, str],
    order_any_key: set[Entity],
    order_keys: set[str],
    lowercase_lists: set[str] | None = None,
    quoted_integers: set[str] | None = None,
) -> Grammar:
    return Grammar(
        name=name,
        any_key=MappingProxyType(any_key),
        keys=MappingProxyType(keys),
        aliases=MappingProxyType(aliases),
        order_any_key=frozenset(order_any_key),
        order_keys=frozenset(order_keys),
        lowercase_lists=frozenset(lowercase_lists or ()),
        quoted_integers=frozenset(quoted_integers or ()),
    )


_NUMBER: Final = Rule("number", NUMERIC_OPS)
_STRING: Final = Rule("string", STRING_OPS)
_STRING_OR_LIST: Final = Rule("string", STRING_OPS | LIST_OPS)
_STRING_OR_NULL: Final = Rule("string", STRING_OPS | NULL_OPS)

RUNS: Final = _grammar(
    "runs",
    {"metric": _NUMBER, "param": _STRING_OR_NULL, "tag": _STRING_OR_NULL},
    {
        ("attribute", "run_id"): _STRING_OR_LIST,
        ("attribute", "run_name"): _STRING,
        ("attribute", "status"): _STRING,
        ("attribute", "user_id"): _STRING,
        ("attribute", "artifact_uri"): _STRING,
        ("attribute", "start_time"): _NUMBER,
        ("attribute", "end_time"): _NUMBER,
        ("dataset", "name"): _STRING_OR_LIST,
        ("dataset", "digest"): _STRING_OR_LIST,
        ("dataset", "context"): _STRING_OR_LIST,
    },
    {"run name": "run_name", "created": "start_time"},
    {"metric", "param", "tag"},
    {"start_time", "end_time", "run_name", "run_id", "status", "user_id", "artifact_uri"},
    {"run_id"},
)
EXPERIMENTS: Final = _grammar(
    "experiments",
    {"tag": _STRING_OR_NULL},
    {
        ("attribute", "experiment_id"): Rule("id", frozenset({"=", "!=", "IN", "NOT IN"})),
        ("attribute", "name"): _STRING,
        ("attribute", "creation_time"): _NUMBER,
        ("attribute", "last_update_time"): _NUMBER,
    },
    {},
    set(),
    {"name", "experiment_id", "creation_time", "last_update_time"},
)
REGISTERED_MODELS: Final = _grammar(
    "registered_models",
    {"tag": _STRING},
    {("attribute", "name"): _STRING_OR_LIST},
    {"timestamp": "last_updated_timestamp"},
    set(),
    {"name", "creation_timestamp", "last_updated_timestamp"},
)
MODEL_VERSIONS: Final = _grammar(
    "model_versions",
    {"tag": _STRING},
    {
        ("attribute", "name"): _STRING_OR_LIST,
        ("attribute", "version_number"): Rule("number", NUMERIC_OPS | {"IN"}),
        ("attribute", "run_id"): _STRING_OR_LIST,
        ("attribute", "source_path"): _STRING,
    },
    {},
    set(),
    {"name", "version_number", "creation_timestamp", "last_updated_timestamp"},
    {"run_id"},
    {"version_number"},
)
LOGGED_MODELS: Final = dataclasses.replace(
    _grammar(
        "logged_models",
        {"metric": _NUMBER, "param": _STRING_OR_LIST, "tag": _STRING_OR_LIST},
        {
            ("attribute", "name"): _STRING_OR_LIST,
            ("attribute", "model_id"): _STRING_OR_LIST,
            ("attribute", "experiment_id"): _STRING_OR_LIST,
            ("attribute", "lifecycle_stage"): _STRING_OR_LIST,
            ("attribute", "model_type"): _STRING_OR_LIST,
            ("attribute", "status"): _STRING_OR_LIST,
            ("attribute", "source_run_id"): _STRING_OR_LIST,
            ("attribute", "status_message"): _STRING_OR_LIST,
            ("attribute", "artifact_location"): _STRING_OR_LIST,
            ("attribute", "creation_timestamp"): _NUMBER,
            ("attribute", "last_updated_timestamp"): _NUMBER,
        },
        {
            "creation_time": "creation_timestamp",
            "creation_timestamp_ms": "creation_timestamp",
            "last_updated_timestamp_ms": "last_updated_timestamp",
        },
        {"metric"},
        {
            "name",
            "model_id",
            "experiment_id",
            "creation_timestamp",
            "last_updated_timestamp",
            "status",
            "model_type",
            "source_run_id",
            "status_message",
            "artifact_location",
            "lifecycle_stage",
        },  # fmt: skip
    ),
    integer_text=frozenset({"experiment_id"}),
)
#: MLflow 3's trace search. ``name`` is the trace's ``mlflow.traceName`` tag and ``run_id``
#: its ``mlflow.sourceRun`` metadata (or a link made by ``link-to-run``), as on a stock
#: server; ``span.*`` matches a trace with at least one such span, and ``text`` one with a
#: span whose stored content matches the pattern.
TRACES: Final = dataclasses.replace(
    _grammar(
        "traces",
        {"tag": _STRING_OR_NULL, "metadata": _STRING_OR_NULL},
        {
            ("attribute", "request_id"): _STRING_OR_LIST,
            ("attribute", "client_request_id"): _STRING_OR_LIST,
            ("attribute", "status"): _STRING_OR_LIST,
            ("attribute", "name"): _STRING_OR_LIST,
            ("attribute", "run_id"): _STRING_OR_LIST,
            ("attribute", "timestamp_ms"): _NUMBER,
            ("attribute", "execution_time_ms"): _NUMBER,
            ("attribute", "end_time_ms"): _NUMBER,
            # Full text: a trace with a span whose content (name, attributes, events) matches.
            ("attribute", "text"): Rule("string", frozenset({"LIKE", "ILIKE"})),
            ("span", "name"): _STRING_OR_LIST,
            ("span", "type"): _STRING_OR_LIST,
            ("span", "status"): _STRING_OR_LIST,
        },
        {
            "trace_id": "request_id",
            "state": "status",
            "timestamp": "timestamp_ms",
            "request_time": "timestamp_ms",
            "execution_time": "execution_time_ms",
            "execution_duration": "execution_time_ms",
            "end_time": "end_time_ms",
        },
        set(),
        {
            "experiment_id",
            "timestamp_ms",
            "execution_time_ms",
            "end_time_ms",
            "status",
            "request_id",
            "client_request_id",
        },  # fmt: skip
    ),
    prefixes=MappingProxyType({"trace": "attribute"}),
)


def _error(what: str, message: str, pos: int | None = None) -> InvalidParameter:
    where = "" if pos is None else f" (at position {pos})"
    return InvalidParameter(f"Invalid {what}: {message}{where}.")


def _is_word_start(ch: str) -> bool:
    return ch == "_" or "a" <= ch <= "z" or "A" <= ch <= "Z"


def _is_word_char(ch: str) -> bool:
    return _is_word_start(ch) or "0" <= ch <= "9"


def _is_digit(ch: str) -> bool:
    return "0" <= ch <= "9"


def _unsafe_char(text: str, *, controls: bool) -> bool:
    """NUL and lone surrogates break the drivers; control characters are refused in keys."""
    for ch in text:
        if ch == "\x00" or "\ud800" <= ch <= "\udfff":
            return True
        if controls and unicodedata.category(ch) == "Cc":
            return True
    return False


class _Scanner:
    """A cursor over one filter or ``order_by`` item; reads one token at a time.

    The parser drives it: what a token is depends on where it stands (a double-quoted
    token is a key before the comparator and a string after it).
    """

    __slots__ = ("pos", "text", "what")

    def __init__(self, text: str, what: str) -> None:
        self.text = text
        self.what = what
        self.pos = 0

    def error(self, message: str) -> InvalidParameter:
        return _error(self.what, message, self.pos)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def at_end(self) -> bool:
        """Skip white space; True when nothing is left."""
        while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
            self.pos += 1
        return self.pos >= len(self.text)

    def word(self) -> str | None:
        """A bare word (letters, digits, ``_``; not starting with a digit), or None."""
        self.at_end()
        start = self.pos
        if not _is_word_start(self.peek()):
            return None
        while self.pos < len(self.text) and _is_word_char(self.text[self.pos]):
            self.pos += 1
        return self.text[start : self.pos]

    def quoted(self, limit: int, too_long: str) -> str:
        """The content of the quoted token at the cursor (the quote is the current char)."""
        text, quote = self.text, self.text[self.pos]
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(text):
                raise self.error("unterminated quoted text")
            ch = text[self.pos]
            nxt = text[self.pos + 1] if self.pos + 1 < len(text) else ""
            if ch == "\\" and nxt in (quote, "\\"):
                out.append(nxt)
                self.pos += 2
            elif ch == quote and nxt == quote:
                out.append(quote)
                self.pos += 2
            elif ch == quote:
                self.pos += 1
                return "".join(out)
            else:
                out.append(ch)
                self.pos += 1
            if len(out) > limit:
                raise self.error(too_long)

    def identifier(self, prefixes: Mapping[str, Entity] | None = None) -> tuple[Entity | None, str]:
        """``[entity "."] key``: the entity (None when absent) and the unquoted key.

        ``prefixes``: entity prefixes the searched thing knows beside the common ones.
        """
        self.at_end()
        if self.peek() in ('"', "`"):
            return None, self._key_token()
        first = self.word()
        if first is None:
            raise self.error("expected an identifier")
        if self.peek() != ".":
            return None, first
        entity = _ENTITIES.get(first.lower()) or (prefixes or {}).get(first.lower())
        if entity is None:
            raise self.error("unknown entity prefix")
        self.pos += 1
        if self.peek() in ('"', "`"):
            return entity, self._key_token()
        return entity, self._bare_key()

    def _key_token(self) -> str:
        start = self.pos
        key = self.quoted(MAX_KEY_LENGTH, "key too long")
        if not key or _unsafe_char(key, controls=True):
            self.pos = start
            raise self.error("empty key or control character in a key")
        return key

    def _bare_key(self) -> str:
        start = self.pos
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            after_word = self.pos > start and _is_word_char(self.text[self.pos - 1])
            if not (_is_word_char(ch) or (ch == "." and after_word)):
                break
            self.pos += 1
            if self.pos - start > MAX_KEY_LENGTH:
                raise self.error("key too long")
        key = self.text[start : self.pos]
        if not key or key.endswith("."):
            raise self.error("expected a key (quote keys with special characters)")
        return key

    def comparator(self) -> Op:
        self.at_end()
        for symbol in _SYMBOLS:
            if self.text.startswith(symbol, self.pos):
                self.pos += len(symbol)
                return symbol
        start = self.pos
        word = (self.word() or "").upper()
        if word in _WORD_OPS:
            return _WORD_OPS[word]
        if word == "NOT" and (self.word() or "").upper() == "IN":
            return "NOT IN"
        if word == "IS":
            after = (self.word() or "").upper()
            if after == "NULL":
                return "IS NULL"
            if after == "NOT" and (self.word() or "").upper() == "NULL":
                return "IS NOT NULL"
        self.pos = start
        raise self.error(
            "expected a comparator (=, !=, >, >=, <, <=, LIKE, ILIKE, IN, NOT IN, "
            "IS NULL, IS NOT NULL)"
        )

    def value(self) -> tuple[str, float | str | list[tuple[str, float | str]]]:
        """A literal: ("string", str), ("number", float) or ("list", items)."""
        self.at_end()
        ch = self.peek()
        if ch in ("'", '"'):
            return "string", self.quoted(MAX_STRING_LENGTH, "string literal too long")
        if ch == "(":
            return "list", self._items()
        if _is_digit(ch) or (ch != "" and ch in "+-."):
            return "number", self._number()
        raise self.error("expected a quoted string, a number or a list")

    def _items(self) -> list[tuple[str, float | str]]:
        self.pos += 1  # "("
        items: list[tuple[str, float | str]] = []
        while True:
            self.at_end()
            ch = self.peek()
            if ch in ("'", '"'):
                items.append(("string", self.quoted(MAX_STRING_LENGTH, "string literal too long")))
            elif _is_digit(ch) or (ch != "" and ch in "+-."):
                items.append(("number", self._number()))
            else:
                raise self.error("expected a quoted string or a number in the list")
            if len(items) > MAX_IN_ITEMS:
                raise self.error(f"more than {MAX_IN_ITEMS} items in a list")
            self.at_end()
            ch = self.peek()
            self.pos += 1
            if ch == ")":
                return items
            if ch != ",":
                self.pos -= 1
                raise self.error("expected ',' or ')' in the list")

    def _number(self) -> float:
        text, start = self.text, self.pos
        if self.peek() in ("+", "-"):
            self.pos += 1
        digits = self._digits()
        if self.peek() == ".":
            self.pos += 1
            digits += self._digits()
        if digits == 0:
            raise self.error("malformed number")
        if self.peek() in ("e", "E"):
            self.pos += 1
            if self.peek() in ("+", "-"):
                self.pos += 1
            if self._digits() == 0:
                raise self.error("malformed number")
        if self.pos < len(text) and text[self.pos] not in _SPACE + ",)":
            raise self.error("malformed number")
        number = float(text[start : self.pos])
        if not math.isfinite(number):
            raise self.error("number out of range")
        return number

    def _digits(self) -> int:
        start = self.pos
        while _is_digit(self.peek()):
            self.pos += 1
        return self.pos - start


def _resolve(entity: Entity | None, key: str, grammar: Grammar) -> tuple[Entity, str, Rule | None]:
    """Normalize the entity and key; the rule is None when the key is not filterable."""
    resolved: Entity = entity or "attribute"
    if resolved in grammar.any_key:
        return resolved, key, grammar.any_key[resolved]
    canonical = key.lower()
    if resolved == "attribute":
        canonical = grammar.aliases.get(canonical, canonical)
    return resolved, canonical, grammar.keys.get((resolved, canonical))


def _plain_string(scanner: _Scanner, text: str) -> str:
    if _unsafe_char(text, controls=False):
        raise scanner.error("NUL or invalid character in a string")
    return text


def _id(scanner: _Scanner, text: str) -> str:
    """An id written as a quoted decimal integer, in canonical form ('007' -> '7')."""
    if not text.isascii() or not text.isdigit() or len(text) > MAX_ID_DIGITS:
        raise scanner.error("ids are quoted decimal integers")
    return str(int(text))


def _list_value(
    scanner: _Scanner,
    rule: Rule,
    entity: Entity,
    key: str,
    items: list[tuple[str, float | str]],
    grammar: Grammar,
) -> tuple[str, ...]:
    if rule.kind == "id":
        if any(kind != "string" for kind, _ in items):
            raise scanner.error("ids are quoted decimal integers")
        return tuple(_id(scanner, str(item)) for _, item in items)
    if rule.kind == "number":
        return tuple(_integer_item(scanner, kind, item) for kind, item in items)
    return _string_list(scanner, entity, key, items, grammar)


def _integer_item(scanner: _Scanner, kind: str, item: float | str) -> str:
    """One item of a list for a number key: a whole number, or a quoted decimal integer
    of at most 18 digits, in canonical form."""
    if kind == "string":
        text = str(item).strip()
        if not text.isascii() or not text.isdigit() or len(text) > 18:
            raise scanner.error("list items must be integers for this key")
        return str(int(text))
    if not float(item).is_integer():
        raise scanner.error("list items must be integers for this key")
    return str(int(float(item)))


def _string_list(
    scanner: _Scanner,
    entity: Entity,
    key: str,
    items: list[tuple[str, float | str]],
    grammar: Grammar,
) -> tuple[str, ...]:
    """The items of a list for a string key (integer-as-text keys take numbers too)."""
    integer_text = _is_integer_text(grammar, entity, key)
    strings: list[str] = []
    for kind, item in items:
        if integer_text:
            strings.append(_integer_text(scanner, item))
            continue
        if kind != "string":
            raise scanner.error("list items must be quoted strings for this key")
        strings.append(_plain_string(scanner, str(item)))
    if key in grammar.lowercase_lists:
        # Ids are lower-case hex: an upper-case item can never match, drop it.
        strings = [s for s in strings if s == s.lower()]
    return tuple(strings)


def _integer_text(scanner: _Scanner, value: float | str) -> str:
    """An integer-as-text value: a whole number or a quoted decimal integer in canonical
    form; any other text as written (it matches no integer)."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    text = value.strip()
    if text.isascii() and text.isdigit() and len(text) <= MAX_ID_DIGITS:
        return str(int(text))
    return _plain_string(scanner, value)


def _integer_value(  # noqa: PLR0913  # one clause's parts, already parsed
    scanner: _Scanner,
    grammar: Grammar,
    clause: Comparison,
    rule: Rule,
    kind: str,
    raw: float | str,
    value_start: int,
) -> Comparison | None:
    """The clause with its value, for the keys that take integers written either way
    (``Grammar.quoted_integers``, ``Grammar.integer_text``); None for other keys."""
    if kind == "string" and rule.kind == "number" and clause.key in grammar.quoted_integers:
        text = str(raw).strip()
        if not text.isascii() or not text.isdigit() or len(text) > MAX_ID_DIGITS:
            scanner.pos = value_start
            raise scanner.error("expected an integer")
        return Comparison(clause.entity, clause.key, clause.op, float(int(text)))
    if _is_integer_text(grammar, clause.entity, clause.key) and clause.op not in ("LIKE", "ILIKE"):
        return Comparison(clause.entity, clause.key, clause.op, _integer_text(scanner, raw))
    return None


def _is_integer_text(grammar: Grammar, entity: Entity, key: str) -> bool:
    return entity == "attribute" and key in grammar.integer_text


def _clause(scanner: _Scanner, grammar: Grammar) -> Comparison:
    start = scanner.pos
    entity, key, rule = _resolve(*scanner.identifier(grammar.prefixes), grammar)
    if rule is None:
        scanner.pos = start
        raise scanner.error("unknown or unsupported key")
    scanner.at_end()
    op_start = scanner.pos
    op = scanner.comparator()
    if op not in rule.ops:
        scanner.pos = op_start
        raise scanner.error("comparator not supported for this key")
    if op in NULL_OPS:
        return Comparison(entity, key, op, ())
    value_start = scanner.pos
    kind, raw = scanner.value()
    if (op in LIST_OPS) != (kind == "list"):
        scanner.pos = value_start
        raise scanner.error("IN and NOT IN take a list, other comparators a single value")
    if isinstance(raw, list):
        return Comparison(entity, key, op, _list_value(scanner, rule, entity, key, raw, grammar))
    clause = Comparison(entity, key, op, ())
    lenient = _integer_value(scanner, grammar, clause, rule, kind, raw, value_start)
    if lenient is not None:
        return lenient
    if kind != ("string" if rule.kind == "id" else rule.kind):
        scanner.pos = value_start
        raise scanner.error(f"expected a {'number' if rule.kind == 'number' else 'quoted string'}")
    if isinstance(raw, float):
        return Comparison(entity, key, op, raw)
    if rule.kind == "id":
        return Comparison(entity, key, op, _id(scanner, raw))
    return Comparison(entity, key, op, _plain_string(scanner, raw))


def parse_filter(text: str | None, grammar: Grammar) -> list[Comparison]:
    """Parse a search filter into the clauses of its AND.

    Args:
        text: the filter as the caller sent it; None or white space only means no filter.
        grammar: what the searched thing allows (``RUNS``, ``EXPERIMENTS`` ...).

    Returns:
        The clauses, in order; ``[]`` for no filter.

    Raises:
        InvalidParameter: a syntax error, a key, comparator or value type the grammar
            does not allow, or a cap exceeded (length, clauses, list items, string or
            key length).
    """
    if text is None:
        return []
    if not isinstance(text, str) or len(text) > MAX_FILTER_LENGTH:
        raise _error("filter", f"longer than {MAX_FILTER_LENGTH} characters or not text")
    scanner = _Scanner(text, "filter")
    if scanner.at_end():
        return []
    try:
        return _clauses(scanner, grammar)
    except InvalidParameter as exc:
        logger.debug("%s filter refused: %s", grammar.name, exc.message)
        raise


def _clauses(scanner: _Scanner, grammar: Grammar) -> list[Comparison]:
    clauses: list[Comparison] = []
    while True:
        if len(clauses) == MAX_CLAUSES:
            raise scanner.error(f"more than {MAX_CLAUSES} clauses")
        clauses.append(_clause(scanner, grammar))
        if scanner.at_end():
            return clauses
        word = (scanner.word() or "").upper()
        if word != "AND":
            raise scanner.error(
                "clauses must be joined by AND (OR, NOT and grouping are unsupported)"
            )


def _sort_key(scanner: _Scanner, grammar: Grammar) -> tuple[Entity, str]:
    """The identifier at the cursor as a sort key the grammar allows, normalized."""
    entity, key = scanner.identifier(grammar.prefixes)
    resolved: Entity = entity or "attribute"
    if resolved == "attribute":
        key = grammar.aliases.get(key.lower(), key.lower())
        if key not in grammar.order_keys:
            raise _error("order_by", "unknown or unsupported sort key", 0)
    elif resolved not in grammar.order_any_key:
        raise _error("order_by", "unknown or unsupported sort key", 0)
    return resolved, key


def _order_item(item: str, grammar: Grammar) -> OrderBy:
    if not isinstance(item, str) or len(item) > MAX_ORDER_BY_ITEM_LENGTH:
        raise _error("order_by", "item too long or not text")
    scanner = _Scanner(item, "order_by")
    resolved, key = _sort_key(scanner, grammar)
    ascending = True
    if not scanner.at_end():
        direction = (scanner.word() or "").upper()
        if direction not in ("ASC", "DESC"):
            raise scanner.error("expected ASC or DESC after the sort key")
        ascending = direction == "ASC"
        if not scanner.at_end():
            raise scanner.error("unexpected text after the sort direction")
    return OrderBy(resolved, key, ascending)


def parse_order_by(items: Sequence[str] | None, grammar: Grammar) -> list[OrderBy]:
    """Parse ``order_by`` items, each ``<identifier> [ASC|DESC]`` (ASC by default).

    Raises:
        InvalidParameter: more than ``MAX_ORDER_BY_ITEMS`` items, an item that is not
            exactly one allowed identifier and an optional direction.
    """
    if not items:
        return []
    if isinstance(items, str) or len(items) > MAX_ORDER_BY_ITEMS:
        raise _error("order_by", f"give a list of at most {MAX_ORDER_BY_ITEMS} items")
    try:
        return [_order_item(item, grammar) for item in items]
    except InvalidParameter as exc:
        logger.debug("%s order_by refused: %s", grammar.name, exc.message)
        raise


def _dataset_field(item: Mapping[str, object], name: str, where: str = "order_by") -> str | None:
    """A dataset's name or digest in an order_by item or a datasets filter: None when
    absent or empty.

    Raises:
        ShamalError: not text, too long or with control characters (an error about ``where``).
    """
    value = item.get(name)
    if value is None or value == "":
        return None
    if (
        not isinstance(value, str)
        or len(value) > MAX_DATASET_FIELD_LENGTH
        or _unsafe_char(value, controls=True)
    ):
        raise _error(where, f"{name} must be text of at most {MAX_DATASET_FIELD_LENGTH} characters")
    return value


def _order_object(item: object, grammar: Grammar) -> OrderBy:
    if not isinstance(item, Mapping):
        raise _error("order_by", "each item must be an object with a field_name")
    field = item.get("field_name")
    if not isinstance(field, str) or not field or len(field) > MAX_ORDER_BY_ITEM_LENGTH:
        raise _error("order_by", "field_name must be a sort key")
    ascending = item.get("ascending", True)
    if not isinstance(ascending, bool):
        raise _error("order_by", "ascending must be true or false")
    scanner = _Scanner(field, "order_by")
    entity, key = _sort_key(scanner, grammar)
    if not scanner.at_end():
        raise scanner.error("field_name must be one sort key, without a direction")
    if entity != "metric":
        return OrderBy(entity, key, ascending)
    return OrderBy(
        entity,
        key,
        ascending,
        dataset_name=_dataset_field(item, "dataset_name"),
        dataset_digest=_dataset_field(item, "dataset_digest"),
    )


def parse_order_by_objects(items: Sequence[object] | None, grammar: Grammar) -> list[OrderBy]:
    """Parse ``order_by`` given as objects, the logged-model search's form::

        {"field_name": "metrics.acc", "ascending": false,
         "dataset_name": "eval", "dataset_digest": "3f2a"}

    ``field_name`` is one identifier (no direction), checked against the same whitelist
    as :func:`parse_order_by`; ``ascending`` defaults to true; the dataset fields, kept
    for metric keys only, are optional (absent or empty: any dataset).

    Raises:
        InvalidParameter: more than ``MAX_ORDER_BY_ITEMS`` items, an item that is not
            such an object, a sort key the grammar does not allow.
    """
    if not items:
        return []
    if isinstance(items, str | Mapping) or len(items) > MAX_ORDER_BY_ITEMS:
        raise _error("order_by", f"give a list of at most {MAX_ORDER_BY_ITEMS} items")
    try:
        return [_order_object(item, grammar) for item in items]
    except InvalidParameter as exc:
        logger.debug("%s order_by refused: %s", grammar.name, exc.message)
        raise


def _dataset_filter(item: object) -> DatasetFilter:
    name = _dataset_field(item, "dataset_name", "datasets") if isinstance(item, Mapping) else None
    if name is None or not isinstance(item, Mapping):
        # The stock server's words for the same refusal.
        raise InvalidParameter("`dataset_name` in the `datasets` clause must be specified.")
    return DatasetFilter(name, _dataset_field(item, "dataset_digest", "datasets"))


def parse_dataset_filters(items: object) -> list[DatasetFilter]:
    """Parse the ``datasets`` of a logged-model search, as the MLflow client sends them::

        [{"dataset_name": "eval", "dataset_digest": "3f2a"}, {"dataset_name": "test"}]

    ``dataset_name`` is required; ``dataset_digest`` is optional (absent or empty: any
    digest of that dataset). None or an empty list means no dataset filter.

    Raises:
        InvalidParameter: not a list, more than ``MAX_DATASET_FILTERS`` items, an item
            without a ``dataset_name``, a field that is not short text.
    """
    if items is None:
        return []
    if not isinstance(items, list) or len(items) > MAX_DATASET_FILTERS:
        raise _error("datasets", f"give a list of at most {MAX_DATASET_FILTERS} objects")
    return [_dataset_filter(item) for item in items]


def encode_page_token(offset: int) -> str:
    """An opaque token for the page starting at ``offset`` (base64 of ``{"offset": n}``)."""
    if not 0 <= offset <= MAX_PAGE_OFFSET:
        raise ValueError("page offset out of range")
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def decode_page_token(token: str | None) -> int:
    """The offset a token from :func:`encode_page_token` stands for; None or "" is 0.

    Raises:
        InvalidParameter: a token this server did not make (bad base64 or JSON, another
            shape, a negative or huge offset).
    """
    if token is None or token == "":
        return 0
    if not isinstance(token, str) or len(token) > MAX_PAGE_TOKEN_LENGTH:
        raise _error("page_token", "malformed token")
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        data = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeError):
        raise _error("page_token", "malformed token") from None
    offset = data.get("offset") if isinstance(data, dict) and len(data) == 1 else None
    if type(offset) is not int or not 0 <= offset <= MAX_PAGE_OFFSET:
        raise _error("page_token", "malformed token")
    return offset
