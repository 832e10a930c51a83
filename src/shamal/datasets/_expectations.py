"""Expectation suites: what a dataset version must satisfy, declared, not programmed.

A :class:`Suite` is a frozen tuple of :class:`Expectation` s, each of one kind and a
severity (``error`` fails the validation, ``warning`` is reported only). Suites are written
in YAML (:meth:`Suite.from_yaml`, :meth:`Suite.to_yaml`) or built in Python
(:meth:`Suite.builder`)::

    version: 1
    expectations:
      - kind: not_null
        column: id
      - kind: range
        column: age
        min: 0
        max: 130
        severity: warning
      - kind: sql
        sql: SELECT * FROM data WHERE ended_at < started_at

Every expectation checks its own parameters when it is made, whichever way it is made; YAML
with an unknown key, a wrong type or a bad value is refused with the expectation's index and
the key named. Evaluation lives in :mod:`._validation`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar, Final, Literal

import yaml  # type: ignore[import-untyped,unused-ignore]

from shamal.datasets._columns import Scalar
from shamal.datasets._confined import check_select
from shamal.errors import InvalidParameter

__all__ = [
    "KINDS",
    "MAX_EXPECTATIONS",
    "MAX_SUITE_BYTES",
    "Bound",
    "ColumnType",
    "CustomSql",
    "Expectation",
    "Fresh",
    "InRange",
    "InSet",
    "MatchesRegex",
    "NotNull",
    "RowCount",
    "Severity",
    "Suite",
    "SuiteBuilder",
    "Unique",
    "as_utc_naive",
]

Severity = Literal["error", "warning"]
#: A range bound: a number, a text, a date or a date-time.
Bound = int | float | str | date

#: A suite file larger than this is refused before it is parsed.
MAX_SUITE_BYTES: Final = 256 * 1024
MAX_EXPECTATIONS: Final = 1000
MAX_SET_VALUES: Final = 10_000
MAX_SQL_CHARS: Final = 20_000
MAX_PATTERN_CHARS: Final = 1_000
MAX_NAME_CHARS: Final = 256
MAX_UNIQUE_COLUMNS: Final = 32
_AGE: Final = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_SECONDS: Final[Mapping[str, int]] = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def _column(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS or "\0" in value:
        raise InvalidParameter(f"{key!r} must be a column name (1 to {MAX_NAME_CHARS} characters).")
    return value


def _flag(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidParameter(f"{key!r} must be true or false.")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _family(key: str, value: Any) -> str:
    """Which comparable family a bound or set value is in: number, text, time or bool."""
    if isinstance(value, bool):
        return "bool"
    if _is_number(value):
        if not math.isfinite(value):
            raise InvalidParameter(f"{key!r} must be a finite number.")
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, date):
        return "time"
    raise InvalidParameter(f"{key!r} must be a number, a text, a date or a date-time.")


def as_utc_naive(value: date) -> datetime:
    """A date or date-time as a naive UTC date-time, so that any two compare."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value
    return datetime(value.year, value.month, value.day)


def _age(value: Any) -> timedelta:
    """A maximum age: a timedelta, a number of seconds, or text such as ``36h`` or ``7d``."""
    if isinstance(value, timedelta):
        age = value
    elif _is_number(value):
        age = timedelta(seconds=value)
    elif isinstance(value, str) and (match := _AGE.match(value)):
        age = timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    else:
        raise InvalidParameter(
            "'max_age' must be seconds or a number with a unit s, m, h, d or w (like 36h)."
        )
    if age <= timedelta(0):
        raise InvalidParameter("'max_age' must be positive.")
    return age


def _age_text(age: timedelta) -> str | float:
    seconds = age.total_seconds()
    for unit, size in _UNIT_SECONDS.items():
        if seconds == int(seconds) and int(seconds) % size == 0:
            return f"{int(seconds) // size}{unit}"
    return seconds


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """One thing a dataset version must satisfy. Subclasses are the kinds; ``kind`` is the name
    a suite file gives the kind.

    Raises (when made):
        InvalidParameter: a parameter of the wrong type or value, naming its key.
    """

    kind: ClassVar[str] = ""
    severity: Severity = "error"
    description: str = ""

    def __post_init__(self) -> None:
        if self.severity not in ("error", "warning"):
            raise InvalidParameter("'severity' must be error or warning.")
        if not isinstance(self.description, str) or len(self.description) > 1000:
            raise InvalidParameter("'description' must be a text of at most 1000 characters.")

    @property
    def column_names(self) -> tuple[str, ...]:
        """The columns the expectation reads (none for table-level ones and custom SQL)."""
        names = getattr(self, "columns", None) or (getattr(self, "column", None),)
        return tuple(name for name in names if isinstance(name, str))

    def to_yaml_mapping(self) -> dict[str, Any]:
        """The expectation as a suite file holds it: kind first, defaults left out."""
        written: dict[str, Any] = {"kind": self.kind}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.default is not dataclasses.MISSING and value == field.default:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, timedelta):
                value = _age_text(value)
            written[field.name] = value
        return written

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


