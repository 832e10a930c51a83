"""Profiles of generated data: accuracy, merging, nulls, kinds, personal columns, JSON."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, date, datetime

import numpy as np
import pyarrow as pa
import pytest

from shamal.datasets import QUANTILES, ColumnProfile, Profile, Profiler
from shamal.errors import InvalidParameter

N = 1_000_000


def _batches(table: pa.Table, rows: int = 65_536) -> list[pa.RecordBatch]:
    return table.to_batches(max_chunksize=rows)


def _profile(table: pa.Table, **settings: object) -> Profile:
    profiler = Profiler(**settings)  # type: ignore[arg-type]
    for batch in _batches(table):
        profiler.update(batch)
    return profiler.result()


@pytest.fixture(scope="module")
def generated() -> pa.Table:
    rng = np.random.default_rng(2024)
    amount = rng.lognormal(3, 1, N)
    amount[rng.random(N) < 0.1] = np.nan
    user = rng.integers(0, 150_000, N)
    city = np.array([f"city-{i}" for i in range(1000)])[rng.zipf(1.4, N) % 1000]
    stamps = rng.integers(1_700_000_000_000_000, 1_730_000_000_000_000, N)
    null_user = rng.random(N) < 0.05
    return pa.table(
        {
            "amount": pa.array(amount),
            "user": pa.array(user, mask=null_user),
            "city": pa.array(city),
            "at": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        }
    )


@pytest.fixture(scope="module")
def generated_profile(generated: pa.Table) -> Profile:
    return _profile(generated)


def test_counts_nulls_nans_min_max_mean_are_exact(
    generated: pa.Table, generated_profile: Profile
) -> None:
    amount = generated.column("amount").to_numpy()
    finite = amount[~np.isnan(amount)]
    column = generated_profile.column("amount")
    assert generated_profile.rows == N
    assert (column.count, column.nulls, column.nans) == (N, 0, int(np.isnan(amount).sum()))
    assert column.min == finite.min()
    assert column.max == finite.max()
    assert column.mean == pytest.approx(finite.mean(), rel=1e-9)
    assert column.std == pytest.approx(finite.std(), rel=1e-9)
    user = generated_profile.column("user")
    assert user.nulls == generated.column("user").null_count > 0
    assert user.null_rate == pytest.approx(0.05, abs=0.002)


def test_quantiles_are_within_one_percent_of_rank(
    generated: pa.Table, generated_profile: Profile
) -> None:
    amount = generated.column("amount").to_numpy()
    ordered = np.sort(amount[~np.isnan(amount)])
    column = generated_profile.column("amount")
    assert set(column.quantiles) == {name for name, _ in QUANTILES}
    for name, rank in QUANTILES:
        found = np.searchsorted(ordered, column.quantiles[name]) / len(ordered)
        assert abs(found - rank) < 0.01, (name, found)
    assert column.percentiles is not None
    assert len(column.percentiles) == 101
    assert column.percentiles[0] == column.min
    assert column.percentiles[-1] == column.max


def test_distinct_estimates_are_within_three_percent(
    generated: pa.Table, generated_profile: Profile
) -> None:
    for name in ("user", "city", "amount"):
        column = generated.column(name).drop_null()
        if name == "amount":
            column = column.filter(pa.compute.invert(pa.compute.is_nan(column)))
        truth = len(pa.compute.unique(column))
        estimate = generated_profile.column(name).distinct
        assert estimate is not None
        assert abs(estimate - truth) <= 0.03 * truth, (name, estimate, truth)


def test_top_values_of_a_skewed_column_are_the_true_ones(
    generated: pa.Table, generated_profile: Profile
) -> None:
    counted = pa.compute.value_counts(generated.column("city")).to_pylist()
    truth = sorted(counted, key=lambda vc: -vc["counts"])[:10]
    top = generated_profile.column("city").top_values
    assert [t.value for t in top] == [vc["values"] for vc in truth]
    for found, expected in zip(top, truth, strict=True):
        assert found.count - found.error <= expected["counts"] <= found.count


def test_timestamps_read_as_iso_text_and_quantiles_as_epoch_seconds(
    generated: pa.Table, generated_profile: Profile
) -> None:
    column = generated_profile.column("at")
    stamps = generated.column("at").cast(pa.int64()).to_numpy()
    assert column.kind == "temporal"
    earliest = np.datetime64(int(stamps.min()), "us")
    assert column.min == np.datetime_as_string(earliest, timezone="UTC")
    assert isinstance(column.max, str)
    assert column.max.endswith("Z")
    assert column.mean == pytest.approx(stamps.mean() / 1e6, abs=1e-3)
    ordered = np.sort(stamps) / 1e6
    median = np.searchsorted(ordered, column.quantiles["p50"]) / N
    assert abs(median - 0.5) < 0.01


def test_two_profilers_merge_into_the_profile_of_all(generated: pa.Table) -> None:
    left, right = Profiler(seed=3), Profiler(seed=3)
    batches = _batches(generated)
    for i, batch in enumerate(batches):
        (left if i % 3 else right).update(batch)
    left.merge(right)
    merged, whole = left.result(), _profile(generated, seed=3)
    assert merged.rows == whole.rows
    for a, b in zip(merged.columns, whole.columns, strict=True):
        assert (a.count, a.nulls, a.nans, a.min, a.max) == (b.count, b.nulls, b.nans, b.min, b.max)
        assert a.distinct == b.distinct  # HyperLogLog registers merge exactly
        if b.mean is not None:
            assert a.mean == pytest.approx(b.mean, rel=1e-9)
            assert a.std == pytest.approx(b.std, rel=1e-9)
    assert [t.value for t in merged.column("city").top_values[:5]] == [
        t.value for t in whole.column("city").top_values[:5]
    ]
    amount = generated.column("amount").to_numpy()
    ordered = np.sort(amount[~np.isnan(amount)])
    for name, rank in QUANTILES:
        found = np.searchsorted(ordered, merged.column("amount").quantiles[name]) / len(ordered)
        assert abs(found - rank) < 0.01


def test_merging_into_an_empty_profiler_and_refusing_other_settings() -> None:
    table = pa.table({"x": [1, 2, 3]})
    full, empty = Profiler(), Profiler()
    full.update(table)
    empty.merge(full)
    assert empty.result() == full.result()
    with pytest.raises(InvalidParameter, match="settings"):
        full.merge(Profiler(seed=9))
    other = Profiler()
    other.update(pa.table({"x": ["a"]}))
    with pytest.raises(InvalidParameter, match="schemas"):
        full.merge(other)


def test_same_seed_same_profile() -> None:
    table = pa.table({"x": np.random.default_rng(0).normal(size=50_000)})
    assert _profile(table, seed=4, quantile_k=20) == _profile(table, seed=4, quantile_k=20)


def test_all_null_and_empty_columns() -> None:
    table = pa.table(
        {
            "nothing": pa.array([None] * 5, pa.float64()),
            "words": pa.array([None] * 5, pa.string()),
            "untyped": pa.array([None] * 5),
        }
    )
    profile = _profile(table)
    for column in profile.columns:
        assert (column.count, column.nulls) == (5, 5)
        assert column.min is None
        assert column.max is None
        assert column.mean is None
        assert column.percentiles is None
        assert column.top_values == ()
    assert profile.column("nothing").distinct == 0
    assert profile.column("untyped").kind == "other"
    assert Profiler().result() == Profile(0, ())
    profiler = Profiler()
    profiler.update(pa.table({"x": pa.array([], pa.int64())}))  # a table without batches
    empty = profiler.result()
    assert empty.rows == 0
    assert empty.column("x").count == 0
    assert empty.column("x").percentiles is None


def test_strings_booleans_dates_binary_and_dictionaries() -> None:
    table = pa.table(
        {
            "word": pa.array(["pear", "apple", None, "fig", "apple"]),
            "flag": pa.array([True, False, True, None, True]),
            "day": pa.array([date(2024, 1, 2), date(2023, 5, 6), None, None, None]),
            "blob": pa.array([b"\x00\x01", b"", b"\xff", None, b"\x00\x01"]),
            "tag": pa.array(["b", "a", "b", "b", None]).dictionary_encode(),
        }
    )
    profile = _profile(table)
    word = profile.column("word")
    assert (word.min, word.max, word.distinct) == ("apple", "pear", 3)
    assert (word.top_values[0].value, word.top_values[0].count) == ("apple", 2)
    flag = profile.column("flag")
    assert flag.mean == pytest.approx(0.75)
    assert flag.distinct == 2
    assert flag.top_values[0].value is True
    day = profile.column("day")
    assert (day.min, day.max, day.kind) == ("2023-05-06", "2024-01-02", "temporal")
    assert day.mean == pytest.approx(
        (
            datetime(2024, 1, 2, tzinfo=UTC).timestamp()
            + datetime(2023, 5, 6, tzinfo=UTC).timestamp()
        )
        / 2
    )
    blob = profile.column("blob")
    assert (blob.kind, blob.distinct, blob.min, blob.top_values) == ("binary", 3, None, ())
    tag = profile.column("tag")
    assert (tag.kind, tag.distinct, tag.top_values[0].value) == ("string", 2, "b")


def test_personal_columns_keep_no_raw_value_anywhere() -> None:
    rng = np.random.default_rng(1)
    emails = [f"person{i}@example.org" for i in rng.integers(0, 50, 10_000)]
    ages = rng.integers(18, 99, 10_000) + 987_654_000  # distinctive in any text
    table = pa.table({"email": emails, "age": ages, "score": rng.normal(size=10_000)})
    profiler = Profiler(personal={"email", "age"})
    for batch in _batches(table, 1000):
        profiler.update(batch)
    profile = profiler.result()
    text = json.dumps(profile.to_json())
    assert "@example.org" not in text
    assert not re.search(r"person\d", text)
    assert not any(str(age) in text for age in set(ages.tolist()))
    for name in ("email", "age"):
        column = profile.column(name)
        assert column.personal
        assert column.min is None
        assert column.max is None
        assert column.mean is None
        assert column.percentiles is None
        assert column.top_values == ()
        assert column.distinct is not None
    assert abs(profile.column("email").distinct - 50) <= 2  # type: ignore[operator]
    as_json = profile.column("age").to_json()
    assert {k for k, v in as_json.items() if v not in (None, [], {}, False)} == {
        "name",
        "type",
        "kind",
        "personal",
        "count",
        "distinct",
    }
    # And not in the profiler's own state either.
    state = profiler._columns[0]
    assert state.top is None
    assert state.sketch is None
    assert state.low is None


def test_a_personal_column_must_exist() -> None:
    with pytest.raises(InvalidParameter, match="emial"):
        Profiler(personal={"emial"}).update(pa.table({"email": ["a"]}))


def test_a_batch_of_another_schema_is_refused() -> None:
    profiler = Profiler()
    profiler.update(pa.table({"x": [1]}))
    with pytest.raises(InvalidParameter, match="schema"):
        profiler.update(pa.table({"x": [1.5]}))
    with pytest.raises(InvalidParameter):
        profiler.update([1, 2])  # type: ignore[arg-type]


def test_profile_json_round_trips_with_non_finite_values(generated_profile: Profile) -> None:
    table = pa.table({"v": [1.0, float("inf"), -float("inf"), 2.0]})
    for profile in (generated_profile, _profile(table)):
        text = json.dumps(profile.to_json(), allow_nan=False)
        back = Profile.from_json(json.loads(text))
        assert json.dumps(back.to_json(), allow_nan=False) == text  # NaN != NaN: compare text
    assert back.column("v").max == float("inf")
    assert back.column("v").min == -float("inf")
    assert back.column("v").mean is not None
    assert math.isnan(back.column("v").mean)
    assert Profile.from_json(generated_profile.to_json()) == generated_profile


@pytest.mark.parametrize(
    "raw",
    [None, [], {"rows": 1}, {"rows": "1", "columns": []}, {"rows": 1, "columns": [{"name": "x"}]}],
)
def test_malformed_profile_json_is_refused(raw: object) -> None:
    with pytest.raises(InvalidParameter):
        Profile.from_json(raw)


def test_quantile_outside_zero_one_is_refused(generated_profile: Profile) -> None:
    column: ColumnProfile = generated_profile.column("amount")
    assert column.quantile(0.0) == column.min
    with pytest.raises(InvalidParameter):
        column.quantile(1.5)
    with pytest.raises(InvalidParameter):
        generated_profile.column("missing")
