"""The point-in-time join's two methods: which one ``auto`` picks, results in memory, and a
join larger than its memory limit (DuckDB spills, and the result is right)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]
import pytest

from shamal.errors import InvalidParameter
from shamal.features._pit import (
    GATHER_SHARE,
    JoinLimits,
    ViewInput,
    _method,
    gather_estimate,
    historical_join,
)


def _write(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


#: Makes the labels long enough that a small case outgrows a small memory limit.
_PADDING = "x" * 48


def _case(tmp_path: Path, rows: int) -> tuple[pa.Table, ViewInput]:
    """``rows`` entity rows and a view with a row per key every 100 s (value: key and time)."""
    keys = np.arange(rows) % 1000
    features = pa.table(
        {
            "customer_id": keys,
            "event_ts": pa.array(np.arange(rows) * 1_000_000, pa.timestamp("us")),
            "spend": np.arange(rows, dtype=np.float64),
            "label": pa.array([f"row {i} {_PADDING}" for i in range(rows)]),
        }
    )
    view = ViewInput(
        "v",
        (_write(tmp_path / "f.parquet", features),),
        ("customer_id",),
        "event_ts",
        ("spend", "label"),
    )
    entities = pa.table(
        {
            "customer_id": keys[::-1].copy(),
            "ts": pa.array(np.arange(rows) * 1_000_000 + 500_000, pa.timestamp("us")),
        }
    )
    return entities, view


def test_auto_gathers_what_fits_and_spills_the_rest(tmp_path: Path) -> None:
    entities, view = _case(tmp_path, 400_000)
    need = gather_estimate(entities, [view.files], [view.features])
    assert 40 << 20 < need < 100 << 20  # the entity rows, two feature columns, the view's
    small, large = JoinLimits(memory_limit_mb=64), JoinLimits(memory_limit_mb=1024)
    spilled = historical_join(entities, "ts", [view], None, limits=small)
    gathered = historical_join(entities, "ts", [view], None, limits=large)
    assert (spilled.method, gathered.method) == ("spill", "gather")
    assert spilled.path is None
    assert gathered.path is None
    assert spilled.table is not None
    assert gathered.table is not None
    # Equal values; the spilled file marks the entity columns not null, the gathered does not.
    assert spilled.table.cast(gathered.table.schema).equals(gathered.table)
    assert spilled.columns == gathered.columns == ("customer_id", "ts", "spend", "label")
    # Entity row i (key 999 - i % 1000) at i + 0.5 s finds its key's latest row at or before.
    spend = gathered.table.column("spend").to_pylist()
    assert spend[0] is None  # key 999's first row is at 999 s
    assert spend[-1] == 399_000.0  # the last entity row, key 0, at 399,999.5 s: row 399,000
    labels = gathered.table.column("label").to_pylist()
    assert labels[-1] == f"row 399000 {_PADDING}"
    assert labels[1] is None  # key 998 at 1.5 s: its first row is at 998 s


def test_a_result_in_memory_equals_the_file_written(tmp_path: Path) -> None:
    entities, view = _case(tmp_path, 5_000)
    for method in ("gather", "spill"):
        out = tmp_path / f"{method}.parquet"
        written = historical_join(entities, "ts", [view], out, method=method)
        held = historical_join(entities, "ts", [view], None, method=method)
        assert written.table is None
        assert written.path == out.resolve()
        assert held.table is not None
        assert pq.read_table(out).equals(held.table)
        assert held.rows == written.rows == 5_000
    assert not list(tmp_path.glob(".pit-*"))  # no partial file left behind


def test_a_join_larger_than_its_memory_limit_spills_and_is_right(tmp_path: Path) -> None:
    rows, per_key = 1_500_000, 10
    keys = rows // per_key
    rng = np.random.default_rng(7)
    # Each key has a feature row every 100 s; its value says which key and time it is.
    feature_keys = np.repeat(np.arange(keys), per_key)
    feature_times = np.tile(np.arange(per_key) * 100, keys)
    features = pa.table(
        {
            "customer_id": feature_keys,
            "event_ts": pa.array(feature_times * 1_000_000, pa.timestamp("us")),
            "spend": feature_keys * 10_000 + feature_times,
            "noise": rng.random(rows),
        }
    )
    view = ViewInput(
        "v",
        (_write(tmp_path / "features.parquet", features),),
        ("customer_id",),
        "event_ts",
        ("spend",),
        ttl_seconds=50,
    )
    entity_keys = rng.permutation(feature_keys)
    entity_times = rng.integers(0, per_key * 100, rows)
    entities = pa.table(
        {
            "customer_id": entity_keys,
            "ts": pa.array(entity_times * 1_000_000, pa.timestamp("us")),
            "row": np.arange(rows),
        }
    )
    spill = tmp_path / "spill"
    spill.mkdir()
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and not seen:
            seen.extend(p.name for p in spill.iterdir())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = historical_join(
            [_write(tmp_path / "entities.parquet", entities)],
            "ts",
            [view],
            tmp_path / "out.parquet",
            limits=JoinLimits(memory_limit_mb=64, temp_dir=spill),
            method="spill",
        )
    finally:
        done.set()
        watcher.join()
    assert seen, "DuckDB wrote nothing to the spill directory"
    assert list(spill.iterdir()) == []  # and removed what it wrote
    out = pq.read_table(result.path, columns=["row", "spend"])
    assert result.rows == rows
    assert np.array_equal(out.column("row").to_numpy(), np.arange(rows))
    # The latest row is the last multiple of 100 at or before t; within 50 s or null.
    expected = np.where(
        entity_times % 100 <= 50, entity_keys * 10_000 + entity_times // 100 * 100, -1
    )
    got = out.column("spend").fill_null(-1).to_numpy()
    assert np.array_equal(got, expected)


def test_auto_with_an_unreadable_file_gives_a_clear_error(tmp_path: Path) -> None:
    entities, view = _case(tmp_path, 10)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really parquet")
    bad = ViewInput("v", (broken,), ("customer_id",), "event_ts", ("spend",))
    with pytest.raises(InvalidParameter) as caught:
        historical_join(entities, "ts", [bad], None)
    assert str(tmp_path) not in caught.value.message


def test_gather_leaves_duckdb_what_its_own_buffers_do_not_take(tmp_path: Path) -> None:
    entities, view = _case(tmp_path, 400_000)
    need_mb = gather_estimate(entities, [view.files], [view.features]) >> 20
    assert 0 < need_mb < 1024 * GATHER_SHARE  # gathers, and DuckDB's share is not all of it
    method, limits = _method(
        "auto", JoinLimits(memory_limit_mb=1024), entities, [list(view.files)], [view]
    )
    assert method == "gather"
    assert limits.memory_limit_mb == 1024 - need_mb
    assert _method(
        "spill", JoinLimits(memory_limit_mb=1024), entities, [list(view.files)], [view]
    ) == (
        "spill",
        JoinLimits(memory_limit_mb=1024),
    )
