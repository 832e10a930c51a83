"""Evaluating a suite against one dataset version's Parquet files.

All built-in checks are compiled into ONE aggregate query that DuckDB answers in a single
scan of the files (each check a ``count(*) FILTER (WHERE ...)`` or an aggregate of its own).
Only the checks that fail cost more: a query each for up to ``sample_rows`` failing rows.
Custom SQL checks run one query each, confined as :mod:`._confined` describes. Checks that
the files' schemas decide (a column type, a missing column, a range over a column of another
kind) are answered from the Parquet footers without a query.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

from shamal.datasets._columns import canonical_type, column_kind, jsonable
from shamal.datasets._confined import ConfinedDatabase, quote_identifier, quote_text
from shamal.datasets._expectations import (
    ColumnType,
    CustomSql,
    Expectation,
    Fresh,
    InRange,
    InSet,
    MatchesRegex,
    NotNull,
    RowCount,
    Severity,
    Suite,
    Unique,
    as_utc_naive,
)
from shamal.errors import InvalidParameter

__all__ = ["REDACTED", "ExpectationResult", "Report", "validate"]

logger = logging.getLogger(__name__)

#: What a sample shows in place of a personal column's value.
REDACTED: Final = "<redacted>"
MAX_SAMPLE_ROWS: Final = 100
_EPOCH: Final = datetime(1970, 1, 1)
_MICROSECOND: Final = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class ExpectationResult:
    """How one expectation fared.

    ``failing`` counts the failing rows of a row-level check (for ``unique``, the rows
    beyond the first of each value; for custom SQL, the rows the query returned); it is 0
    for checks of the whole table (column type, row count, freshness), whose ``observed``
    says what was found. ``samples`` holds up to the validation's ``sample_rows`` failing
    rows as JSON-able mappings.
    """

    index: int
    kind: str
    severity: Severity
    description: str
    columns: tuple[str, ...]
    passed: bool
    failing: int
    observed: Any
    message: str
    samples: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "severity": self.severity,
            "description": self.description,
            "columns": list(self.columns),
            "passed": self.passed,
            "failing": self.failing,
            "observed": self.observed,
            "message": self.message,
            "samples": list(self.samples),
        }


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of a validation: one result per expectation, in the suite's order."""

    rows: int
    results: tuple[ExpectationResult, ...]

    @property
    def ok(self) -> bool:
        """False when any expectation of severity ``error`` failed; warnings never fail."""
        return all(r.passed for r in self.results if r.severity == "error")

    @property
    def failed(self) -> tuple[ExpectationResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "rows": self.rows, "results": [r.to_json() for r in self.results]}


@dataclass(frozen=True, slots=True)
class _Verdict:
    passed: bool
    failing: int = 0
    observed: Any = None
    message: str = ""


