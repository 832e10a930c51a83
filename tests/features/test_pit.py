"""The point-in-time join: hand-written cases, a property test against a slow reference,
a join larger than its memory limit, and hostile input."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.features._pit import JoinLimits, JoinResult, ViewInput, historical_join

UTC = dt.UTC
BASE = dt.datetime(2024, 1, 1, tzinfo=UTC)


# --- the reference: slow, obviously correct ------------------------------------------------


def _utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=UTC)
    raise TypeError(value)


def _pick(
    keys: tuple[Any, ...], at: dt.datetime, view: ViewInput, rows: list[dict[str, Any]]
) -> dict[str, Any] | None:
    best: dict[str, Any] | None = None
    best_at: dt.datetime | None = None
    for row in rows:  # in input order: a later row with the same time replaces an earlier one
        event = _utc(row[view.timestamp_field])
        theirs = tuple(row[k] for k in view.join_keys)
        if event is None or None in theirs or theirs != keys or event > at:
            continue
        if best_at is None or event >= best_at:
            best, best_at = row, event
    oldest = None if view.ttl_seconds is None else at - dt.timedelta(seconds=view.ttl_seconds)
    if oldest is not None and best_at is not None and best_at < oldest:
        return None
    return best


def reference_join(
    entities: pa.Table,
    entity_timestamp: str,
    views: Sequence[tuple[ViewInput, pa.Table]],
    *,
    full_names: bool = False,
) -> pa.Table:
    """The join by loops over rows: what historical_join must equal."""
    entity_rows = entities.to_pylist()
    columns: dict[str, list[Any]] = {
        c: entities.column(c).to_pylist() for c in entities.column_names
    }
    for view, table in views:
        rows = table.to_pylist()
        picked = []
        for entity in entity_rows:
            keys = tuple(entity[k] for k in view.join_keys)
            at = _utc(entity[entity_timestamp])
            found = None if at is None or None in keys else _pick(keys, at, view, rows)
            picked.append(found)
        for feature in view.features:
            name = f"{view.name}__{feature}" if full_names else feature
            columns[name] = [None if row is None else row[feature] for row in picked]
    return pa.table(columns)


# --- helpers ---------------------------------------------------------------------------------


def _ts(seconds: float | None) -> dt.datetime | None:
    return None if seconds is None else BASE + dt.timedelta(seconds=seconds)


def _write(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


def _view(
    tmp_path: Path,
    name: str,
    parts: Sequence[pa.Table],
    *,
    keys: tuple[str, ...] = ("customer_id",),
    features: tuple[str, ...] = ("spend",),
    ttl: int | None = None,
    sql: str | None = None,
) -> ViewInput:
    files = tuple(_write(tmp_path / f"{name}-{i}.parquet", part) for i, part in enumerate(parts))
    return ViewInput(name, files, keys, "event_ts", features, ttl, sql)


def _read(result: JoinResult) -> dict[str, list[Any]]:
    table = pq.read_table(result.path)
    assert tuple(table.column_names) == result.columns
    assert table.num_rows == result.rows
    return {c: table.column(c).to_pylist() for c in table.column_names}


def _features(
    ids: Sequence[int | None], times: Sequence[float | None], spend: list[Any]
) -> pa.Table:
    return pa.table(
        {
            "customer_id": pa.array(ids, pa.int64()),
            "event_ts": pa.array([_ts(t) for t in times], pa.timestamp("us", tz="UTC")),
            "spend": spend,
        }
    )


def _entities(
    ids: Sequence[int | None], times: Sequence[float | None], **extra: list[Any]
) -> pa.Table:
    return pa.table(
        {
            "customer_id": pa.array(ids, pa.int64()),
            "ts": pa.array([_ts(t) for t in times], pa.timestamp("us", tz="UTC")),
            **extra,
        }
    )


#: The method the current test runs (each test below runs with both).
_METHOD = ["gather"]


@pytest.fixture(autouse=True, params=["gather", "spill"])
def method(request: pytest.FixtureRequest) -> str:
    _METHOD[0] = request.param
    return str(request.param)


def _join(
    entities: pa.Table | Sequence[Path],
    timestamp: str,
    views: list[ViewInput],
    out: Path,
    **options: Any,
) -> JoinResult:
    """historical_join with this test's method; checks that it ran that method."""
    result = historical_join(entities, timestamp, views, out, method=_METHOD[0], **options)
    assert result.method == _METHOD[0]
    return result


