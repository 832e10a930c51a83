"""The promotion gate's rule language: parsed by hand, evaluated over plain values, never run.

A rule is one boolean expression over the figures of a candidate model version and of the
champion it would replace::

    metrics.f1 >= champion.metrics.f1 - 0.01
    data.validation == 'passed' and fidelity.max_abs_diff < 1e-3
    abs(metrics.auc - champion.metrics.auc) <= 0.02 or not (params.optimizer == 'sgd')

Grammar (lowest precedence first)::

    rule       := or
    or         := and ('or' and)*
    and        := not ('and' not)*
    not        := 'not' not | comparison
    comparison := sum (('==' | '!=' | '<' | '<=' | '>' | '>=') sum)?
    sum        := product (('+' | '-') product)*
    product    := unary (('*' | '/') unary)*
    unary      := ('-' | '+') unary | atom
    atom       := NUMBER | 'STRING' | true | false | null | NAME | FUNCTION '(' args ')'
                | '(' or ')'

Names are dotted paths into the context: ``metrics.f1``, ``params.lr``, ``tags.team``,
``version_tags.stage``, ``data.validation``, ``data.failed_expectations``,
``fidelity.max_abs_diff``, ``version``, and the same under ``champion.`` (``champion.metrics.f1``,
``champion.version``). A part holding other characters is backquoted (``metrics.`val/loss```;
a backquote inside is doubled). Strings are single-quoted (a quote inside is doubled, as in
SQL). Functions: ``abs(x)``, ``min(x, ...)``, ``max(x, ...)`` and ``number(x)`` (a numeric string,
as params are, made a number).

Evaluation never raises for what the data holds. A name missing from the context fails the
rule ("metrics.f1 is missing"), as do a division by zero and values of the wrong type. One
exception, on purpose: when there is **no champion** (the first promotion to an alias), every
comparison that reads a ``champion.*`` name is satisfied, with the note "no champion", and
``not`` leaves it satisfied; so a first version can be promoted through the same gate.

Nothing here touches a database or the web: this module is pure, and hostile text (huge rules,
deep nesting, unknown names or functions, ``__class__``) is refused at parse time with
:class:`~shamal.errors.InvalidParameter`.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from shamal.errors import InvalidParameter

__all__ = [
    "CANDIDATE_ROOTS",
    "check_step_name",
    "FUNCTIONS",
    "MAX_DEPTH",
    "MAX_RULES",
    "MAX_RULE_CHARS",
    "GateReport",
    "Rule",
    "RuleResult",
    "parse_rules",
]

logger = logging.getLogger(__name__)

#: A rule is a line of a CI file, not a program.
MAX_RULE_CHARS: Final = 4096
#: Rules in one gate.
MAX_RULES: Final = 50
#: Nesting of parentheses, unary signs, ``not`` and calls.
MAX_DEPTH: Final = 32
#: Arguments of ``min`` / ``max``.
MAX_ARGS: Final = 16
_MAX_NAME_PARTS: Final = 8
_MAX_PART_CHARS: Final = 256

#: What a name may start with (also after ``champion.``).
CANDIDATE_ROOTS: Final = frozenset(
    {"metrics", "params", "tags", "version_tags", "data", "fidelity", "version"}
)
_CHAMPION: Final = "champion"
#: Roots whose values are a group (a name must go one part further).
_GROUPS: Final = frozenset({"metrics", "params", "tags", "version_tags", "data", "fidelity"})

Value: TypeAlias = float | int | str | bool | None
#: Checks the parts of a name a rule reads; raises InvalidParameter for one it may not.
NameCheck: TypeAlias = Callable[[tuple[str, ...]], tuple[str, ...]]


class _NoChampion:
    """What a ``champion.*`` name is worth when there is no champion."""

    def __repr__(self) -> str:
        return "no champion"


NO_CHAMPION: Final = _NoChampion()


class _Vacuous:
    """The truth of a comparison against a champion that does not exist: satisfied."""

    def __repr__(self) -> str:
        return "satisfied (no champion)"


VACUOUS: Final = _Vacuous()
Truth: TypeAlias = bool | _Vacuous
Result: TypeAlias = Value | _NoChampion | _Vacuous


# ---------------------------------------------------------------------- tokens
_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\n]+)
  | (?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|<|>|\+|-|\*|/|\(|\)|,|\.)
    """,
    re.VERBOSE,
)
_KEYWORDS: Final = frozenset({"and", "or", "not", "true", "false", "null"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # number, string, quoted, word, op, end
    text: str
    at: int


def _shown(text: str, width: int = 24) -> str:
    """A bit of text for a message: short, and without control characters."""
    cut = text[:width] + ("..." if len(text) > width else "")
    return "".join(ch if ch.isprintable() else "?" for ch in cut)


def _tokens(text: str) -> list[_Token]:
    found: list[_Token] = []
    at = 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise InvalidParameter(
                f"rule: unexpected character {_shown(text[at])!r} at column {at + 1}"
            )
        kind = match.lastgroup or "op"
        if kind != "space":
            found.append(_Token(kind, match.group(), at))
        at = match.end()
    found.append(_Token("end", "", len(text)))
    return found


# ---------------------------------------------------------------------- nodes
@dataclass(frozen=True, slots=True)
class _Literal:
    value: Value
    text: str


@dataclass(frozen=True, slots=True)
class _Name:
    path: tuple[str, ...]

    @property
    def text(self) -> str:
        return ".".join(
            part if _IDENTIFIER.fullmatch(part) else "`" + part.replace("`", "``") + "`"
            for part in self.path
        )


@dataclass(frozen=True, slots=True)
class _Unary:
    op: str
    operand: _Node


@dataclass(frozen=True, slots=True)
class _Arith:
    op: str
    left: _Node
    right: _Node


@dataclass(frozen=True, slots=True)
class _Compare:
    op: str
    left: _Node
    right: _Node


@dataclass(frozen=True, slots=True)
class _Logic:
    op: str  # and, or
    operands: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Not:
    operand: _Node


@dataclass(frozen=True, slots=True)
class _Call:
    function: str
    args: tuple[_Node, ...]


_Node: TypeAlias = _Literal | _Name | _Unary | _Arith | _Compare | _Logic | _Not | _Call
_BOOLEAN = (_Compare, _Logic, _Not)
_PRECEDENCE: Final = {"or": 1, "and": 2, "not": 3, "compare": 4, "+": 5, "-": 5, "*": 6, "/": 6}


def _precedence(node: _Node) -> int:
    if isinstance(node, _Logic | _Arith):
        return _PRECEDENCE[node.op]
    return _PRECEDENCE["not"] if isinstance(node, _Not) else 4 if isinstance(node, _Compare) else 9


def _wrapped(node: _Node, above: int, *, strict: bool = False) -> str:
    text = render(node)
    mine = _precedence(node)
    return f"({text})" if mine < above or (strict and mine == above) else text


def render(node: _Node) -> str:
    """The canonical text of a (sub)expression: what explanations quote."""
    if isinstance(node, _Literal | _Name):
        return node.text
    if isinstance(node, _Unary):
        return node.op + _wrapped(node.operand, 7)
    if isinstance(node, _Call):
        return f"{node.function}({', '.join(render(a) for a in node.args)})"
    if isinstance(node, _Not):
        return "not " + _wrapped(node.operand, _PRECEDENCE["not"])
    if isinstance(node, _Logic):
        level = _PRECEDENCE[node.op]
        return f" {node.op} ".join(_wrapped(o, level, strict=True) for o in node.operands)
    level = _PRECEDENCE["compare"] if isinstance(node, _Compare) else _PRECEDENCE[node.op]
    # `a - (b - c)` and `a / (b * c)`: the right side keeps its parentheses at equal level.
    return f"{_wrapped(node.left, level)} {node.op} {_wrapped(node.right, level, strict=True)}"


# ---------------------------------------------------------------------- functions
def _number(value: Value) -> Value:
    """``number('0.01')``: a param (always text) as a number; a number stays itself."""
    if isinstance(value, bool) or value is None:
        raise _Failure(f"number() takes a number or numeric text, not {_text(value)}")
    if isinstance(value, int | float):
        return value
    try:
        parsed = float(value.strip()) if len(value) <= 64 else math.nan
    except ValueError:
        parsed = math.nan
    if not math.isfinite(parsed):
        raise _Failure(f"number(): {_text(value)} is not a finite number")
    return parsed


def _one(function: Callable[[Value], Value]) -> Callable[[Sequence[Value]], Value]:
    return lambda args: function(args[0])


#: Name -> (smallest, largest argument count, implementation over numbers).
FUNCTIONS: Final[Mapping[str, tuple[int, int, Callable[[Sequence[Value]], Value]]]] = {
    "abs": (1, 1, _one(lambda v: abs(_numeric(v, "abs()")))),
    "min": (1, MAX_ARGS, lambda args: min(_numeric(v, "min()") for v in args)),
    "max": (1, MAX_ARGS, lambda args: max(_numeric(v, "max()") for v in args)),
    "number": (1, 1, _one(_number)),
}


# ---------------------------------------------------------------------- parser
class _Parser:
    """Recursive descent over the tokens, with a depth bound (no stack overflow on hostile
    nesting: each level costs a few Python frames, and there are at most ``MAX_DEPTH``)."""

    def __init__(self, text: str, check: NameCheck) -> None:
        self._tokens = _tokens(text)
        self._check = check
        self._at = 0
        self._depth = 0

    @property
    def _next(self) -> _Token:
        return self._tokens[self._at]

    def _take(self) -> _Token:
        token = self._tokens[self._at]
        self._at += 1
        return token

    def _is(self, kind: str, *texts: str) -> bool:
        token = self._next
        return token.kind == kind and (not texts or token.text in texts)

    def _expect(self, text: str) -> None:
        if not self._is("op", text):
            self._fail(f"expected {text!r}")
        self._take()

    def _fail(self, why: str) -> None:
        token = self._next
        seen = "the end of the rule" if token.kind == "end" else repr(_shown(token.text))
        raise InvalidParameter(f"rule: {why} at column {token.at + 1} (found {seen})")

    def _nested(self, parse: Callable[[], _Node]) -> _Node:
        """``parse`` one level deeper, refused past ``MAX_DEPTH``."""
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise InvalidParameter(f"rule: nested more than {MAX_DEPTH} levels deep")
        node = parse()
        self._depth -= 1
        return node

    def rule(self) -> _Node:
        node = self._or()
        if self._next.kind != "end":
            self._fail("expected an operator or the end of the rule")
        if not isinstance(node, _BOOLEAN) and not (
            isinstance(node, _Literal) and isinstance(node.value, bool)
        ):
            raise InvalidParameter(
                "rule: a rule must compare values (metrics.f1 >= 0.9), "
                "or combine comparisons with and / or / not"
            )
        return node

    def _logic(self, op: str, operand: Callable[[], _Node]) -> _Node:
        items = [operand()]
        while self._is("word", op):
            self._take()
            items.append(operand())
        if len(items) == 1:
            return items[0]
        for item in items:
            _require_boolean(item, op)
        return _Logic(op, tuple(items))

    def _or(self) -> _Node:
        return self._logic("or", self._and)

    def _and(self) -> _Node:
        return self._logic("and", self._not)

    def _not(self) -> _Node:
        if not self._is("word", "not"):
            return self._comparison()
        self._take()
        operand = self._nested(self._not)
        _require_boolean(operand, "not")
        return _Not(operand)

    def _comparison(self) -> _Node:
        left = self._sum()
        if not self._is("op", "==", "!=", "<", "<=", ">", ">="):
            return left
        op = self._take().text
        right = self._sum()
        if self._is("op", "==", "!=", "<", "<=", ">", ">="):
            self._fail("comparisons do not chain; join them with 'and'")
        for side in (left, right):
            if isinstance(side, _BOOLEAN):
                raise InvalidParameter(f"rule: {render(side)!r} is a condition, not a value")
        return _Compare(op, left, right)

    def _arith(self, ops: tuple[str, ...], operand: Callable[[], _Node]) -> _Node:
        node = operand()
        while self._is("op", *ops):
            op = self._take().text
            right = operand()
            for side in (node, right):
                _require_number(side, op)
            node = _Arith(op, node, right)
        return node

    def _sum(self) -> _Node:
        return self._arith(("+", "-"), self._product)

    def _product(self) -> _Node:
        return self._arith(("*", "/"), self._unary)

    def _unary(self) -> _Node:
        if not self._is("op", "-", "+"):
            return self._atom()
        op = self._take().text
        operand = self._nested(self._unary)
        _require_number(operand, op)
        return _Unary(op, operand)

    def _atom(self) -> _Node:
        token = self._next
        if token.kind == "number":
            return _number_literal(self._take())
        if token.kind == "string":
            self._take()
            return _Literal(token.text[1:-1].replace("''", "'"), token.text)
        if token.kind == "op" and token.text == "(":
            self._take()
            inner = self._nested(self._or)
            self._expect(")")
            return inner
        if token.kind in ("word", "quoted"):
            return self._word()
        self._fail("expected a value")
        raise AssertionError("unreachable")  # pragma: no cover - _fail raises

    def _word(self) -> _Node:
        token = self._next
        if token.kind == "word" and token.text in _KEYWORDS:
            if token.text in ("and", "or", "not"):
                self._fail("expected a value")
            self._take()
            constant: Value = {"true": True, "false": False, "null": None}[token.text]
            return _Literal(constant, token.text)
        if token.kind == "word" and self._tokens[self._at + 1].text == "(":
            return self._call()
        return self._name()

    def _call(self) -> _Node:
        token = self._take()
        if token.text not in FUNCTIONS:
            known = ", ".join(sorted(FUNCTIONS))
            raise InvalidParameter(f"rule: unknown function {_shown(token.text)!r} ({known})")
        smallest, largest, _ = FUNCTIONS[token.text]
        self._expect("(")
        args: list[_Node] = []
        while not self._is("op", ")") and len(args) <= largest:
            if args:
                self._expect(",")
            args.append(self._nested(self._sum))
        if not smallest <= len(args) <= largest:
            raise InvalidParameter(
                f"rule: {token.text}() takes {smallest} to {largest} arguments"
                + ("" if len(args) > largest else f", not {len(args)}")
            )
        self._expect(")")
        return _Call(token.text, tuple(args))

    def _name(self) -> _Node:
        parts = [self._part()]
        while self._is("op", "."):
            self._take()
            parts.append(self._part())
            if len(parts) > _MAX_NAME_PARTS:
                raise InvalidParameter(f"rule: a name has at most {_MAX_NAME_PARTS} parts")
        return _Name(self._check(tuple(parts)))

    def _part(self) -> str:
        token = self._next
        if token.kind == "word":
            self._take()
            return token.text
        if token.kind == "quoted":
            self._take()
            part = token.text[1:-1].replace("``", "`")
            if not part or len(part) > _MAX_PART_CHARS or not part.isprintable():
                raise InvalidParameter(
                    f"rule: a backquoted name holds 1 to {_MAX_PART_CHARS} printable characters"
                )
            return part
        self._fail("expected a name")
        raise AssertionError("unreachable")  # pragma: no cover - _fail raises


def _number_literal(token: _Token) -> _Literal:
    text = token.text
    if text.isascii() and text.isdigit():
        return _Literal(int(text), text)
    value = float(text)
    if not math.isfinite(value):
        raise InvalidParameter(f"rule: the number {_shown(text)!r} is out of range")
    return _Literal(value, text)


def _check_name(path: tuple[str, ...]) -> tuple[str, ...]:
    """Only the names the context can hold: a typo or ``__class__`` is refused up front."""
    if any(part.startswith("__") for part in path):
        raise InvalidParameter("rule: names starting with '__' are not allowed")
    rest = path[1:] if path[0] == _CHAMPION else path
    shown = _shown(".".join(path))
    if not rest or rest[0] not in CANDIDATE_ROOTS:
        roots = ", ".join(sorted(CANDIDATE_ROOTS))
        raise InvalidParameter(
            f"rule: unknown name {shown!r}: names start with {roots} or champion.<one of those>"
        )
    if rest[0] in _GROUPS and len(rest) < 2:
        raise InvalidParameter(f"rule: {shown!r} is a group; name one of its values")
    if rest[0] == "version" and len(rest) > 1:
        raise InvalidParameter(f"rule: {shown!r}: version is a number, with no parts")
    return path


def check_step_name(path: tuple[str, ...]) -> tuple[str, ...]:
    """The names a pipeline step's ``when`` may read: ``params.NAME`` and
    ``steps.STEP.output[.KEY...]``."""
    if any(part.startswith("__") for part in path):
        raise InvalidParameter("rule: names starting with '__' are not allowed")
    shown = _shown(".".join(path))
    if path[0] == "params" and len(path) == 2:
        return path
    if path[0] == "steps" and len(path) >= 3 and path[2] == "output":
        return path
    raise InvalidParameter(
        f"rule: unknown name {shown!r}: a condition reads params.NAME or steps.STEP.output[.KEY]"
    )


def _require_boolean(node: _Node, op: str) -> None:
    if isinstance(node, _BOOLEAN) or (isinstance(node, _Literal) and isinstance(node.value, bool)):
        return
    raise InvalidParameter(f"rule: {op!r} takes conditions, and {render(node)!r} is a value")


def _require_number(node: _Node, op: str) -> None:
    if isinstance(node, _BOOLEAN) or (
        isinstance(node, _Literal) and (node.value is None or isinstance(node.value, bool | str))
    ):
        raise InvalidParameter(f"rule: {op!r} takes numbers, and {render(node)!r} is not one")


# ---------------------------------------------------------------------- evaluation
class _Failure(Exception):
    """The rule cannot hold on this data (a name missing, a division by zero, a type)."""


def _text(value: Result) -> str:
    """A value as an explanation shows it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return "'" + _shown(value, 61).replace("'", "''") + "'"
    return str(value)


_HINT: Final = " (params and tags are text: number(params.x) makes one a number)"


def _numeric(value: Value, where: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        hint = _HINT if isinstance(value, str) else ""
        raise _Failure(f"{where} takes numbers, not {_text(value)}{hint}")
    return value


_ARITH: Final[Mapping[str, Callable[[Any, Any], Any]]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
}
_ORDER: Final[Mapping[str, Callable[[Any, Any], Any]]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _arith(op: str, left: Value, right: Value) -> Value:
    a, b = _numeric(left, op), _numeric(right, op)
    if op == "/" and b == 0:
        raise _Failure("division by zero")
    result: Value = _ARITH[op](a, b)
    return result


def _compare(op: str, left: Value, right: Value) -> bool:
    if op in ("==", "!="):
        return _same(left, right) is (op == "==")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right))
    if not numbers and not (isinstance(left, str) and isinstance(right, str)):
        texts = isinstance(left, str) or isinstance(right, str)
        raise _Failure(f"cannot order {_text(left)} and {_text(right)} with {op}" + _HINT * texts)
    return bool(_ORDER[op](left, right))


def _same(left: Value, right: Value) -> bool:
    """Equality without Python's ``True == 1``: a boolean equals only a boolean."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    return left == right


@dataclass
class _Evaluation:
    """One evaluation of one rule: the values its names took and what each comparison saw."""

    context: Mapping[str, Any]
    values: dict[str, Any] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)
    no_champion: bool = False

    def value(self, node: _Node) -> Result:  # noqa: PLR0911 - one branch per node kind
        if isinstance(node, _Literal):
            return node.value
        if isinstance(node, _Name):
            return self._resolve(node)
        if isinstance(node, _Unary):
            inner = self.value(node.operand)
            if isinstance(inner, _NoChampion):
                return inner
            number = _numeric(_plain(inner), node.op)
            return -number if node.op == "-" else number
        if isinstance(node, _Arith):
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(left, _NoChampion) or isinstance(right, _NoChampion):
                return NO_CHAMPION
            return _arith(node.op, _plain(left), _plain(right))
        if isinstance(node, _Call):
            args = [self.value(a) for a in node.args]
            if any(isinstance(a, _NoChampion) for a in args):
                return NO_CHAMPION
            return FUNCTIONS[node.function][2]([_plain(a) for a in args])
        return self.truth(node)

    def truth(self, node: _Node) -> Truth:
        if isinstance(node, _Literal):
            return bool(node.value)
        if isinstance(node, _Not):
            inner = self.truth(node.operand)
            return inner if isinstance(inner, _Vacuous) else not inner
        if isinstance(node, _Logic):
            # Every operand is evaluated (no short cut): the report shows every value, and a
            # missing name fails the rule wherever it stands.
            truths = [self.truth(o) for o in node.operands]
            if node.op == "and":
                return False if False in truths else (True if True in truths else VACUOUS)
            return True if True in truths else (VACUOUS if VACUOUS in truths else False)
        if isinstance(node, _Compare):
            return self._comparison(node)
        raise _Failure(f"{render(node)} is not a condition")  # pragma: no cover - parse checks

    def _comparison(self, node: _Compare) -> Truth:
        left, right = self.value(node.left), self.value(node.right)
        said = f"{self._side(node.left, left)} {node.op} {self._side(node.right, right)}"
        if isinstance(left, _NoChampion) or isinstance(right, _NoChampion):
            self.no_champion = True
            self.seen.append(said)
            return VACUOUS
        self.seen.append(said)
        return _compare(node.op, _plain(left), _plain(right))

    @staticmethod
    def _side(node: _Node, value: Result) -> str:
        if isinstance(node, _Literal):
            return node.text
        if isinstance(value, _NoChampion):
            return f"{render(node)} (no champion)"
        return f"{render(node)} = {_text(value)}"

    def _resolve(self, node: _Name) -> Result:
        name = node.text
        current: Any = self.context
        if node.path[0] == _CHAMPION and self.context.get(_CHAMPION) is None:
            self.values[name] = None
            return NO_CHAMPION
        for part in node.path:
            if not isinstance(current, Mapping) or part not in current:
                raise _Failure(f"{name} is missing")
            current = current[part]
        if isinstance(current, Mapping):
            raise _Failure(f"{name} is a group of values; name one of them")
        if not (current is None or isinstance(current, int | float | str)):
            raise _Failure(f"{name} holds a value rules cannot read")
        self.values[name] = current
        return current


def _plain(value: Result) -> Value:
    if isinstance(value, _NoChampion | _Vacuous):  # pragma: no cover - callers check first
        raise _Failure("no champion")
    return value


# ---------------------------------------------------------------------- public faces
@dataclass(frozen=True, slots=True)
class RuleResult:
    """How one rule fared on one context.

    Attributes:
        rule: the rule's canonical text.
        passed: whether it holds (True also when it only compared against a missing champion).
        values: each name the rule read and the value it resolved to (None: no champion).
        explanation: for people: each comparison with its values, then ``passed`` or ``failed``
            (``metrics.f1 = 0.91 >= champion.metrics.f1 - 0.01 = 0.89: passed``), or why the
            rule could not hold (``metrics.f1 is missing: failed``).
        no_champion: some comparison was satisfied only because there is no champion.
    """

    rule: str
    passed: bool
    values: Mapping[str, Any]
    explanation: str
    no_champion: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "passed": self.passed,
            "values": dict(self.values),
            "explanation": self.explanation,
            "no_champion": self.no_champion,
        }