#: Turns the values of a check's aggregates (and the row count) into its verdict.
_Judge = Callable[[Sequence[Any], int], _Verdict]


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one built-in check is answered: from the schema (``verdict``), or from aggregates
    of the one query (``aggregates`` judged by ``judge``), with ``failing_rows`` the clause
    after ``FROM data`` that selects failing rows for samples."""

    aggregates: tuple[str, ...] = ()
    judge: _Judge | None = None
    failing_rows: str | None = None
    verdict: _Verdict | None = None


class _Schema:
    """The columns of the files: each name with its types, in the order the files give them."""

    def __init__(self, schemas: Iterable[Any]) -> None:
        self.types: dict[str, list[Any]] = {}
        for schema in schemas:
            for field in schema:
                known = self.types.setdefault(field.name, [])
                if not any(field.type.equals(t) for t in known):
                    known.append(field.type)

    def first(self, name: str) -> Any:
        return self.types[name][0]


def validate(
    suite: Suite,
    parquet_paths: Sequence[Path],
    *,
    now: datetime,
    personal: Iterable[str] = (),
    sample_rows: int = 5,
    timeout_s: float = 60.0,
) -> Report:
    """Evaluate every expectation of ``suite`` against the Parquet files of one version.

    Args:
        suite: the expectations.
        parquet_paths: the version's Parquet files (read as one table, columns by name).
        now: the time freshness is measured against (aware).
        personal: columns whose values samples show as ``REDACTED``; when any is given,
            custom SQL checks show no samples (their columns cannot be traced to the data).
        sample_rows: failing rows to show per failed expectation (0 to 100).
        timeout_s: the time all queries together may take.

    Returns:
        The report; ``report.ok`` is False when an error-severity expectation failed.

    Raises:
        InvalidParameter: no files or a missing or unreadable file; a naive ``now``; a
            pattern RE2 refuses; custom SQL that is not one SELECT or that fails (a refused
            file access among others); queries running past ``timeout_s``.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise InvalidParameter("validation needs an aware 'now' (with a time zone).")
    if not 0 <= sample_rows <= MAX_SAMPLE_ROWS:
        raise InvalidParameter(f"'sample_rows' must be in [0, {MAX_SAMPLE_ROWS}].")
    hidden = frozenset(personal)
    with ConfinedDatabase(list(parquet_paths), timeout_s=timeout_s) as db:
        schema = _Schema(_read_schemas(parquet_paths))
        _check_patterns(db, suite)
        plans = {
            index: _plan(expectation, schema, now)
            for index, expectation in enumerate(suite.expectations)
            if not isinstance(expectation, CustomSql)
        }
        rows, values = _aggregate(db, plans)
        results = []
        for index, expectation in enumerate(suite.expectations):
            if isinstance(expectation, CustomSql):
                verdict, samples = _custom(db, index, expectation, sample_rows, hidden)
            else:
                verdict = plans[index].verdict or _judged(plans[index], values[index], rows)
                samples = _samples(db, index, plans[index], verdict, sample_rows, hidden)
            results.append(_result(index, expectation, verdict, samples, hidden))
    report = Report(rows, tuple(results))
    logger.info("validated %d expectations over %d rows: ok=%s", len(results), rows, report.ok)
    return report


def _read_schemas(paths: Sequence[Path]) -> list[Any]:
    schemas = []
    for number, path in enumerate(paths, start=1):
        try:
            schemas.append(pq.read_schema(path))
        except (pa.ArrowException, OSError):
            raise InvalidParameter(f"Parquet file {number} is not readable as Parquet.") from None
    return schemas


def _check_patterns(db: ConfinedDatabase, suite: Suite) -> None:
    """Refuse a pattern DuckDB's RE2 does not take, before it breaks the one query."""
    for index, expectation in enumerate(suite.expectations):
        if isinstance(expectation, MatchesRegex):
            db.row(
                f"expectations[{index}] (regex): the pattern",
                "SELECT regexp_full_match('', ?)",
                [expectation.pattern],
            )


def _aggregate(
    db: ConfinedDatabase, plans: dict[int, _Plan]
) -> tuple[int, dict[int, tuple[Any, ...]]]:
    """Every check's aggregates in one query; the row count and each check's values."""
    expressions = ["count(*)"]
    spans: dict[int, tuple[int, int]] = {}
    for index, plan in plans.items():
        if plan.verdict is None:
            spans[index] = (len(expressions), len(expressions) + len(plan.aggregates))
            expressions.extend(plan.aggregates)
    # Each aggregate is built from quoted identifiers and literals (quote_identifier, _literal).
    query = f"SELECT {', '.join(expressions)} FROM data"  # nosec B608
    row = db.row("the suite's checks", query)
    values = {index: row[start:end] for index, (start, end) in spans.items()}
    return int(row[0]), values


def _judged(plan: _Plan, values: Sequence[Any], rows: int) -> _Verdict:
    assert plan.judge is not None
    return plan.judge(values, rows)


def _result(
    index: int,
    expectation: Expectation,
    verdict: _Verdict,
    samples: tuple[dict[str, Any], ...],
    hidden: frozenset[str],
) -> ExpectationResult:
    observed = verdict.observed
    if hidden & set(expectation.column_names) and not isinstance(expectation, ColumnType):
        observed = None if observed is None else REDACTED
    return ExpectationResult(
        index=index,
        kind=expectation.kind,
        severity=expectation.severity,
        description=expectation.description,
        columns=expectation.column_names,
        passed=verdict.passed,
        failing=verdict.failing,
        observed=observed,
        message=verdict.message,
        samples=samples,
    )


def _rows_as_json(
    names: Sequence[str], rows: Sequence[tuple[Any, ...]], hidden: frozenset[str]
) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            name: REDACTED if name in hidden else jsonable(value)
            for name, value in zip(names, row, strict=True)
        }
        for row in rows
    )


