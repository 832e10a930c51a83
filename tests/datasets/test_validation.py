"""Validating Parquet files against suites: every kind passing and failing, samples,
severities, personal columns, and custom SQL kept to the version it checks."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shamal.datasets import REDACTED, CustomSql, Report, Suite, validate
from shamal.errors import InvalidParameter

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def _write(folder: Path, name: str, table: pa.Table) -> Path:
    path = folder / name
    pq.write_table(table, path)
    return path


@pytest.fixture
def people(tmp_path: Path) -> Path:
    """Ten people, with one flaw of each sort planted where a check can see it."""
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 9], pa.int64()),
            "age": pa.array([30, 41, None, 25, 131, 60, 18, 77, 52, 52], pa.int64()),
            "score": pa.array([0.5, 0.1, 0.9, float("nan"), 0.3, 0.2, 0.8, 0.7, 0.4, 0.6]),
            "status": [
                "active",
                "active",
                "closed",
                "lost",
                "active",
                "closed",
                "active",
                "active",
                "closed",
                "active",
            ],
            "email": [
                "a@x.io",
                "b@x.io",
                "c@x.io",
                "d@x.io",
                "e@x.io",
                "bad",
                "g@x.io",
                "h@x.io",
                "i@x.io",
                "j@x.io",
            ],
            "at": pa.array(
                [datetime(2024, 6, 1, 11, 0) - timedelta(days=i) for i in range(10)],
                pa.timestamp("us", tz="UTC"),
            ),
            "day": pa.array([date(2024, 1, 1 + i) for i in range(10)]),
        }
    )
    return _write(tmp_path, "people.parquet", table)


def _run(suite: Suite, path: Path, **options: object) -> Report:
    return validate(suite, [path], now=options.pop("now", NOW), **options)  # type: ignore[arg-type]


def _only(report: Report) -> tuple[bool, int]:
    (result,) = report.results
    return result.passed, result.failing


@pytest.mark.parametrize(
    ("passing", "failing", "failing_rows"),
    [
        (Suite.builder().not_null("id"), Suite.builder().not_null("age"), 1),
        (Suite.builder().range("age", 0, 131), Suite.builder().range("age", 0, 130), 1),
        (
            Suite.builder().range("age", 18, None),
            Suite.builder().range("age", 18, None, min_inclusive=False),
            1,
        ),
        (
            Suite.builder().range("day", date(2024, 1, 1), date(2024, 1, 10)),
            Suite.builder().range("day", None, datetime(2024, 1, 9, 23, tzinfo=UTC)),
            1,
        ),
        (
            Suite.builder().range("at", datetime(2024, 5, 1, tzinfo=UTC)),
            Suite.builder().range("at", datetime(2024, 5, 30, tzinfo=UTC)),
            7,
        ),
        (
            Suite.builder().range("status", "active", "lost"),
            Suite.builder().range("status", "b", "z"),
            6,
        ),
        (
            Suite.builder().in_set("status", ["active", "closed", "lost"]),
            Suite.builder().in_set("status", ["active", "closed"]),
            1,
        ),
        (Suite.builder().in_set("id", range(1, 10)), Suite.builder().in_set("id", [1.0, 2.5]), 9),
        (
            Suite.builder().regex("status", "[a-z]+"),
            Suite.builder().regex("email", r"[^@]+@[^@]+"),
            1,
        ),
        (Suite.builder().regex("id", r"\d"), Suite.builder().regex("id", "[1-8]"), 2),
        (Suite.builder().unique("email"), Suite.builder().unique("id"), 1),
        (Suite.builder().unique("id", "score"), Suite.builder().unique("id", "age"), 1),
        (Suite.builder().unique("id", "email"), Suite.builder().unique("status"), 7),
        (
            Suite.builder().sql("SELECT * FROM data WHERE age > 200"),
            Suite.builder().sql(
                "WITH old AS (SELECT * FROM data WHERE age > 70) SELECT * FROM old;"
            ),
            2,
        ),
    ],
)
def test_each_kind_passes_and_fails(
    people: Path, passing: object, failing: object, failing_rows: int
) -> None:
    assert _only(_run(passing.build(), people)) == (True, 0)  # type: ignore[attr-defined]
    assert _only(_run(failing.build(), people)) == (False, failing_rows)  # type: ignore[attr-defined]


def test_nan_is_out_of_every_range(people: Path) -> None:
    report = _run(Suite.builder().range("score", 0.0, 1.0).build(), people)
    assert _only(report) == (False, 1)
    (sample,) = report.results[0].samples
    assert (sample["id"], sample["score"]) == (4, "nan")


@pytest.mark.parametrize(
    ("suite", "passed", "observed"),
    [
        (Suite.builder().row_count(10, 10), True, 10),
        (Suite.builder().row_count(max=9), False, 10),
        (Suite.builder().row_count(min=11), False, 10),
        (Suite.builder().column_type("id", "int64"), True, "int64"),
        (Suite.builder().column_type("score", "float64"), True, "double"),
        (Suite.builder().column_type("status", "large_string"), True, "string"),
        (Suite.builder().column_type("at", "timestamp[us, tz=UTC]"), True, "timestamp[us, tz=UTC]"),
        (Suite.builder().column_type("id", "int32"), False, "int64"),
        (
            Suite.builder().freshness("at", "1h"),
            True,
            {"newest": "2024-06-01T11:00:00Z", "age_seconds": 3600.0},
        ),
        (
            Suite.builder().freshness("at", "59m"),
            False,
            {"newest": "2024-06-01T11:00:00Z", "age_seconds": 3600.0},
        ),
        (
            Suite.builder().freshness("day", "160d"),
            True,
            {"newest": "2024-01-10T00:00:00Z", "age_seconds": 12_398_400.0},
        ),
    ],
)
def test_table_level_checks(people: Path, suite: object, passed: bool, observed: object) -> None:
    (result,) = _run(suite.build(), people).results  # type: ignore[attr-defined]
    assert (result.passed, result.failing, result.observed) == (passed, 0, observed)
    assert bool(result.message) is not passed


def test_freshness_follows_the_injected_now(people: Path) -> None:
    suite = Suite.builder().freshness("at", timedelta(hours=2)).build()
    assert _run(suite, people, now=NOW).ok
    assert not _run(suite, people, now=NOW + timedelta(hours=1, seconds=1)).ok
    with pytest.raises(InvalidParameter, match="aware"):
        validate(suite, [people], now=datetime(2024, 6, 1))


def test_checks_that_cannot_apply_fail_with_a_reason(people: Path) -> None:
    suite = (
        Suite.builder()
        .not_null("missing")
        .range("status", 0, 1)
        .range("age", "a", "b")
        .in_set("age", ["x"])
        .in_set("status", [True])
        .freshness("age", "1d")
        .build()
    )
    report = _run(suite, people)
    assert [r.passed for r in report.results] == [False] * 6
    assert report.results[0].message == "column 'missing' is not in the data"
    assert report.results[1].message == "'status' is string, not a number"
    assert report.results[5].message == "'age' is int64, not a date or timestamp"


def test_warnings_are_reported_but_only_errors_fail(people: Path) -> None:
    warned = Suite.builder().not_null("age", severity="warning").not_null("id").build()
    report = _run(warned, people)
    assert report.ok
    assert [r.passed for r in report.failed] == [False]
    assert report.failed[0].severity == "warning"
    errored = Suite.builder().not_null("age").not_null("id", severity="warning").build()
    assert not _run(errored, people).ok
    assert _run(Suite(), people).ok


def test_samples_show_up_to_the_limit_of_failing_rows(people: Path) -> None:
    report = _run(Suite.builder().range("age", 0, 50).build(), people)
    result = report.results[0]
    assert result.failing == 5
    assert len(result.samples) == 5
    assert all(s["age"] > 50 for s in result.samples)
    assert set(result.samples[0]) == {"id", "age", "score", "status", "email", "at", "day"}
    assert isinstance(result.samples[0]["at"], str)
    fewer = _run(Suite.builder().range("age", 0, 50).build(), people, sample_rows=2)
    assert len(fewer.results[0].samples) == 2
    none = _run(Suite.builder().range("age", 0, 50).build(), people, sample_rows=0)
    assert none.results[0].samples == ()
    dupes = _run(Suite.builder().unique("id").build(), people).results[0]
    assert [s["id"] for s in dupes.samples] == [9, 9]
    custom = _run(Suite.builder().sql("SELECT id, age FROM data WHERE age > 70").build(), people)
    assert sorted(custom.results[0].samples, key=lambda s: s["id"]) == [
        {"id": 5, "age": 131},
        {"id": 8, "age": 77},
    ]
    json.dumps(report.to_json(), allow_nan=False)


def test_personal_columns_are_redacted_in_samples(people: Path) -> None:
    suite = (
        Suite.builder()
        .regex("email", r"[^@]+@[^@]+")
        .sql("SELECT email FROM data WHERE email NOT LIKE '%@%'")
        .build()
    )
    report = _run(suite, people, personal={"email"})
    regex, custom = report.results
    assert regex.samples[0]["email"] == REDACTED
    assert regex.samples[0]["id"] == 6
    assert custom.failing == 1
    assert custom.samples == ()
    assert "bad" not in json.dumps(report.to_json())


def test_several_files_are_one_table(tmp_path: Path) -> None:
    first = _write(tmp_path, "a.parquet", pa.table({"id": [1, 2], "v": [1.0, 2.0]}))
    second = _write(tmp_path, "b.parquet", pa.table({"id": [2, 3], "w": ["x", "y"]}))
    suite = (
        Suite.builder()
        .row_count(4, 4)
        .unique("id")
        .not_null("v")
        .column_type("id", "int64")
        .build()
    )
    report = validate(suite, [first, second], now=NOW)
    assert [(r.passed, r.failing) for r in report.results] == [
        (True, 0),
        (False, 1),
        (False, 2),
        (True, 0),
    ]
    retyped = _write(tmp_path, "c.parquet", pa.table({"id": pa.array([4], pa.int32())}))
    typed = validate(Suite.builder().column_type("id", "int64").build(), [first, retyped], now=NOW)
    assert typed.results[0].observed == ["int64", "int32"]
    assert not typed.ok


def test_the_aggregate_query_scans_once_for_all_checks(people: Path) -> None:
    """Many checks, one query: a hundred passing checks cost what one does, give or take."""
    builder = Suite.builder()
    for _ in range(100):
        builder.not_null("id").range("age", 0, 200).in_set("status", ["active", "closed", "lost"])
    report = _run(builder.build(), people)
    assert len(report.results) == 300
    assert report.ok


def test_bad_inputs_are_refused(people: Path, tmp_path: Path) -> None:
    suite = Suite.builder().row_count(min=0).build()
    with pytest.raises(InvalidParameter, match="at least one"):
        validate(suite, [], now=NOW)
    with pytest.raises(InvalidParameter, match="file 2 of 2 does not exist"):
        validate(suite, [people, tmp_path / "nope.parquet"], now=NOW)
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(InvalidParameter, match="do not open"):
        validate(suite, [junk], now=NOW)
    starred = tmp_path / "a*.parquet"
    starred.write_bytes(people.read_bytes())
    with pytest.raises(InvalidParameter, match="glob"):
        validate(suite, [starred], now=NOW)
    with pytest.raises(InvalidParameter, match="sample_rows"):
        validate(suite, [people], now=NOW, sample_rows=1000)
    with pytest.raises(InvalidParameter, match="pattern failed"):
        validate(Suite.builder().regex("status", "(?<=a)b").build(), [people], now=NOW)


# ---------------------------------------------------------------- custom SQL stays confined


def _smuggled(sql: str) -> Suite:
    """A custom check whose SQL skipped the check made when an expectation is made, as a
    suite tampered with after loading would: validate must check again."""
    check = object.__new__(CustomSql)
    object.__setattr__(check, "severity", "error")
    object.__setattr__(check, "description", "")
    object.__setattr__(check, "sql", sql)
    return Suite((check,))


WRITES = [
    "COPY (SELECT * FROM data) TO '{out}'",
    "CREATE TABLE t AS SELECT * FROM data",
    "INSERT INTO data VALUES (1)",
    "ATTACH '{out}' AS other",
    "SELECT 1; COPY (SELECT 1) TO '{out}'",
    "INSTALL httpfs",
    "SET enable_external_access = true",
    "PRAGMA enable_profiling",
    "DROP VIEW data",
]


@pytest.mark.parametrize("sql", WRITES)
def test_statements_other_than_one_select_are_refused(
    people: Path, tmp_path: Path, sql: str
) -> None:
    out = tmp_path / "out.file"
    text = sql.format(out=out)
    with pytest.raises(InvalidParameter, match="SELECT"):
        Suite.builder().sql(text)
    with pytest.raises(InvalidParameter, match=r"expectations\[0\] \(sql\)"):
        validate(_smuggled(text), [people], now=NOW)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["people.parquet"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM read_parquet('{other}')",
        "SELECT * FROM '{other}'",
        "SELECT * FROM glob('/*')",
        "SELECT * FROM data, read_blob('{other}')",
        "SELECT * FROM query('COPY (SELECT 1) TO ''{out}''')",
        "SELECT * FROM read_parquet('https://example.invalid/x.parquet')",
        "SELECT * FROM secret_rows",
    ],
)
def test_selects_that_reach_outside_the_version_fail_cleanly(
    people: Path, tmp_path: Path, sql: str
) -> None:
    other = _write(tmp_path, "other.parquet", pa.table({"secret": ["s3cr3t"]}))
    secret_rows = pa.table({"secret": ["in-memory"]})  # a Python object in scope: not a table
    out = tmp_path / "out.csv"
    suite = Suite.builder().sql(sql.format(other=other, out=out)).build()
    with pytest.raises(InvalidParameter, match=r"expectations\[0\] \(sql\) failed") as caught:
        validate(suite, [people], now=NOW)
    assert "s3cr3t" not in caught.value.message
    assert str(people) not in caught.value.message
    assert not out.exists()
    del secret_rows


def test_a_query_running_past_the_deadline_is_interrupted(people: Path) -> None:
    endless = (
        Suite.builder().sql("SELECT * FROM range(1000000000000) WHERE hash(range) = 42").build()
    )
    # The limit leaves the checks before the endless one time to run on a loaded machine; if
    # they still used it up, the refusal is the same limit's, said before the query starts.
    with pytest.raises(InvalidParameter, match=r"ran past (the validation's|its) 2 s limit"):
        validate(endless, [people], now=NOW, timeout_s=2)


def test_the_version_can_be_read_through_data_only(people: Path) -> None:
    suite = Suite.builder().sql("SELECT * FROM data WHERE id = 9 AND age = 52").build()
    report = validate(suite, [people], now=NOW)
    assert report.results[0].failing == 2