@dataclass(frozen=True, slots=True)
class Rule:
    """A parsed rule: build with :meth:`parse`, apply with :meth:`evaluate` (any number of
    times; it holds no state)."""

    text: str
    _tree: _Node = field(repr=False, compare=False)

    @classmethod
    def parse(cls, text: str, *, names: NameCheck | None = None) -> Rule:
        """Parse one rule; ``names`` checks each name it reads (default: a gate's names,
        :data:`CANDIDATE_ROOTS`; a pipeline step's ``when`` reads ``steps.*`` and
        ``params.*``).

        Raises:
            InvalidParameter: empty, longer than ``MAX_RULE_CHARS``, holding control
                characters, nested deeper than ``MAX_DEPTH``, naming an unknown name or
                function, or not a condition (a bare value).
        """
        if not isinstance(text, str) or not text.strip():
            raise InvalidParameter("rule: a rule is a non-empty condition, like metrics.f1 >= 0.9")
        if len(text) > MAX_RULE_CHARS:
            raise InvalidParameter(f"rule: longer than {MAX_RULE_CHARS} characters")
        if any(not ch.isprintable() and ch not in " \t\r\n" for ch in text):
            raise InvalidParameter("rule: control characters are not allowed")
        tree = _Parser(text, names or _check_name).rule()
        return cls(render(tree), tree)

    def names(self) -> tuple[str, ...]:
        """The names the rule reads, in order, each once."""
        return tuple(dict.fromkeys(n.text for n in _walk(self._tree) if isinstance(n, _Name)))

    def evaluate(self, context: Mapping[str, Any]) -> RuleResult:
        """The rule applied to ``context``, a nested mapping (``{"metrics": {"f1": 0.9},
        "champion": {"metrics": {...}, "version": 3} or None, ...}``). Never raises for what
        the context holds: a missing name, a division by zero or a value of the wrong type
        make a failed result that says so."""
        run = _Evaluation(context)
        try:
            truth = run.truth(self._tree)
        except _Failure as failure:
            return RuleResult(self.text, False, run.values, f"{failure}: failed", run.no_champion)
        except (OverflowError, ValueError) as exc:  # huge numbers: data, not a bug
            logger.debug("rule %r overflowed: %s", self.text, exc)
            return RuleResult(self.text, False, run.values, "number out of range: failed")
        passed = truth is not False
        said = "; ".join(run.seen) or self.text
        verdict = "passed" if passed else "failed"
        if isinstance(truth, _Vacuous):
            verdict = "passed (no champion)"
        return RuleResult(self.text, passed, run.values, f"{said}: {verdict}", run.no_champion)


