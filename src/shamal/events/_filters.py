"""Subscription filters: which events a webhook or a consumer wants. Pure: no I/O.

Grammar (keywords are case-blind; strings are single-quoted, ``''`` is a quote inside)::

    filter     := kinds [ "where" expr ]
    kinds      := "*" | KIND { "," KIND }
    expr       := conj { "or" conj }
    conj       := unary { "and" unary }
    unary      := "not" unary | "(" expr ")" | test
    test       := FIELD OP literal | FIELD "in" "(" literal { "," literal } ")"
    OP         := "=" | "!=" | "<" | "<=" | ">" | ">="
    literal    := STRING | NUMBER | "true" | "false" | "null"

``FIELD`` is ``kind``, ``subject``, ``team``, ``actor`` (the event's own) or a key of its
payload; a key the event lacks reads as ``null``. Examples::

    model_version_registered where name = 'churn'
    dataset_version_created where dataset = 'customers' and rows >= 1000
    job_finished where state in ('failed', 'lost')
    * where team = 'risk'

Evaluation is two-valued and typed, so ``not`` always inverts: ``=`` holds only between
values of one type (a string, a number, a boolean, null; ``1`` never equals ``true``);
``<``, ``<=``, ``>``, ``>=`` hold only between two numbers or two strings, else they are
false. A filter is parsed once into an AST and evaluated in Python, never turned into SQL.
Its text is capped at :data:`MAX_FILTER_LENGTH` characters and its nesting at
:data:`MAX_DEPTH`; anything else malformed is an :class:`~shamal.errors.InvalidParameter`
naming the place.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from shamal.errors import InvalidParameter
from shamal.events._entities import Event, EventKind

__all__ = [
    "MAX_DEPTH",
    "MAX_FILTER_LENGTH",
    "And",
    "Compare",
    "EventFilter",
    "In",
    "Node",
    "Not",
    "Or",
    "conjunction",
    "disjunction",
]

logger = logging.getLogger(__name__)

MAX_FILTER_LENGTH = 4096
#: Nesting of parentheses and ``not``: deeper filters are refused before recursion can bite.
MAX_DEPTH = 32
MAX_IN_VALUES = 100
MAX_FIELD_LENGTH = 64

Value = str | int | float | bool | None
Operator = Literal["=", "!=", "<", "<=", ">", ">="]
_OPERATORS: tuple[Operator, ...] = ("=", "!=", "<", "<=", ">", ">=")
_KEYWORDS = frozenset({"and", "or", "not", "in", "where", "true", "false", "null"})
_EVENT_FIELDS = frozenset({"kind", "subject", "team", "actor"})
_ALL_KINDS = frozenset(EventKind)

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<string>'(?:[^']|'')*')
  | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<op><=|>=|!=|=|<|>)
  | (?P<punct>[(),*])
  | (?P<name>[A-Za-z][A-Za-z0-9_]*)
    """,
    re.VERBOSE,
)


# ---------------------------------------------------------------------------------- AST
@dataclass(frozen=True, slots=True)
class Compare:
    """``field op value``."""

    field: str
    op: Operator
    value: Value


@dataclass(frozen=True, slots=True)
class In:
    """``field in (values...)``."""

    field: str
    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Not:
    item: Node


@dataclass(frozen=True, slots=True)
class And:
    """Two or more items, none of them an ``And`` (parsing flattens them)."""

    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    """Two or more items, none of them an ``Or`` (parsing flattens them)."""

    items: tuple[Node, ...]


Node = Compare | In | Not | And | Or


def conjunction(items: tuple[Node, ...]) -> Node:
    """``items`` joined by ``and``, flattened (what the parser builds)."""
    flat = tuple(x for item in items for x in (item.items if isinstance(item, And) else (item,)))
    return flat[0] if len(flat) == 1 else And(flat)


def disjunction(items: tuple[Node, ...]) -> Node:
    """``items`` joined by ``or``, flattened (what the parser builds)."""
    flat = tuple(x for item in items for x in (item.items if isinstance(item, Or) else (item,)))
    return flat[0] if len(flat) == 1 else Or(flat)