def _samples(
    db: ConfinedDatabase,
    index: int,
    plan: _Plan,
    verdict: _Verdict,
    limit: int,
    hidden: frozenset[str],
) -> tuple[dict[str, Any], ...]:
    if verdict.passed or plan.failing_rows is None or not limit:
        return ()
    names, rows = db.rows(
        f"expectations[{index}]: the failing rows",
        # A predicate of quoted identifiers and literals; limit is an int.
        f"SELECT * FROM data WHERE {plan.failing_rows} LIMIT {limit}",  # nosec B608
    )
    return _rows_as_json(names, rows, hidden)


def _custom(
    db: ConfinedDatabase, index: int, check: CustomSql, limit: int, hidden: frozenset[str]
) -> tuple[_Verdict, tuple[dict[str, Any], ...]]:
    count, names, rows = db.user_query(f"expectations[{index}] (sql)", check.sql, limit)
    verdict = _Verdict(
        count == 0, count, None, "" if count == 0 else f"the query returned {count} rows"
    )
    return verdict, () if hidden else _rows_as_json(names, rows, hidden)


# ---------------------------------------------------------------- one plan per kind


def _plan(expectation: Expectation, schema: _Schema, now: datetime) -> _Plan:
    missing = [name for name in expectation.column_names if name not in schema.types]
    if missing:
        return _Plan(verdict=_Verdict(False, message=f"column {missing[0]!r} is not in the data"))
    planner = _PLANNERS[type(expectation)]
    return planner(expectation, schema, now)


def _mismatch(column: str, data_type: Any, wanted: str) -> _Plan:
    message = f"{column!r} is {data_type}, not {wanted}"
    return _Plan(verdict=_Verdict(False, observed=str(data_type), message=message))


def _value_type(data_type: Any) -> Any:
    """The type of the values: a dictionary's value type, else the type itself."""
    return data_type.value_type if pa.types.is_dictionary(data_type) else data_type


#: What a column must hold for bounds or values of each family.
_FAMILY_NEEDS: Final[dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "number": ("a number", lambda t: _is_number_type(t)),
    "time": ("a date or timestamp", lambda t: column_kind(t) == "temporal"),
    "text": ("a string", lambda t: column_kind(t) == "string"),
    "bool": ("a boolean", lambda t: bool(pa.types.is_boolean(t))),
}


def _incompatible(column: str, data_type: Any, family: str) -> _Plan | None:
    """A failed plan when the column cannot hold values of ``family``, else None."""
    wanted, holds = _FAMILY_NEEDS[family]
    return None if holds(_value_type(data_type)) else _mismatch(column, data_type, wanted)


def _count_judge(values: Sequence[Any], rows: int) -> _Verdict:
    failing = int(values[0] or 0)
    message = f"{failing} of {rows} rows fail" if failing else ""
    return _Verdict(failing == 0, failing, None, message)


def _counting(where: str) -> _Plan:
    """A row-level check: the rows matching ``where`` fail."""
    return _Plan((f"count(*) FILTER (WHERE {where})",), _count_judge, where)


def _type_name(data_type: Any) -> str:
    return canonical_type(str(_value_type(data_type)))


def _plan_column_type(e: Any, schema: _Schema, now: datetime) -> _Plan:
    found = [_type_name(t) for t in schema.types[e.column]]
    passed = [name.casefold() for name in found] == [canonical_type(e.arrow_type).casefold()]
    observed = found[0] if len(found) == 1 else found
    message = "" if passed else f"{e.column!r} is {' / '.join(found)}, not {e.arrow_type}"
    return _Plan(verdict=_Verdict(passed, observed=observed, message=message))


def _plan_not_null(e: Any, schema: _Schema, now: datetime) -> _Plan:
    return _counting(f"{quote_identifier(e.column)} IS NULL")


def _is_number_type(data_type: Any) -> bool:
    return bool(
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_decimal(data_type)
    )


