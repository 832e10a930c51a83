"""Monitoring's pure rules: schedules, policies, spec limits, and sample excerpts -> columns."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.monitoring import (
    ColumnRole,
    DriftAction,
    MonitorSpec,
    OnDrift,
    Sampled,
    next_due,
    parse_on_drift,
    parse_schedule,
    signature_names,
    split_samples,
)
from shamal.monitoring._columns import coerce
from shamal.monitoring._rules import (
    LastRetraining,
    check_spec,
    default_name,
    retraining_backoff,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("1h", 3600), ("2d", 172800)]
)
def test_a_schedule_is_a_period(text: str, seconds: int) -> None:
    assert parse_schedule(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "5s", "1w", "1h30", "-1h", "31d", "1.5h", "h", "1 h x"])
def test_a_schedule_out_of_form_or_limits_is_refused(text: str) -> None:
    with pytest.raises(InvalidParameter):
        parse_schedule(text)


def test_policies_parse_and_print_back() -> None:
    for text in ("none", "rollback", "retrain:retrain-fraud"):
        assert str(parse_on_drift(text)) == text
    assert parse_on_drift("retrain:x") == OnDrift(DriftAction.RETRAIN, "x")
    for bad in ("retrain", "retrain:", "retrain:Bad Name", "rollback:x", "delete", "none:x"):
        with pytest.raises(InvalidParameter):
            parse_on_drift(bad)


@given(
    offset=st.integers(min_value=-(10**7), max_value=10**7),
    period=st.integers(min_value=10, max_value=10**6),
)
def test_missed_ticks_coalesce_into_the_first_tick_after_now(offset: int, period: int) -> None:
    due = T0
    now = T0 + timedelta(seconds=offset)
    found = next_due(due, period, now)
    if due > now:
        assert found == due
        return
    assert found > now
    assert found - now <= timedelta(seconds=period)
    steps = (found - due) / timedelta(seconds=period)
    assert steps == math.floor(steps)  # on the schedule's grid


def _spec(**change: object) -> MonitorSpec:
    base: dict[str, object] = {"deployment": "fraud-api", "schedule_s": 3600}
    base.update(change)
    return MonitorSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"schedule_s": 1},
        {"threshold": 0.0},
        {"threshold": math.nan},
        {"threshold": math.inf},
        {"drift_share": 0.0},
        {"drift_share": 1.5},
        {"drift_share": math.nan},
        {"window": 0},
        {"window": 10**9},
        {"correction": "fdr"},
        {"tests": {"amount": "t-test"}},
        {"columns": ("a", "a")},
        {"columns": ("bad\x00name",)},
        {"name": "Bad Name"},
    ],
)
def test_a_spec_out_of_limits_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(InvalidParameter):
        check_spec(_spec(**change))


def test_a_good_spec_passes_unchanged() -> None:
    spec = _spec(columns=("amount",), tests={"amount": "ks"}, threshold=0.01, correction="holm")
    assert check_spec(spec) == spec
    assert default_name("fraud-api") == "fraud-api-drift"
    assert len(default_name("a" * 63)) <= 63


def _excerpt(shape: list[int], data: list[object]) -> dict[str, object]:
    return {"shape": shape, "datatype": "FP64", "data": data}


def test_a_two_dimensional_tensor_splits_by_the_signature_names() -> None:
    signature = {
        "inputs": [{"name": "amount", "type": "double"}, {"name": "country", "type": "string"}],
        "outputs": [{"name": "score", "type": "double"}],
    }
    samples = [
        Sampled(
            1, {"x": _excerpt([2, 2], [1.0, "nl", 2.0, "de"])}, {"y": _excerpt([2], [0.1, 0.9])}
        ),
        Sampled(2, {"x": _excerpt([1, 2], [3.0, "fr"])}, {"y": _excerpt([1], [0.5])}),
    ]
    found = split_samples(samples, signature, max_rows=100)
    assert found.values == {
        "amount": [1.0, 2.0, 3.0],
        "country": ["nl", "de", "fr"],
        "score": [0.1, 0.9, 0.5],
    }
    assert found.roles == {
        "amount": ColumnRole.FEATURE,
        "country": ColumnRole.FEATURE,
        "score": ColumnRole.PREDICTION,
    }
    assert (found.samples, found.rows, found.first_id, found.last_id) == (2, 3, 1, 2)


def test_without_a_signature_positions_name_the_columns_and_a_cut_row_is_left_out() -> None:
    # An excerpt keeps the first values only: a row cut in the middle is not read.
    samples = [Sampled(7, {"x": _excerpt([3, 2], [1, 2, 3, 4, 5])}, {})]
    found = split_samples(samples, None, max_rows=100)
    assert found.values == {"x[0]": [1, 3], "x[1]": [2, 4]}
    assert found.rows == 2


def test_the_window_stops_after_the_sample_that_fills_it() -> None:
    samples = [Sampled(i, {"a": _excerpt([2], [i, i])}, {}) for i in range(1, 10)]
    found = split_samples(samples, None, max_rows=5)
    assert (found.samples, found.rows, found.last_id) == (3, 6, 3)


def test_malformed_excerpts_are_counted_not_read() -> None:
    samples = [
        Sampled(
            1,
            {
                "a": "not an excerpt",
                "b": {"shape": [-1], "data": [1]},
                "c": {"shape": [True], "data": [1]},
                "d": {"shape": [1, 10**6], "data": [1]},
                "e": _excerpt([1], [4.0]),
            },
            {},
        )
    ]
    found = split_samples(samples, None, max_rows=100)
    assert found.values == {"e": [4.0]}
    assert found.malformed == 4


def test_signature_names_skip_tensor_specs_and_junk() -> None:
    signature = {
        "inputs": [{"name": "x", "type": "tensor", "tensor-spec": {}}, {"name": 3}, "junk"],
        "outputs": [{"name": "p", "type": "double"}],
    }
    assert signature_names(signature) == ([], ["p"])
    assert signature_names(None) == ([], [])


def test_values_of_another_type_become_nulls_and_are_counted() -> None:
    array, changed = coerce([1, 2.5, None, "3", "NaN", "Infinity", "abc", [1], True], "numeric")
    assert changed == 2  # "abc" and the list
    assert array[:2].tolist() == [1.0, 2.5]
    assert [math.isnan(v) for v in array[2:]] == [True, False, True, False, True, True, False]
    assert (array[3], array[5], array[8]) == (3.0, math.inf, 1.0)
    texts, changed = coerce(["a", 1, None, {"x": 1}], "categorical")
    assert texts.tolist() == ["a", "1", None, None]
    assert changed == 1


def test_an_excerpt_reads_only_the_whole_rows_it_says_it_holds() -> None:
    whole = {"shape": [5, 2], "datatype": "FP64", "rows": 2, "data": [1, 2, 3, 4, 5]}
    cut = {"shape": [1, 100], "datatype": "FP64", "rows": 0, "data": list(range(64))}
    lying = {"shape": [3], "datatype": "FP64", "rows": -1, "data": [1, 2, 3]}
    found = split_samples(
        [Sampled(1, {"x": whole, "big": cut, "bad": lying}, {})], None, max_rows=9
    )
    assert found.values == {"x[0]": [1, 3], "x[1]": [2, 4]}
    assert found.malformed == 1  # the lying one; the long row is simply not read


HOUR = timedelta(hours=1)


def _backoff(
    state: str, rolled_back_at: datetime | None = None, *, latest: int = 1, after_s: float = 0
) -> str | None:
    """The rule for a run of pipeline version 1 started at T0, ended a minute later."""
    last = LastRetraining("r1", state, 1, T0, T0 + timedelta(minutes=1))
    now = T0 + timedelta(minutes=1, seconds=after_s)
    return retraining_backoff(
        last, rolled_back_at=rolled_back_at, latest_version=latest, now=now, backoff=HOUR
    )


def test_a_retraining_that_took_never_holds_the_next() -> None:
    assert _backoff("succeeded") is None
    # A rollback from before the run began was not the run's doing.
    assert _backoff("succeeded", T0 - timedelta(seconds=1)) is None


@pytest.mark.parametrize(
    ("state", "rolled_back_at", "why"),
    [
        ("failed", None, "its run failed"),
        ("cancelled", None, "its run cancelled"),
        ("succeeded", T0 + timedelta(minutes=1), "its canary was rolled back"),
    ],
)
def test_a_retraining_that_did_not_take_backs_off_until_a_new_pipeline_version(
    state: str, rolled_back_at: datetime | None, why: str
) -> None:
    assert _backoff(state, rolled_back_at) == (
        f"the last retraining run r1 did not take ({why}); retraining waits 3600 s more, "
        "or for a new version of the pipeline"
    )
    assert _backoff(state, rolled_back_at, after_s=3599.5) is not None
    assert "waits 1 s more" in (_backoff(state, rolled_back_at, after_s=3599.5) or "")
    assert _backoff(state, rolled_back_at, after_s=3600) is None
    assert _backoff(state, rolled_back_at, latest=2) is None


def test_the_backoff_counts_from_the_rollback_when_it_came_after_the_run() -> None:
    late = T0 + timedelta(minutes=31)  # the canary was judged for half an hour
    held = _backoff("succeeded", late, after_s=3000)
    assert held is not None
    assert "waits 2400 s more" in held  # 31 min + 1 h - 51 min