# --- hand-written cases ----------------------------------------------------------------------


def test_exact_timestamp_matches_and_later_rows_are_ignored(tmp_path: Path) -> None:
    view = _view(tmp_path, "v", [_features([1, 1, 1], [10, 20, 30], [1.0, 2.0, 3.0])])
    entities = _entities([1, 1, 1, 1], [20, 25, 9, 30])
    result = _join(entities, "ts", [view], tmp_path / "out.parquet")
    assert result.rows == 4
    assert pq.ParquetFile(result.path).metadata.row_group(0).column(0).compression == "ZSTD"
    assert _read(result)["spend"] == [2.0, 2.0, None, 3.0]


def test_ttl_edge_is_inclusive_and_never_falls_back(tmp_path: Path) -> None:
    view = _view(tmp_path, "v", [_features([1, 1], [0, 100], [1.0, 2.0])], ttl=10)
    micro = 1e-6
    entities = _entities([1, 1, 1, 1], [110, 110 + micro, 105, 50])
    out = _read(_join(entities, "ts", [view], tmp_path / "out.parquet"))
    # 110 - 10 = 100: included; a microsecond later the row at 100 is too old, and the one at
    # 0 is not used instead; at 50 the latest row (0) is too old.
    assert out["spend"] == [2.0, None, 2.0, None]


def test_ties_go_to_the_row_written_last_across_files(tmp_path: Path) -> None:
    first = _features([1, 1, 2], [10, 10, 10], [1.0, 2.0, 7.0])
    second = _features([1, 2], [10, 10], [3.0, None])
    view = _view(tmp_path, "v", [first, second])
    out = _read(_join(_entities([1, 2], [10, 10]), "ts", [view], tmp_path / "o.parquet"))
    assert out["spend"] == [3.0, None]
    within = _view(tmp_path, "w", [first])
    out = _read(_join(_entities([1], [11]), "ts", [within], tmp_path / "o.parquet"))
    assert out["spend"] == [2.0]


def test_nulls_in_keys_and_timestamps(tmp_path: Path) -> None:
    rows = _features([1, None, 1, 2], [10, 20, None, 5], [1.0, 50.0, 60.0, None])
    view = _view(tmp_path, "v", [rows])
    entities = _entities([1, None, 1, 2, 1], [30, 30, None, 30, 15], label=[1, 2, 3, 4, 5])
    out = _read(_join(entities, "ts", [view], tmp_path / "out.parquet"))
    # The null-keyed and null-timed feature rows are never chosen; a chosen row's null stays.
    assert out["spend"] == [1.0, None, None, None, 1.0]
    assert out["label"] == [1, 2, 3, 4, 5]
    assert out["customer_id"] == [1, None, 1, 2, 1]


def test_two_views_with_different_keys_and_ttls(tmp_path: Path) -> None:
    spend = _view(tmp_path, "spend", [_features([1, 2], [0, 0], [1.0, 2.0])], ttl=100)
    region = pa.table(
        {
            "region": ["eu", "eu", "us"],
            "store": [7, 7, 7],
            "event_ts": pa.array([_ts(0), _ts(50), _ts(60)], pa.timestamp("us", tz="UTC")),
            "footfall": [10, 11, 99],
        }
    )
    by_region = _view(
        tmp_path,
        "region",
        [region],
        keys=("region", "store"),
        features=("footfall",),
        ttl=None,
    )
    entities = _entities([1, 2, 1], [60, 200, 1000], region=["eu", "us", "eu"], store=[7, 7, 8])
    result = _join(entities, "ts", [spend, by_region], tmp_path / "out.parquet")
    assert result.columns == ("customer_id", "ts", "region", "store", "spend", "footfall")
    out = _read(result)
    assert out["spend"] == [1.0, None, None]
    assert out["footfall"] == [11, 99, None]


def test_full_names_and_the_collision_error(tmp_path: Path) -> None:
    one = _view(tmp_path, "one", [_features([1], [0], [1.0])])
    two = _view(tmp_path, "two", [_features([1], [0], [2.0])])
    entities = _entities([1], [5])
    out = tmp_path / "out.parquet"
    with pytest.raises(InvalidParameter, match=r"'spend'.*full_names"):
        _join(entities, "ts", [one, two], out)
    assert not out.exists()
    result = _join(entities, "ts", [one, two], out, full_names=True)
    assert result.columns == ("customer_id", "ts", "one__spend", "two__spend")
    assert _read(result)["two__spend"] == [2.0]
    clash = _view(tmp_path, "c", [_features([1], [0], [1.0])], features=("customer_id",))
    with pytest.raises(InvalidParameter, match="entity column"):
        _join(entities, "ts", [clash], out)