# ----------------------------------------------------------------------------- printing
def _literal(value: Value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _text(node: Node) -> str:
    if isinstance(node, Compare):
        return f"{node.field} {node.op} {_literal(node.value)}"
    if isinstance(node, In):
        return f"{node.field} in ({', '.join(_literal(v) for v in node.values)})"
    if isinstance(node, Not):
        inner = _text(node.item)
        return f"not ({inner})" if isinstance(node.item, And | Or) else f"not {inner}"
    if isinstance(node, And):
        return " and ".join(f"({_text(i)})" if isinstance(i, Or) else _text(i) for i in node.items)
    return " or ".join(_text(i) for i in node.items)


# ---------------------------------------------------------------------------- evaluation
def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def _equal(left: Any, right: Value) -> bool:
    kind = _kind_of(left)
    return kind != "other" and kind == _kind_of(right) and left == right


def _ordered(left: Any, op: Operator, right: Value) -> bool:
    kind = _kind_of(left)
    if kind not in ("number", "string") or kind != _kind_of(right):
        return False
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _field(event: Event, name: str) -> Any:
    if name == "kind":
        return event.kind.value
    if name in _EVENT_FIELDS:
        return getattr(event, name)
    return event.payload.get(name)


def _test_holds(node: Compare | In, event: Event) -> bool:
    value = _field(event, node.field)
    if isinstance(node, In):
        return any(_equal(value, v) for v in node.values)
    if node.op == "=":
        return _equal(value, node.value)
    if node.op == "!=":
        return not _equal(value, node.value)
    return _ordered(value, node.op, node.value)


def _holds(node: Node, event: Event) -> bool:
    if isinstance(node, Not):
        return not _holds(node.item, event)
    if isinstance(node, And):
        return all(_holds(i, event) for i in node.items)
    if isinstance(node, Or):
        return any(_holds(i, event) for i in node.items)
    return _test_holds(node, event)


# ------------------------------------------------------------------------------- parsing
@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # string, number, op, punct, name, end
    text: str
    at: int


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= 20 else text[:20] + "...")


def _tokens(text: str) -> Iterator[_Token]:
    at = 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            if text[at] == "'":
                raise InvalidParameter(f"bad filter: the string at character {at + 1} never ends")
            raise InvalidParameter(
                f"bad filter: unexpected {_excerpt(text[at])} at character {at + 1}"
            )
        kind = match.lastgroup or ""
        if kind != "ws":
            yield _Token(kind, match.group(), at)
        at = match.end()
    yield _Token("end", "", len(text))