def _walk(node: _Node) -> Iterator[_Node]:
    yield node
    if isinstance(node, _Unary | _Not):
        yield from _walk(node.operand)
    elif isinstance(node, _Arith | _Compare):
        yield from _walk(node.left)
        yield from _walk(node.right)
    elif isinstance(node, _Logic):
        for operand in node.operands:
            yield from _walk(operand)
    elif isinstance(node, _Call):
        for arg in node.args:
            yield from _walk(arg)


def parse_rules(texts: Sequence[str]) -> tuple[Rule, ...]:
    """Parse a gate's rules, all of them before anything is evaluated.

    Raises:
        InvalidParameter: no rule at all (a gate needs at least one), more than
            ``MAX_RULES``, or any rule :meth:`Rule.parse` refuses (its number is named).
    """
    if not texts:
        raise InvalidParameter("a gate needs at least one rule (--require EXPR)")
    if len(texts) > MAX_RULES:
        raise InvalidParameter(f"a gate takes at most {MAX_RULES} rules")
    rules = []
    for index, text in enumerate(texts, 1):
        try:
            rules.append(Rule.parse(text))
        except InvalidParameter as exc:
            raise InvalidParameter(f"rule {index}: {exc.message.removeprefix('rule: ')}") from None
    return tuple(rules)


