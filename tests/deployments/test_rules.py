"""The pure rules: URI parsing, validation, the traffic router and the rollout controller."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shamal.deployments import (
    LATENCY_BOUNDS_MS,
    LATENCY_SLOTS,
    Deployment,
    RolloutAction,
    RolloutPhase,
    RolloutPlan,
    RolloutState,
    Route,
    RouteRole,
    Slo,
    TrafficSplit,
    VersionStats,
    _rules,
    choose_route,
    decide_rollout,
    latency_slot,
    merge_stats,
    p99_ms,
    parse_model_uri,
)
from shamal.errors import InvalidParameter

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _split(
    primaries: list[int], canary: int | None = None, shadows: tuple[int, ...] = ()
) -> TrafficSplit:
    routes = [Route("m", i + 1, w, RouteRole.PRIMARY) for i, w in enumerate(primaries)]
    if canary is not None:
        routes.append(Route("m", 50, canary, RouteRole.CANARY))
    routes += [Route("m", 60 + i, w, RouteRole.SHADOW) for i, w in enumerate(shadows)]
    return TrafficSplit(tuple(routes))


splits = st.builds(
    _split,
    st.lists(st.integers(1, 1000), min_size=1, max_size=5),
    st.one_of(st.none(), st.integers(0, 100)),
    st.lists(st.integers(1, 100), max_size=3).map(tuple),
)


# ---------------------------------------------------------------------- parsing and validation
@pytest.mark.parametrize(
    ("uri", "name", "version", "alias"),
    [
        ("models:/fraud/3", "fraud", 3, None),
        ("models:/fraud@champion", "fraud", None, "champion"),
        ("models:/my model.v2/12", "my model.v2", 12, None),
    ],
)
def test_model_uris_parse(uri: str, name: str, version: int | None, alias: str | None) -> None:
    parsed = parse_model_uri(uri)
    assert (parsed.name, parsed.version, parsed.alias) == (name, version, alias)


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "models:/fraud",
        "models:/fraud/0",
        "models:/fraud/-1",
        "models:/fraud/latest",
        "models:/fraud@latest",
        "models:/a/b/3",
        "models:/../3",
        "runs:/abc/model",
        "file:///etc/passwd",
        "models:/fraud@x'; DROP TABLE deployments; --",
        "models:/fr\naud/1",
        "models:/fraud/1\r\nX-Injected: 1",
        "models:/x@y@z",
    ],
)
def test_malformed_model_uris_are_refused(uri: str) -> None:
    with pytest.raises(InvalidParameter):
        parse_model_uri(uri)


def test_plans_are_sorted_and_bounded() -> None:
    assert _rules.check_plan([50, 10, 25, 10], 30).steps == (10, 25, 50)
    for steps, interval in (([], 1.0), ([0], 1.0), ([101], 1.0), ([10], 0.0), ([10], 1e9)):
        with pytest.raises(InvalidParameter):
            _rules.check_plan(steps, interval)
    with pytest.raises(InvalidParameter):
        _rules.check_plan([10], float("nan"))


def test_split_rules() -> None:
    ok = _split([70, 30], canary=10, shadows=(100,))
    assert _rules.check_split(ok) is ok
    bad = [
        TrafficSplit(()),
        TrafficSplit((Route("m", 1, 1, RouteRole.PRIMARY), Route("n", 2, 1, RouteRole.PRIMARY))),
        TrafficSplit((Route("m", 1, 1, RouteRole.PRIMARY), Route("m", 1, 5, RouteRole.CANARY))),
        TrafficSplit((Route("m", 1, 0, RouteRole.PRIMARY),)),
        TrafficSplit((Route("m", 1, 10_001, RouteRole.PRIMARY),)),
        TrafficSplit((Route("m", 1, 1, RouteRole.PRIMARY), Route("m", 2, 101, RouteRole.CANARY))),
        _split([1], shadows=(100, 100, 100, 100, 100)),
    ]
    for split in bad:
        with pytest.raises(InvalidParameter):
            _rules.check_split(split)


# ---------------------------------------------------------------------- routing properties
@given(split=splits, key=st.text(min_size=1, max_size=40))
def test_the_same_key_always_gets_the_same_version(split: TrafficSplit, key: str) -> None:
    first = choose_route(split, key, draw=random.random)
    for _ in range(3):
        assert choose_route(split, key, draw=random.random) == first


@given(split=splits, key=st.one_of(st.none(), st.text(max_size=20)), seed=st.integers(0, 2**32))
def test_shadows_never_answer(split: TrafficSplit, key: str | None, seed: int) -> None:
    rng = random.Random(seed)
    choice = choose_route(split, key, draw=rng.random)
    shadow_versions = {r.version_key for r in split.shadows}
    answering = {r.version_key for r in split.routes if r.role is not RouteRole.SHADOW}
    assert choice.version in answering
    assert choice.version not in shadow_versions
    assert set(choice.shadows) <= shadow_versions


@settings(max_examples=25, deadline=None)
@given(split=splits, seed=st.integers(0, 2**32))
def test_observed_split_matches_the_weights(split: TrafficSplit, seed: int) -> None:
    rng = random.Random(seed)
    n = 8000
    seen = Counter(
        choose_route(split, f"user-{rng.getrandbits(64)}", draw=rng.random).version
        for _ in range(n)
    )
    for version, share in split.shares().items():
        # 5 standard deviations of a binomial proportion, plus a little slack.
        tolerance = 5 * (share * (1 - share) / n) ** 0.5 + 0.002
        assert abs(seen[str(version)] / n - share) <= tolerance, (version, share, seen)


def test_random_routing_without_a_key_follows_the_draw() -> None:
    split = _split([1, 1], canary=20)
    assert choose_route(split, None, draw=lambda: 0.1).version == "50"
    assert choose_route(split, None, draw=lambda: 0.3).version == "1"
    assert choose_route(split, None, draw=lambda: 0.9).version == "2"
    assert choose_route(split, "", draw=lambda: 0.9).version == "2"  # empty key: no key


@given(key=st.text(min_size=1, max_size=30), low=st.integers(0, 100), high=st.integers(0, 100))
def test_a_key_on_the_canary_stays_there_as_it_grows(key: str, low: int, high: int) -> None:
    low, high = min(low, high), max(low, high)
    if choose_route(_split([1], canary=low), key).version == "50":
        assert choose_route(_split([1], canary=high), key).version == "50"


def test_partial_shadows_mirror_their_share() -> None:
    split = _split([1], shadows=(30,))
    mirrored = sum(bool(choose_route(split, f"k{i}").shadows) for i in range(5000))
    assert abs(mirrored / 5000 - 0.30) < 0.03


# ---------------------------------------------------------------------- statistics
def test_latency_histogram_and_p99() -> None:
    counts = [0] * LATENCY_SLOTS
    for _ in range(990):
        counts[latency_slot(5.0)] += 1
    for _ in range(10):
        counts[latency_slot(400.0)] += 1
    assert 5.0 <= p99_ms(counts) <= 6.0  # the 990th call is at 5 ms; bounds are 20% apart
    counts[latency_slot(400.0)] += 1
    assert 400.0 <= p99_ms(counts) <= 480.0
    assert p99_ms([]) == 0.0
    assert p99_ms([0] * (LATENCY_SLOTS - 1) + [3]) == float("inf")
    assert latency_slot(LATENCY_BOUNDS_MS[-1] * 2) == LATENCY_SLOTS - 1
    merged = merge_stats(VersionStats(2, 1, (1, 1)), VersionStats(3, 0, (0, 0, 3)))
    assert merged == VersionStats(5, 1, (1, 1, 3))


# ---------------------------------------------------------------------- the controller
def _canary(
    weight: int = 10, since: datetime = T0, phase: RolloutPhase = RolloutPhase.PROGRESSING
) -> Deployment:
    plan = RolloutPlan((10, 25, 50, 100), 60.0)
    split = _split([100], canary=weight)
    return Deployment(
        name="d",
        team="red",
        split=split,
        slo=Slo(max_error_rate=0.05, max_p99_ms=50.0, min_requests=100),
        plan=plan,
        state=RolloutState(phase, weight, _rules.reached_steps(plan, weight), since),
        revision=3,
    )


def _stats(requests: int, errors: int = 0, latency_ms: float = 5.0) -> dict[str, VersionStats]:
    counts = [0] * LATENCY_SLOTS
    counts[latency_slot(latency_ms)] = requests
    return {"50": VersionStats(requests, errors, tuple(counts))}


def test_healthy_canary_holds_until_the_interval_then_steps_up() -> None:
    deployment = _canary(10)
    early = decide_rollout(deployment, _stats(500), T0 + timedelta(seconds=59))
    assert early.action is RolloutAction.HOLD
    assert "healthy" in early.reason
    later = decide_rollout(deployment, _stats(500), T0 + timedelta(seconds=60))
    assert (later.action, later.canary_weight, later.step_index) == (RolloutAction.STEP, 25, 2)


def test_healthy_canary_at_the_last_step_is_promoted() -> None:
    done = decide_rollout(_canary(100), _stats(500), T0 + timedelta(minutes=2))
    assert done.action is RolloutAction.PROMOTE
    assert _rules.promoted(_canary(100).split).primaries == (
        Route("m", 50, 100, RouteRole.PRIMARY),
    )


def test_error_rate_breach_rolls_back() -> None:
    decision = decide_rollout(_canary(), _stats(200, errors=11), T0 + timedelta(seconds=1))
    assert decision.action is RolloutAction.ROLLBACK
    assert "error rate 5.50%" in decision.reason
    kept = decide_rollout(_canary(), _stats(200, errors=10), T0 + timedelta(seconds=1))
    assert kept.action is RolloutAction.HOLD  # exactly at the SLO is within it


def test_p99_breach_rolls_back() -> None:
    decision = decide_rollout(_canary(), _stats(200, latency_ms=80.0), T0 + timedelta(hours=1))
    assert decision.action is RolloutAction.ROLLBACK
    assert "p99" in decision.reason


def test_too_few_requests_hold_even_when_all_fail() -> None:
    decision = decide_rollout(
        _canary(), _stats(99, errors=99, latency_ms=9e9), T0 + timedelta(hours=1)
    )
    assert decision.action is RolloutAction.HOLD
    assert "99 of the 100" in decision.reason
    assert decide_rollout(_canary(), {}, T0 + timedelta(hours=1)).action is RolloutAction.HOLD


def test_no_rollout_in_progress_holds() -> None:
    for phase in (RolloutPhase.STABLE, RolloutPhase.ROLLED_BACK, RolloutPhase.PROMOTED):
        decision = decide_rollout(
            _canary(phase=phase), _stats(500, errors=500), T0 + timedelta(hours=1)
        )
        assert decision.action is RolloutAction.HOLD
    rolled = _rules.rolled_back(_canary().split)
    assert rolled.canary is None
    assert rolled.primaries == _canary().split.primaries