def _plan_range(e: InRange, schema: _Schema, now: datetime) -> _Plan:
    data_type = schema.first(e.column)
    refused = _incompatible(e.column, data_type, e.family)
    if refused is not None:
        return refused
    column = quote_identifier(e.column)
    compared, render = column, _literal
    if e.family == "time":
        compared, render = f"epoch_us({column})", _epoch_literal
    inside = []
    if e.min is not None:
        inside.append(f"{compared} {'>=' if e.min_inclusive else '>'} {render(e.min)}")
    if e.max is not None:
        inside.append(f"{compared} {'<=' if e.max_inclusive else '<'} {render(e.max)}")
    nan = f"isnan({column}) OR " if pa.types.is_floating(_value_type(data_type)) else ""
    return _counting(f"{column} IS NOT NULL AND ({nan}NOT ({' AND '.join(inside)}))")


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return quote_text(value)
    return repr(value)


def _epoch_literal(value: Any) -> str:
    return str((as_utc_naive(value) - _EPOCH) // _MICROSECOND)


def _plan_in_set(e: InSet, schema: _Schema, now: datetime) -> _Plan:
    data_type = schema.first(e.column)
    refused = _incompatible(e.column, data_type, e.family)
    if refused is not None:
        return refused
    column = quote_identifier(e.column)
    compared = column
    if e.family == "number":
        exact = pa.types.is_integer(_value_type(data_type)) and all(
            isinstance(v, int) for v in e.values
        )
        compared = column if exact else f"CAST({column} AS DOUBLE)"
    listed = ", ".join(
        ("true" if v else "false") if isinstance(v, bool) else _literal(v) for v in e.values
    )
    return _counting(f"{column} IS NOT NULL AND {compared} NOT IN ({listed})")


def _plan_regex(e: MatchesRegex, schema: _Schema, now: datetime) -> _Plan:
    column = quote_identifier(e.column)
    return _counting(
        f"{column} IS NOT NULL AND NOT regexp_full_match(CAST({column} AS VARCHAR), "
        f"{quote_text(e.pattern)})"
    )


def _plan_unique(e: Unique, schema: _Schema, now: datetime) -> _Plan:
    columns = [quote_identifier(name) for name in e.columns]
    present = " AND ".join(f"{c} IS NOT NULL" for c in columns)
    key = columns[0] if len(columns) == 1 else f"({', '.join(columns)})"
    listed = ", ".join(columns)
    return _Plan(
        aggregates=(
            f"count(*) FILTER (WHERE {present}) - count(DISTINCT {key}) FILTER (WHERE {present})",
        ),
        judge=_count_judge,
        failing_rows=(
            f"{present} QUALIFY count(*) OVER (PARTITION BY {listed}) > 1 ORDER BY {listed}"
        ),
    )


def _plan_row_count(e: RowCount, schema: _Schema, now: datetime) -> _Plan:
    def judge(values: Sequence[Any], rows: int) -> _Verdict:
        low = e.min if e.min is not None else 0
        passed = low <= rows and (e.max is None or rows <= e.max)
        wanted = f"[{e.min if e.min is not None else 0}, {'any' if e.max is None else e.max}]"
        return _Verdict(passed, 0, rows, "" if passed else f"{rows} rows, expected {wanted}")

    return _Plan(judge=judge)


def _plan_fresh(e: Fresh, schema: _Schema, now: datetime) -> _Plan:
    refused = _incompatible(e.column, schema.first(e.column), "time")
    if refused is not None:
        return refused
    now_us = int(_epoch_literal(now))
    limit_us = e.max_age // _MICROSECOND

    def judge(values: Sequence[Any], rows: int) -> _Verdict:
        newest = values[0]
        if newest is None:
            return _Verdict(False, 0, None, f"{e.column!r} has no values")
        age_us = now_us - int(newest)
        observed = {
            "newest": (_EPOCH + timedelta(microseconds=int(newest))).isoformat() + "Z",
            "age_seconds": age_us / 1e6,
        }
        passed = age_us <= limit_us
        message = "" if passed else f"the newest value is {age_us / 1e6:g} s old"
        return _Verdict(passed, 0, observed, message)

    return _Plan((f"epoch_us(max({quote_identifier(e.column)}))",), judge)


_PLANNERS: Final[dict[type[Expectation], Callable[[Any, _Schema, datetime], _Plan]]] = {
    ColumnType: _plan_column_type,
    NotNull: _plan_not_null,
    InRange: _plan_range,
    InSet: _plan_in_set,
    MatchesRegex: _plan_regex,
    Unique: _plan_unique,
    RowCount: _plan_row_count,
    Fresh: _plan_fresh,
}