@dataclass(frozen=True, kw_only=True)
class ColumnType(Expectation):
    """The column exists with this Arrow type (``int64``, ``double``, ``string``,
    ``timestamp[us, tz=UTC]`` ...) in every file; large and view variants of string and
    binary count as the plain type."""

    kind: ClassVar[str] = "column_type"
    column: str
    arrow_type: str

    def __post_init__(self) -> None:
        super().__post_init__()
        _column("column", self.column)
        if not isinstance(self.arrow_type, str) or not 0 < len(self.arrow_type) <= 200:
            raise InvalidParameter("'arrow_type' must be an Arrow type name such as int64.")


@dataclass(frozen=True, kw_only=True)
class NotNull(Expectation):
    """No value of the column is null."""

    kind: ClassVar[str] = "not_null"
    column: str

    def __post_init__(self) -> None:
        super().__post_init__()
        _column("column", self.column)


@dataclass(frozen=True, kw_only=True)
class InRange(Expectation):
    """Every non-null value lies between ``min`` and ``max`` (either may be left out; both
    inclusive by default). Numbers bound numeric columns, dates and date-times temporal
    ones (a naive date-time is UTC), texts string columns. NaN is out of every range."""

    kind: ClassVar[str] = "range"
    column: str
    min: Bound | None = None
    max: Bound | None = None
    min_inclusive: bool = True
    max_inclusive: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _column("column", self.column)
        _flag("min_inclusive", self.min_inclusive)
        _flag("max_inclusive", self.max_inclusive)
        if self.min is None and self.max is None:
            raise InvalidParameter("a range needs 'min', 'max' or both.")
        families = {
            _family(key, value)
            for key, value in (("min", self.min), ("max", self.max))
            if value is not None
        }
        if "bool" in families or len(families) > 1:
            raise InvalidParameter("'min' and 'max' must be two numbers, texts or times.")
        if self.min is not None and self.max is not None and self._low_above_high():
            raise InvalidParameter("'min' is above 'max'.")

    @property
    def family(self) -> str:
        bound = self.min if self.min is not None else self.max
        return _family("min", bound)

    def _low_above_high(self) -> bool:
        low, high = self.min, self.max
        if isinstance(low, date) and isinstance(high, date):
            return as_utc_naive(low) > as_utc_naive(high)
        return bool(low > high)  # type: ignore[operator]


@dataclass(frozen=True, kw_only=True)
class InSet(Expectation):
    """Every non-null value is one of ``values`` (all texts, all numbers or all booleans)."""

    kind: ClassVar[str] = "in_set"
    column: str
    values: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        _column("column", self.column)
        if isinstance(self.values, str | bytes | Mapping) or not isinstance(self.values, Iterable):
            raise InvalidParameter("'values' must be a list.")
        values = tuple(self.values)
        if not 0 < len(values) <= MAX_SET_VALUES:
            raise InvalidParameter(f"'values' must hold 1 to {MAX_SET_VALUES} values.")
        families = {_family("values", v) for v in values}
        if "time" in families or len(families) > 1:
            raise InvalidParameter("'values' must be all texts, all numbers or all booleans.")
        self._set("values", values)

    @property
    def family(self) -> str:
        return _family("values", self.values[0])


@dataclass(frozen=True, kw_only=True)
class MatchesRegex(Expectation):
    """Every non-null value, as text, matches ``pattern`` in full (RE2 syntax)."""

    kind: ClassVar[str] = "regex"
    column: str
    pattern: str

    def __post_init__(self) -> None:
        super().__post_init__()
        _column("column", self.column)
        if not isinstance(self.pattern, str) or not 0 < len(self.pattern) <= MAX_PATTERN_CHARS:
            raise InvalidParameter(f"'pattern' must be a text of 1 to {MAX_PATTERN_CHARS}.")
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise InvalidParameter(f"'pattern' is not a regular expression: {exc}.") from None


@dataclass(frozen=True, kw_only=True)
class Unique(Expectation):
    """No two rows share a value of ``columns`` (together; rows with a null among them are
    not compared). The failing count is the number of rows beyond the first of each value."""

    kind: ClassVar[str] = "unique"
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        columns = (self.columns,) if isinstance(self.columns, str) else self.columns
        if not isinstance(columns, Iterable):
            raise InvalidParameter("'columns' must be a list of column names.")
        columns = tuple(_column("columns", c) for c in columns)
        if not 0 < len(columns) <= MAX_UNIQUE_COLUMNS or len(set(columns)) != len(columns):
            raise InvalidParameter(f"'columns' must name 1 to {MAX_UNIQUE_COLUMNS} columns once.")
        self._set("columns", columns)