class _Parser:
    def __init__(self, text: str) -> None:
        self._tokens = list(_tokens(text))
        self._i = 0

    # -- token helpers
    @property
    def _peek(self) -> _Token:
        return self._tokens[self._i]

    def _keyword(self, word: str) -> bool:
        token = self._peek
        if token.kind == "name" and token.text.lower() == word:
            self._i += 1
            return True
        return False

    def _punct(self, char: str) -> bool:
        token = self._peek
        if token.kind == "punct" and token.text == char:
            self._i += 1
            return True
        return False

    def _fail(self, expected: str) -> InvalidParameter:
        token = self._peek
        found = "the end" if token.kind == "end" else _excerpt(token.text)
        return InvalidParameter(
            f"bad filter at character {token.at + 1}: expected {expected}, found {found}"
        )

    # -- grammar
    def filter(self) -> tuple[frozenset[EventKind] | None, Node | None]:
        kinds = self._kinds()
        where: Node | None = None
        if self._keyword("where"):
            where = self._expr(0)
        if self._peek.kind != "end":
            raise self._fail("'where', 'and', 'or' or the end" if where else "'where' or ','")
        return kinds, where

    def _kinds(self) -> frozenset[EventKind] | None:
        if self._punct("*"):
            return None
        kinds = {self._kind()}
        while self._punct(","):
            kinds.add(self._kind())
        return None if kinds == _ALL_KINDS else frozenset(kinds)

    def _kind(self) -> EventKind:
        token = self._peek
        if token.kind != "name" or token.text.lower() in _KEYWORDS:
            raise self._fail("an event kind or '*'")
        try:
            kind = EventKind(token.text)
        except ValueError:
            known = ", ".join(sorted(k.value for k in EventKind))
            raise InvalidParameter(
                f"bad filter: unknown event kind {_excerpt(token.text)} (known: {known})"
            ) from None
        self._i += 1
        return kind

    def _expr(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise InvalidParameter(f"bad filter: nested more than {MAX_DEPTH} deep")
        items = [self._conj(depth)]
        while self._keyword("or"):
            items.append(self._conj(depth))
        return disjunction(tuple(items))

    def _conj(self, depth: int) -> Node:
        items = [self._unary(depth)]
        while self._keyword("and"):
            items.append(self._unary(depth))
        return conjunction(tuple(items))

    def _unary(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise InvalidParameter(f"bad filter: nested more than {MAX_DEPTH} deep")
        if self._keyword("not"):
            return Not(self._unary(depth + 1))
        if self._punct("("):
            node = self._expr(depth + 1)
            if not self._punct(")"):
                raise self._fail("')'")
            return node
        return self._test()

    def _test(self) -> Node:
        token = self._peek
        if token.kind != "name" or token.text.lower() in _KEYWORDS:
            raise self._fail("a field name, 'not' or '('")
        if len(token.text) > MAX_FIELD_LENGTH:
            raise InvalidParameter(f"bad filter: a field name is at most {MAX_FIELD_LENGTH} long")
        self._i += 1
        if self._keyword("in"):
            return In(token.text, self._values())
        op = self._peek
        if op.kind != "op":
            raise self._fail("an operator (=, !=, <, <=, >, >=, in)")
        self._i += 1
        return Compare(token.text, _operator(op.text), self._literal())

    def _values(self) -> tuple[Value, ...]:
        if not self._punct("("):
            raise self._fail("'(' after 'in'")
        values = [self._literal()]
        while self._punct(","):
            values.append(self._literal())
            if len(values) > MAX_IN_VALUES:
                raise InvalidParameter(f"bad filter: 'in' takes at most {MAX_IN_VALUES} values")
        if not self._punct(")"):
            raise self._fail("',' or ')'")
        return tuple(values)

    def _literal(self) -> Value:
        token = self._peek
        value: Value
        if token.kind == "string":
            value = token.text[1:-1].replace("''", "'")
        elif token.kind == "number":
            value = _number(token.text)
        elif token.kind == "name" and token.text.lower() in ("true", "false", "null"):
            value = {"true": True, "false": False, "null": None}[token.text.lower()]
        else:
            raise self._fail("a value (a 'string', a number, true, false or null)")
        self._i += 1
        return value


def _operator(text: str) -> Operator:
    for op in _OPERATORS:
        if op == text:
            return op
    raise InvalidParameter(f"bad filter: unknown operator {_excerpt(text)}")  # pragma: no cover


def _number(text: str) -> int | float:
    if any(c in text for c in ".eE"):
        value = float(text)
        if not math.isfinite(value):
            raise InvalidParameter(f"bad filter: the number {_excerpt(text)} is out of range")
        return value
    if len(text) > 40:
        raise InvalidParameter(f"bad filter: the number {_excerpt(text)} is out of range")
    return int(text)


# ------------------------------------------------------------------------------ the face
@dataclass(frozen=True, slots=True)
class EventFilter:
    """A parsed subscription filter: which kinds, and a condition on each event.

    ``kind_set`` is None for every kind (``*``); ``where`` is None for no condition.
    Equal filters print the same canonical text (``str``), which parses back to an equal
    filter.
    """

    kind_set: frozenset[EventKind] | None = None
    where: Node | None = None

    @classmethod
    def parse(cls, text: str) -> EventFilter:
        """Parse ``text`` (see the module's grammar).

        Raises:
            InvalidParameter: not a string, too long, too deep, or malformed; the message
                names the place and never echoes more than a short excerpt.
        """
        if not isinstance(text, str):
            raise InvalidParameter("a filter is text")
        if len(text) > MAX_FILTER_LENGTH:
            raise InvalidParameter(f"a filter is at most {MAX_FILTER_LENGTH} characters")
        if not text.strip():
            raise InvalidParameter("a filter names event kinds or '*', e.g. \"* where team = 'x'\"")
        kinds, where = _Parser(text).filter()
        return cls(kinds, where)

    @classmethod
    def everything(cls) -> EventFilter:
        """The filter ``*``: every event."""
        return cls()

    @property
    def kinds(self) -> frozenset[EventKind]:
        """The kinds this filter can match (every kind for ``*``)."""
        return _ALL_KINDS if self.kind_set is None else self.kind_set

    def matches(self, event: Event) -> bool:
        """Whether ``event`` passes: its kind is one of :attr:`kinds` and ``where`` holds."""
        if self.kind_set is not None and event.kind not in self.kind_set:
            return False
        return self.where is None or _holds(self.where, event)

    def __str__(self) -> str:
        head = "*" if self.kind_set is None else ", ".join(sorted(k.value for k in self.kind_set))
        return head if self.where is None else f"{head} where {_text(self.where)}"