def test_order_and_entity_columns_are_kept(tmp_path: Path) -> None:
    view = _view(tmp_path, "v", [_features([3, 1, 2], [0, 0, 0], [3.0, 1.0, 2.0])])
    ids = [2, 3, 1, 3, 2, 1] * 50
    times = [float(i % 7) for i in range(len(ids))]
    labels = [f"row {i}" for i in range(len(ids))]
    entities = _entities(ids, times, label=labels)
    halves = [
        _write(tmp_path / "e0.parquet", entities.slice(0, 100)),
        _write(tmp_path / "e1.parquet", entities.slice(100)),
    ]
    for source in (entities, halves):
        out = _read(_join(source, "ts", [view], tmp_path / "out.parquet"))
        assert out["label"] == labels
        assert out["customer_id"] == ids
        assert out["spend"] == [float(i) for i in ids]


def test_time_zones_naive_and_dates(tmp_path: Path) -> None:
    paris = dt.timezone(dt.timedelta(hours=1))
    features = pa.table(
        {
            "customer_id": [1, 1],
            # Naive: read as UTC.
            "event_ts": pa.array([dt.datetime(2024, 1, 1, 10), dt.datetime(2024, 1, 2)]),
            "spend": [1.0, 2.0],
        }
    )
    view = _view(tmp_path, "v", [features])
    aware = pa.table(
        {
            "customer_id": [1, 1, 1],
            "ts": pa.array(
                [
                    dt.datetime(2024, 1, 1, 11, tzinfo=paris),  # 10:00 UTC: exactly the row
                    dt.datetime(2024, 1, 1, 10, 59, tzinfo=paris),  # 09:59 UTC: before it
                    dt.datetime(2024, 1, 2, 1, tzinfo=paris),  # 00:00 UTC on the 2nd
                ],
                pa.timestamp("ms", tz="Europe/Paris"),
            ),
        }
    )
    out = _read(_join(aware, "ts", [view], tmp_path / "out.parquet"))
    assert out["spend"] == [1.0, None, 2.0]
    dates = pa.table({"customer_id": [1, 1], "day": [dt.date(2024, 1, 1), dt.date(2024, 1, 2)]})
    out = _read(_join(dates, "day", [view], tmp_path / "out.parquet"))
    assert out["spend"] == [None, 2.0]
    assert out["day"] == [dt.date(2024, 1, 1), dt.date(2024, 1, 2)]
    daily = pa.table(
        {"customer_id": [1], "event_ts": [dt.date(2024, 1, 2)], "spend": [5.0]}
    )  # a date is midnight UTC
    by_day = _view(tmp_path, "d", [daily])
    out = _read(_join(aware, "ts", [by_day], tmp_path / "out.parquet"))
    assert out["spend"] == [None, None, 5.0]


def test_a_transformation_over_the_source(tmp_path: Path) -> None:
    rows = _features([1, 1, 2], [0, 5, 5], [1.0, 2.0, 3.0])
    view = _view(
        tmp_path,
        "v",
        [rows],
        sql="SELECT customer_id, event_ts, spend * 10 AS spend FROM source WHERE spend < 3 -- c",
    )
    out = _read(_join(_entities([1, 2], [9, 9]), "ts", [view], tmp_path / "o.parquet"))
    assert out["spend"] == [20.0, None]


# --- the property: equal to the reference ----------------------------------------------------

# Nulls about one draw in eight; few keys and times, so matches, ties and TTL edges are common.
_KEY = st.sampled_from([0, 1, 2, 0, 1, 2, 1, None])
_TIME = st.one_of(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8), st.none())
_VALUE = st.one_of(st.integers(-5, 5), st.integers(-5, 5), st.none())