@dataclass(frozen=True, kw_only=True)
class RowCount(Expectation):
    """The version has between ``min`` and ``max`` rows (inclusive; either may be left out)."""

    kind: ClassVar[str] = "row_count"
    min: int | None = None
    max: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, value in (("min", self.min), ("max", self.max)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise InvalidParameter(f"{key!r} must be a whole number of rows.")
            if value is not None and value < 0:
                raise InvalidParameter(f"{key!r} must not be negative.")
        if self.min is None and self.max is None:
            raise InvalidParameter("a row count needs 'min', 'max' or both.")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise InvalidParameter("'min' is above 'max'.")


@dataclass(frozen=True, kw_only=True)
class Fresh(Expectation):
    """The newest value of a temporal column is at most ``max_age`` old when validated
    (``now`` is given to the validation; a naive timestamp is UTC)."""

    kind: ClassVar[str] = "freshness"
    column: str
    max_age: timedelta

    def __post_init__(self) -> None:
        super().__post_init__()
        _column("column", self.column)
        self._set("max_age", _age(self.max_age))


@dataclass(frozen=True, kw_only=True)
class CustomSql(Expectation):
    """A query over the view ``data`` that returns the failing rows: it passes when the
    query returns none. Only a single SELECT (or WITH ... SELECT) is accepted, and it runs
    confined to the version's files (see :mod:`._confined`)."""

    kind: ClassVar[str] = "sql"
    sql: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.sql, str) or not 0 < len(self.sql) <= MAX_SQL_CHARS:
            raise InvalidParameter(f"'sql' must be a query of 1 to {MAX_SQL_CHARS} characters.")
        try:
            check_select(self.sql)
        except InvalidParameter as exc:
            raise InvalidParameter(f"'sql': {exc.message}") from None


#: Every kind of expectation, by the name a suite file gives it.
KINDS: Final[Mapping[str, type[Expectation]]] = {
    cls.kind: cls
    for cls in (
        ColumnType,
        NotNull,
        InRange,
        InSet,
        MatchesRegex,
        Unique,
        RowCount,
        Fresh,
        CustomSql,
    )
}