@dataclass(frozen=True, slots=True)
class GateReport:
    """What one promotion gate decided.

    Attributes:
        model: the registered model.
        from_alias: the alias naming the candidate; ``candidate_version`` its version.
        to_alias: the alias to move; ``champion_version`` the version it named (None: none).
        results: one per rule, in the order given.
        dry_run: only evaluated; nothing moves whatever the outcome.
        promoted: ``to_alias`` now names the candidate because of this gate.
    """

    model: str
    from_alias: str
    to_alias: str
    candidate_version: int
    champion_version: int | None
    results: tuple[RuleResult, ...]
    dry_run: bool = False
    promoted: bool = False

    @property
    def passed(self) -> bool:
        """Every rule held."""
        return all(r.passed for r in self.results)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GateReport:
        """The report :meth:`to_json` (or the promotion API) wrote, read back: what the CLI
        makes its JUnit XML from.

        Raises:
            InvalidParameter: not a report's shape.
        """
        try:
            results = tuple(
                RuleResult(
                    str(r["rule"]),
                    bool(r["passed"]),
                    dict(r.get("values") or {}),
                    str(r["explanation"]),
                    bool(r.get("no_champion", False)),
                )
                for r in data["results"]
            )
            champion = data.get("champion_version")
            return cls(
                str(data["model"]),
                str(data["from_alias"]),
                str(data["to_alias"]),
                int(data["candidate_version"]),
                None if champion is None else int(champion),
                results,
                dry_run=bool(data.get("dry_run", False)),
                promoted=bool(data.get("promoted", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidParameter(f"not a gate report ({type(exc).__name__})") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "from_alias": self.from_alias,
            "to_alias": self.to_alias,
            "candidate_version": self.candidate_version,
            "champion_version": self.champion_version,
            "passed": self.passed,
            "promoted": self.promoted,
            "dry_run": self.dry_run,
            "results": [r.to_json() for r in self.results],
        }