@st.composite
def _case(draw: st.DrawFn) -> tuple[pa.Table, list[tuple[list[pa.Table], int | None, bool]], bool]:
    size = draw(st.integers(0, 12))
    entities = pa.table(
        {
            "customer_id": pa.array([draw(_KEY) for _ in range(size)], pa.int64()),
            "store": pa.array([draw(_KEY) for _ in range(size)], pa.int32()),
            "ts": pa.array(
                [_ts(t) for t in (draw(_TIME) for _ in range(size))], pa.timestamp("us")
            ),
            "label": list(range(size)),
        }
    )
    views = []
    for _ in range(draw(st.integers(1, 2))):
        composite = draw(st.booleans())
        parts = []
        for _ in range(draw(st.integers(1, 2))):
            rows = draw(st.integers(0, 10))
            parts.append(
                pa.table(
                    {
                        "customer_id": pa.array([draw(_KEY) for _ in range(rows)], pa.int32()),
                        "store": pa.array([draw(_KEY) for _ in range(rows)], pa.int64()),
                        "event_ts": pa.array(
                            [_ts(t) for t in (draw(_TIME) for _ in range(rows))],
                            pa.timestamp("us", tz="UTC"),
                        ),
                        "spend": pa.array([draw(_VALUE) for _ in range(rows)], pa.int64()),
                    }
                )
            )
        views.append((parts, draw(st.one_of(st.none(), st.integers(0, 4))), composite))
    return entities, views, draw(st.booleans())


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=_case())
def test_the_join_equals_the_reference(
    tmp_path: Path, case: tuple[pa.Table, list[tuple[list[pa.Table], int | None, bool]], bool]
) -> None:
    entities, specs, full_names = case
    views = []
    for index, (parts, ttl, composite) in enumerate(specs):
        keys = ("customer_id", "store") if composite else ("customer_id",)
        name = f"view{index}"
        view = _view(tmp_path, name, parts, keys=keys, ttl=ttl)
        if not full_names:  # distinct feature names, one per view
            parts = [p.rename_columns({"spend": f"spend{index}"}) for p in parts]
            view = _view(tmp_path, name, parts, keys=keys, features=(f"spend{index}",), ttl=ttl)
        views.append((view, pa.concat_tables(parts)))
    out = tmp_path / "out.parquet"
    result = _join(entities, "ts", [v for v, _ in views], out, full_names=full_names)
    expected = reference_join(entities, "ts", views, full_names=full_names)
    got = _read(result)
    assert list(got) == expected.column_names
    for column in expected.column_names:
        assert got[column] == expected.column(column).to_pylist(), column


# --- hostile input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT * FROM source; SELECT * FROM source", "exactly one"),
        ("COPY (SELECT 1) TO '/tmp/x.csv'", "SELECT"),
        ("ATTACH '/tmp/x.db' AS other", "SELECT"),
        ("SELECT * FROM read_csv('/etc/passwd')", "transformation"),
        ("SELECT * FROM read_parquet('/etc/passwd')", "transformation"),
    ],
)
def test_hostile_transformations_are_refused(tmp_path: Path, sql: str, message: str) -> None:
    view = _view(tmp_path, "v", [_features([1], [0], [1.0])], sql=sql)
    out = tmp_path / "out.parquet"
    with pytest.raises(InvalidParameter, match=message) as caught:
        _join(_entities([1], [5]), "ts", [view], out)
    assert str(tmp_path) not in caught.value.message  # no server path in the message
    assert list(tmp_path.glob("*out*")) == []


def test_hostile_column_names_are_quoted(tmp_path: Path) -> None:
    name = 'x"; DROP TABLE y; --'
    features = pa.table(
        {
            name: [1, 1],
            "event ts'": pa.array([_ts(0), _ts(10)], pa.timestamp("us", tz="UTC")),
            'sp"end': [1.0, 2.0],
        }
    )
    view = ViewInput(
        "v'", (_write(tmp_path / "f.parquet", features),), (name,), "event ts'", ('sp"end',)
    )
    entities = pa.table({name: [1, 1], "when": pa.array([_ts(5), _ts(10)], pa.timestamp("us"))})
    result = _join(entities, "when", [view], tmp_path / "out.parquet", full_names=True)
    assert result.columns == (name, "when", "v'__sp\"end")
    assert _read(result)["v'__sp\"end"] == [1.0, 2.0]