@dataclass(frozen=True)
class Suite:
    """A frozen list of expectations, evaluated together by :func:`validate`.

    Raises (when made):
        InvalidParameter: more than ``MAX_EXPECTATIONS``, or an item that is no expectation.
    """

    expectations: tuple[Expectation, ...] = ()

    def __post_init__(self) -> None:
        expectations = tuple(self.expectations)
        if len(expectations) > MAX_EXPECTATIONS:
            raise InvalidParameter(f"a suite holds at most {MAX_EXPECTATIONS} expectations.")
        if not all(isinstance(e, Expectation) and e.kind for e in expectations):
            raise InvalidParameter("a suite holds only expectations.")
        object.__setattr__(self, "expectations", expectations)

    def __len__(self) -> int:
        return len(self.expectations)

    @staticmethod
    def builder() -> SuiteBuilder:
        """A builder: ``Suite.builder().not_null("id").range("age", 0, 130).build()``."""
        return SuiteBuilder()

    @classmethod
    def from_yaml(cls, text: str | bytes) -> Suite:
        """A suite from its YAML text (see the module's docstring for the format).

        Raises:
            InvalidParameter: the text is too large, not YAML, uses aliases, has an unknown
                key or kind, a wrong type or value (named with the expectation's index and
                key), or more expectations than allowed.
        """
        data = text.encode("utf-8") if isinstance(text, str) else text
        if len(data) > MAX_SUITE_BYTES:
            raise InvalidParameter(f"a suite file holds at most {MAX_SUITE_BYTES} bytes.")
        raw = _parse_yaml(data)
        if not isinstance(raw, Mapping):
            raise InvalidParameter("a suite is a mapping with 'version' and 'expectations'.")
        unknown = sorted(str(key) for key in raw if key not in ("version", "expectations"))
        if unknown:
            raise InvalidParameter(
                f"suite: unknown key {unknown[0]!r}; allowed: expectations, version."
            )
        if raw.get("version", 1) != 1:
            raise InvalidParameter("suite: 'version' must be 1.")
        items = raw.get("expectations")
        if not isinstance(items, list):
            raise InvalidParameter("suite: 'expectations' must be a list.")
        if len(items) > MAX_EXPECTATIONS:
            raise InvalidParameter(f"a suite holds at most {MAX_EXPECTATIONS} expectations.")
        return cls(tuple(_expectation(index, item) for index, item in enumerate(items)))

    def to_yaml(self) -> str:
        """The suite as YAML that :meth:`from_yaml` reads back to an equal suite."""
        document = {
            "version": 1,
            "expectations": [e.to_yaml_mapping() for e in self.expectations],
        }
        return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """The safe loader, refusing aliases (they let a small file expand without bound)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise InvalidParameter("a suite file may not use YAML aliases.")
        return super().compose_node(parent, index)


def _parse_yaml(data: bytes) -> Any:
    try:
        # _Loader is a SafeLoader (no object construction) that also refuses aliases.
        return yaml.load(data.decode("utf-8"), Loader=_Loader)  # nosec B506
    except UnicodeDecodeError:
        raise InvalidParameter("a suite file must be UTF-8 text.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidParameter(f"a suite file is not valid YAML{where}.") from None


def _expectation(index: int, raw: Any) -> Expectation:
    where = f"expectations[{index}]"
    if not isinstance(raw, Mapping):
        raise InvalidParameter(f"{where}: an expectation is a mapping with a 'kind'.")
    kind = raw.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidParameter(
            f"{where}: unknown kind {kind!r}; one of {', '.join(sorted(KINDS))}."
        )
    where = f"{where} ({kind})"
    _check_keys(where, cls, raw)
    try:
        return cls(**{key: value for key, value in raw.items() if key != "kind"})
    except InvalidParameter as exc:
        raise InvalidParameter(f"{where}: {exc.message}") from None


def _check_keys(where: str, cls: type[Expectation], raw: Mapping[Any, Any]) -> None:
    """Refuse a key the kind does not have, and a missing key it needs."""
    allowed = {field.name for field in fields(cls)}
    unknown = sorted(repr(key) for key in raw if key != "kind" and key not in allowed)
    if unknown:
        raise InvalidParameter(
            f"{where}: unknown key {unknown[0]}; allowed: {', '.join(sorted(allowed))}."
        )
    missing = sorted(
        field.name
        for field in fields(cls)
        if field.default is dataclasses.MISSING and field.name not in raw
    )
    if missing:
        raise InvalidParameter(f"{where}: missing key {missing[0]!r}.")


class SuiteBuilder:
    """Builds a :class:`Suite` one expectation at a time; every method returns the builder.
    Each expectation is checked as it is added (``InvalidParameter``)."""

    def __init__(self) -> None:
        self._expectations: list[Expectation] = []

    def add(self, expectation: Expectation) -> SuiteBuilder:
        self._expectations.append(expectation)
        return self

    def column_type(
        self, column: str, arrow_type: str, *, severity: Severity = "error", description: str = ""
    ) -> SuiteBuilder:
        return self.add(
            ColumnType(
                column=column, arrow_type=arrow_type, severity=severity, description=description
            )
        )

    def not_null(
        self, column: str, *, severity: Severity = "error", description: str = ""
    ) -> SuiteBuilder:
        return self.add(NotNull(column=column, severity=severity, description=description))

    def range(
        self,
        column: str,
        min: Bound | None = None,
        max: Bound | None = None,
        *,
        min_inclusive: bool = True,
        max_inclusive: bool = True,
        severity: Severity = "error",
        description: str = "",
    ) -> SuiteBuilder:
        return self.add(
            InRange(
                column=column,
                min=min,
                max=max,
                min_inclusive=min_inclusive,
                max_inclusive=max_inclusive,
                severity=severity,
                description=description,
            )
        )

    def in_set(
        self,
        column: str,
        values: Iterable[Scalar],
        *,
        severity: Severity = "error",
        description: str = "",
    ) -> SuiteBuilder:
        return self.add(
            InSet(column=column, values=tuple(values), severity=severity, description=description)
        )

    def regex(
        self, column: str, pattern: str, *, severity: Severity = "error", description: str = ""
    ) -> SuiteBuilder:
        return self.add(
            MatchesRegex(column=column, pattern=pattern, severity=severity, description=description)
        )

    def unique(
        self, *columns: str, severity: Severity = "error", description: str = ""
    ) -> SuiteBuilder:
        return self.add(Unique(columns=columns, severity=severity, description=description))

    def row_count(
        self,
        min: int | None = None,
        max: int | None = None,
        *,
        severity: Severity = "error",
        description: str = "",
    ) -> SuiteBuilder:
        return self.add(RowCount(min=min, max=max, severity=severity, description=description))

    def freshness(
        self,
        column: str,
        max_age: timedelta | int | str,
        *,
        severity: Severity = "error",
        description: str = "",
    ) -> SuiteBuilder:
        return self.add(
            Fresh(
                column=column,
                max_age=max_age,  # type: ignore[arg-type]  # normalised when made
                severity=severity,
                description=description,
            )
        )

    def sql(
        self, query: str, *, severity: Severity = "error", description: str = ""
    ) -> SuiteBuilder:
        return self.add(CustomSql(sql=query, severity=severity, description=description))

    def build(self) -> Suite:
        return Suite(tuple(self._expectations))
