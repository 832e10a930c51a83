"""Expectation suites as declared: YAML in and out, the builder, and what is refused."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shamal.datasets import (
    MAX_EXPECTATIONS,
    MAX_SUITE_BYTES,
    CustomSql,
    Fresh,
    InRange,
    InSet,
    NotNull,
    RowCount,
    Suite,
    Unique,
)
from shamal.errors import InvalidParameter

SUITE = """
version: 1
expectations:
  - kind: not_null
    column: id
  - kind: range
    column: age
    min: 0
    max: 130
    max_inclusive: false
    severity: warning
    description: people are younger than that
  - kind: in_set
    column: status
    values: [active, closed]
  - kind: regex
    column: email
    pattern: '[^@]+@[^@]+'
  - kind: unique
    columns: [id, day]
  - kind: row_count
    min: 1
  - kind: freshness
    column: at
    max_age: 36h
  - kind: column_type
    column: id
    arrow_type: int64
  - kind: range
    column: day
    min: 2024-01-01
  - kind: sql
    sql: SELECT * FROM data WHERE ended < started
"""


def test_a_suite_file_reads_into_expectations() -> None:
    suite = Suite.from_yaml(SUITE)
    assert len(suite) == 10
    assert suite.expectations[0] == NotNull(column="id")
    assert suite.expectations[1] == InRange(
        column="age",
        min=0,
        max=130,
        max_inclusive=False,
        severity="warning",
        description="people are younger than that",
    )
    assert suite.expectations[2] == InSet(column="status", values=("active", "closed"))
    assert suite.expectations[4] == Unique(columns=("id", "day"))
    assert suite.expectations[6] == Fresh(column="at", max_age=timedelta(hours=36))
    assert suite.expectations[8] == InRange(column="day", min=date(2024, 1, 1))
    assert isinstance(suite.expectations[9], CustomSql)
    assert Suite.from_yaml(suite.to_yaml()) == suite
    assert Suite.from_yaml(SUITE.encode()) == suite


def test_the_builder_makes_the_same_suite() -> None:
    built = (
        Suite.builder()
        .not_null("id")
        .range(
            "age",
            0,
            130,
            max_inclusive=False,
            severity="warning",
            description="people are younger than that",
        )
        .in_set("status", ["active", "closed"])
        .regex("email", "[^@]+@[^@]+")
        .unique("id", "day")
        .row_count(min=1)
        .freshness("at", "36h")
        .column_type("id", "int64")
        .range("day", min=date(2024, 1, 1))
        .sql("SELECT * FROM data WHERE ended < started")
        .build()
    )
    assert built == Suite.from_yaml(SUITE)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "expectations:\n  - {kind: not_null, column: id, colunm: x}",
            r"expectations\[0\] \(not_null\): unknown key 'colunm'",
        ),
        (
            "expectations:\n  - {kind: not_null, column: id}\n  - {kind: range, column: a, mn: 1}",
            r"expectations\[1\] \(range\): unknown key 'mn'",
        ),
        ("expectations: []\nextra: 1", "unknown key 'extra'"),
        ("expectations:\n  - {kind: nope}", r"expectations\[0\]: unknown kind 'nope'"),
        ("expectations:\n  - {column: id}", "unknown kind None"),
        ("expectations:\n  - {kind: not_null}", r"\(not_null\): missing key 'column'"),
        ("expectations:\n  - {kind: not_null, column: 5}", r"'column' must be a column name"),
        (
            "expectations:\n  - {kind: range, column: a, min: x, max: 5}",
            r"\(range\): 'min' and 'max'",
        ),
        ("expectations:\n  - {kind: range, column: a, min: 5, max: 1}", "'min' is above 'max'"),
        ("expectations:\n  - {kind: range, column: a}", "needs 'min', 'max' or both"),
        ("expectations:\n  - {kind: range, column: a, min: .nan}", "finite number"),
        (
            "expectations:\n  - {kind: range, column: a, min: 1, min_inclusive: yes please}",
            "'min_inclusive' must be true or false",
        ),
        ("expectations:\n  - {kind: in_set, column: a, values: [1, x]}", "all texts, all numbers"),
        ("expectations:\n  - {kind: in_set, column: a, values: abc}", "'values' must be a list"),
        ("expectations:\n  - {kind: in_set, column: a, values: []}", "1 to 10000"),
        ("expectations:\n  - {kind: regex, column: a, pattern: '('}", "not a regular expression"),
        ("expectations:\n  - {kind: unique, columns: [a, a]}", "once"),
        ("expectations:\n  - {kind: row_count, min: -1}", "'min' must not be negative"),
        ("expectations:\n  - {kind: row_count, max: 2.5}", "'max' must be a whole number"),
        (
            "expectations:\n  - {kind: freshness, column: t, max_age: soon}",
            "'max_age' must be seconds",
        ),
        (
            "expectations:\n  - {kind: freshness, column: t, max_age: 0}",
            "'max_age' must be positive",
        ),
        (
            "expectations:\n  - {kind: not_null, column: a, severity: fatal}",
            "'severity' must be error or warning",
        ),
        (
            "expectations:\n  - {kind: sql, sql: 'DROP VIEW data'}",
            r"\(sql\): 'sql': the SQL must be a SELECT",
        ),
        (
            "expectations:\n  - {kind: sql, sql: 'SELECT 1; SELECT 2'}",
            "exactly one SELECT statement; it holds 2",
        ),
        ("expectations:\n  - {kind: sql, sql: 'SELEC 1'}", "does not parse"),
        ("expectations: {kind: not_null}", "'expectations' must be a list"),
        ("version: 2\nexpectations: []", "'version' must be 1"),
        ("- 1\n- 2", "a suite is a mapping"),
        ("expectations: [", "not valid YAML at line"),
        ("a: &x [1]\nexpectations: *x", "aliases"),
        ("expectations:\n  - !!python/object:os.system {}", "not valid YAML"),
    ],
)
def test_a_bad_suite_file_is_refused_with_the_key_named(text: str, message: str) -> None:
    with pytest.raises(InvalidParameter, match=message):
        Suite.from_yaml(text)


def test_suite_files_are_bounded_in_size_and_count() -> None:
    with pytest.raises(InvalidParameter, match="at most"):
        Suite.from_yaml("#" * (MAX_SUITE_BYTES + 1))
    many = "expectations:\n" + "  - {kind: row_count, min: 0}\n" * (MAX_EXPECTATIONS + 1)
    assert len(many.encode()) < MAX_SUITE_BYTES
    with pytest.raises(InvalidParameter, match=f"at most {MAX_EXPECTATIONS}"):
        Suite.from_yaml(many)
    with pytest.raises(InvalidParameter, match="UTF-8"):
        Suite.from_yaml(b"\xff\xfe")


def test_expectations_check_their_parameters_when_made_in_python() -> None:
    with pytest.raises(InvalidParameter, match="'min' is above 'max'"):
        Suite.builder().range("t", datetime(2024, 1, 2, tzinfo=UTC), date(2024, 1, 1))
    with pytest.raises(InvalidParameter, match="two numbers, texts or times"):
        Suite.builder().range("t", True, None)
    with pytest.raises(InvalidParameter, match="only expectations"):
        Suite(("not an expectation",))  # type: ignore[arg-type]
    assert RowCount(min=0).column_names == ()
    assert Unique(columns="id").columns == ("id",)  # type: ignore[arg-type]
    assert Fresh(column="t", max_age=90).max_age == timedelta(seconds=90)  # type: ignore[arg-type]


_names = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=20
)
_numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False))
_times = st.one_of(
    st.dates(),
    st.datetimes(timezones=st.sampled_from([None, UTC])),
)


def _ranges(low_high: st.SearchStrategy[object]) -> st.SearchStrategy[InRange]:
    return st.builds(
        lambda column, pair, inc: InRange(
            column=column, min=min(pair), max=max(pair), min_inclusive=inc
        ),
        _names,
        st.tuples(low_high, low_high),
        st.booleans(),
    )


_expectations = st.one_of(
    st.builds(
        lambda c, s: NotNull(column=c, severity=s), _names, st.sampled_from(["error", "warning"])
    ),
    _ranges(_numbers),
    _ranges(_names),
    st.builds(lambda c, d: InRange(column=c, max=d), _names, _times),
    st.builds(
        lambda c, v: InSet(column=c, values=tuple(v)),
        _names,
        st.lists(_names, min_size=1, max_size=5),
    ),
    st.builds(
        lambda c, v: InSet(column=c, values=tuple(v)),
        _names,
        st.lists(_numbers, min_size=1, max_size=5),
    ),
    st.builds(
        lambda c, v: InSet(column=c, values=tuple(v)),
        _names,
        st.lists(st.booleans(), min_size=1, max_size=2),
    ),
    st.builds(
        lambda cs: Unique(columns=tuple(cs)), st.lists(_names, min_size=1, max_size=3, unique=True)
    ),
    st.builds(lambda s: Fresh(column="t", max_age=timedelta(seconds=s)), st.integers(1, 10**9)),
    st.builds(lambda d: NotNull(column="x", description=d), _names),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_expectations, max_size=8))
def test_any_suite_round_trips_through_yaml(expectations: list[object]) -> None:
    suite = Suite(tuple(expectations))  # type: ignore[arg-type]
    assert Suite.from_yaml(suite.to_yaml()) == suite