def test_unknown_columns_and_bad_types_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    view = _view(tmp_path, "v", [_features([1], [0], [1.0])])
    entities = _entities([1], [5])
    cases: list[tuple[pa.Table, str, ViewInput, str]] = [
        (entities, "when", view, "entity table holds no column 'when'"),
        (
            entities.drop_columns(["customer_id"]),
            "ts",
            view,
            "no column 'customer_id', a join key of view 'v'",
        ),
        (
            entities,
            "ts",
            _view(tmp_path, "m", [_features([1], [0], [1.0])], features=("nope",)),
            "view 'm' holds no column 'nope'",
        ),
        (entities.append_column("n", pa.array([3])), "n", view, "'n' is BIGINT, not a timestamp"),
        (
            pa.table({"customer_id": ["1"], "ts": entities.column("ts")}),
            "ts",
            view,
            "'customer_id' is VARCHAR in the entity rows but BIGINT",
        ),
    ]
    for table, timestamp, bad, message in cases:
        with pytest.raises(InvalidParameter, match=message):
            _join(table, timestamp, [bad], out)
        assert list(tmp_path.glob("*out*")) == []
    # Integers of other widths are one type.
    narrow = entities.set_column(0, "customer_id", pa.array([1], pa.int32()))
    assert _read(_join(narrow, "ts", [view], out))["spend"] == [1.0]


def test_data_columns_named_like_duckdbs_row_ordinals(tmp_path: Path) -> None:
    # Such columns hide DuckDB's virtual file_index / file_row_number: order still holds.
    size = 5_000
    entities = pa.table(
        {
            "customer_id": [i % 3 for i in range(size)],
            "ts": pa.array([_ts(i % 11) for i in range(size)], pa.timestamp("us", tz="UTC")),
            "file_row_number": list(range(size, 0, -1)),
        }
    )
    features = _features([0, 1, 2, 0], [0, 0, 0, 0], [1.0, 2.0, 3.0, 4.0]).append_column(
        "file_index", pa.array([9, 8, 7, 6])
    )
    view = _view(tmp_path, "v", [features], features=("spend", "file_index"))
    files = [_write(tmp_path / "entities.parquet", entities)]
    out = _read(_join(files, "ts", [view], tmp_path / "out.parquet"))
    assert out["file_row_number"] == list(range(size, 0, -1))
    assert out["spend"] == [[4.0, 2.0, 3.0][i % 3] for i in range(size)]
    assert out["file_index"] == [[6, 8, 7][i % 3] for i in range(size)]


def test_a_failing_join_leaves_the_previous_output_alone(tmp_path: Path) -> None:
    out = _write(tmp_path / "out.parquet", pa.table({"before": [1]}))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    view = ViewInput("v", (broken,), ("customer_id",), "event_ts", ("spend",))
    with pytest.raises(InvalidParameter) as caught:
        _join(_entities([1], [5]), "ts", [view], out)
    assert str(tmp_path) not in caught.value.message
    assert pq.read_table(out).column_names == ["before"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.parquet", "out.parquet"]


def test_limits_out_of_range_are_refused(tmp_path: Path) -> None:
    for limits in (JoinLimits(memory_limit_mb=1), JoinLimits(threads=0)):
        with pytest.raises(InvalidParameter, match="between"):
            _join(_entities([1], [5]), "ts", [], tmp_path / "out.parquet", limits=limits)
    view = _view(tmp_path, "v", [_features([1], [0], [1.0])], ttl=-1)
    with pytest.raises(InvalidParameter, match="ttl_seconds"):
        _join(_entities([1], [5]), "ts", [view], tmp_path / "out.parquet")


def test_missing_files_are_refused(tmp_path: Path) -> None:
    view = ViewInput("v", (tmp_path / "absent.parquet",), ("customer_id",), "event_ts", ("spend",))
    with pytest.raises(InvalidParameter, match="does not exist"):
        _join(_entities([1], [5]), "ts", [view], tmp_path / "out.parquet")
    with pytest.raises(InvalidParameter, match="does not exist"):
        _join([tmp_path / "nope.parquet"], "ts", [], tmp_path / "out.parquet")


def test_errors_keep_the_servers_paths_out(tmp_path: Path) -> None:
    view = _view(tmp_path, "v", [_features([1], [0], [1.0])])
    entities = _write(tmp_path / "entities.parquet", _entities([1], [5]))
    for named in (view.files[0], entities):  # a file of the view's, and one of the join's
        sql = f"SELECT * FROM read_json('{named}')"
        hostile = ViewInput("h", view.files, ("customer_id",), "event_ts", ("spend",), sql=sql)
        with pytest.raises(InvalidParameter, match="transformation") as caught:
            _join([entities], "ts", [hostile], tmp_path / "out.parquet")
        assert "<file>" in caught.value.message
        assert str(tmp_path) not in caught.value.message
