"""Pure rules of deployments: validation, the traffic router and the rollout controller.

Nothing here does I/O or reads a clock: the control plane (``_service``) and the data plane
(:mod:`shamal.serving._deployment`) call the same functions.

* :func:`choose_route` picks the version that answers a request: a weighted choice that is a
  function of the request key (sticky: the same key always lands on the same version while the
  split stays the same, and a key that landed on a canary stays there as the canary grows);
  random when the request carries no key. Shadows are listed apart and never answer.
* :func:`decide_rollout` is the rollout controller: (deployment, window statistics, now) ->
  hold, step up, promote or roll back, with the reason.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from shamal.deployments._entities import (
    Deployment,
    Label,
    LoadStatus,
    RolloutAction,
    RolloutDecision,
    RolloutPhase,
    RolloutPlan,
    RolloutState,
    Route,
    RouteChoice,
    RouteRole,
    Slo,
    TrafficSplit,
    VersionStats,
)
from shamal.errors import InvalidParameter

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
#: ``models:/<name>/<version>`` or ``models:/<name>@<alias>``; the name as the registry allows
#: it, minus ``@`` (which would make the URI ambiguous).
MODEL_URI_PATTERN = r"^models:/[^/:@\x00-\x1f\x7f]{1,256}(/[1-9][0-9]{0,8}|@[A-Za-z0-9_-]{1,256})$"
HEADER_PATTERN = r"^[A-Za-z0-9-]{1,64}$"
MAX_PRIMARIES = 8
MAX_SHADOWS = 4
MAX_STEPS = 20
MAX_WEIGHT = 10_000
MAX_INTERVAL_S = 7 * 24 * 3600.0
MAX_P99_MS = 3_600_000.0
MAX_MIN_REQUESTS = 1_000_000_000

_NAME_RE = re.compile(NAME_PATTERN)
_URI_RE = re.compile(MODEL_URI_PATTERN)
_HEADER_RE = re.compile(HEADER_PATTERN)
_FEATURE_SERVICE_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")

#: Upper bounds (ms) of the latency histogram's buckets: geometric, 0.1 ms to ~2 minutes, each
#: 20% above the one before, so a percentile read off it is at most 20% high.
LATENCY_BOUNDS_MS: tuple[float, ...] = tuple(0.1 * 1.2**i for i in range(78))
LATENCY_SLOTS = len(LATENCY_BOUNDS_MS) + 1


@dataclass(frozen=True, slots=True)
class ModelUri:
    """A parsed ``models:/`` URI: a model and either a version or an alias."""

    name: str
    version: int | None
    alias: str | None
    text: str


# ---------------------------------------------------------------------- validation
def check_deployment_name(name: str) -> str:
    """Deployment names: lowercase letters, digits, ``.-_``, 1-64 characters."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidParameter(
            "deployment names use lowercase letters, digits, '.', '-' and '_' (1-64 characters)"
        )
    return name


def parse_model_uri(uri: str) -> ModelUri:
    """``models:/name/3`` or ``models:/name@alias``; anything else is InvalidParameter."""
    match = _URI_RE.fullmatch(uri) if isinstance(uri, str) else None
    if match is None:
        raise InvalidParameter(
            "models are named models:/<name>/<version> or models:/<name>@<alias>"
        )
    body = uri.removeprefix("models:/")
    if match.group(1).startswith("@"):
        name, _, alias = body.partition("@")
        if alias.lower() == "latest":
            raise InvalidParameter("name a version or an alias; 'latest' moves under you")
        version = None
    else:
        name, _, number = body.rpartition("/")
        alias, version = None, int(number)
    if name in (".", "..") or not name.strip():
        raise InvalidParameter("the model name in a models:/ URI is blank or a path")
    return ModelUri(name, version, alias, uri)


def check_weight(weight: int, *, low: int = 1, high: int = MAX_WEIGHT, what: str = "weight") -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not low <= weight <= high:
        raise InvalidParameter(f"{what} must be a whole number from {low} to {high}")
    return weight


def check_percent(percent: int, what: str = "percent") -> int:
    return check_weight(percent, low=1, high=100, what=what)


def check_plan(steps: Iterable[int], interval_s: float) -> RolloutPlan:
    """Steps are canary percentages (1-100), taken in increasing order whatever order they
    came in; ``interval_s`` is the healthy time at each, more than 0 and at most a week."""
    chosen = sorted({check_percent(step, "each rollout step") for step in steps})
    if not 1 <= len(chosen) <= MAX_STEPS:
        raise InvalidParameter(f"a rollout plan has 1 to {MAX_STEPS} steps")
    if not _finite(interval_s) or not 0 < interval_s <= MAX_INTERVAL_S:
        raise InvalidParameter("the rollout interval must be more than 0 s and at most 7 days")
    return RolloutPlan(tuple(chosen), float(interval_s))


def check_slo(max_error_rate: float, max_p99_ms: float, min_requests: int) -> Slo:
    if not _finite(max_error_rate) or not 0 <= max_error_rate <= 1:
        raise InvalidParameter("the SLO's error rate is a fraction from 0 to 1")
    if not _finite(max_p99_ms) or not 0 < max_p99_ms <= MAX_P99_MS:
        raise InvalidParameter("the SLO's p99 latency is more than 0 ms and at most an hour")
    check_weight(min_requests, high=MAX_MIN_REQUESTS, what="the SLO's minimum request count")
    return Slo(float(max_error_rate), float(max_p99_ms), min_requests)


def check_sample_rate(rate: float) -> float:
    if not _finite(rate) or not 0 <= rate <= 1:
        raise InvalidParameter("the sample rate is a fraction from 0 to 1")
    return float(rate)


#: Labels in one post, values in one label (a batched request's rows), characters of text.
MAX_LABELS = 1000
MAX_LABEL_VALUES = 256
MAX_LABEL_TEXT = 256
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


def check_labels(labels: Sequence[Label]) -> list[Label]:
    """Labels as posted: each request id once (printable ASCII, at most 128 characters), each
    value a finite number, a boolean, a short text, or a list of them (one per row of a
    batched request).

    Raises:
        InvalidParameter: naming the first label that breaks a rule; nothing is stored.
    """
    if not 1 <= len(labels) <= MAX_LABELS:
        raise InvalidParameter(f"post from 1 to {MAX_LABELS} labels at a time")
    seen: set[str] = set()
    for label in labels:
        if not isinstance(label.request_id, str) or not _REQUEST_ID.fullmatch(label.request_id):
            raise InvalidParameter(
                "a request id is 1 to 128 printable ASCII characters, as sent in the request's id"
            )
        if label.request_id in seen:
            raise InvalidParameter(f"request id {label.request_id!r} has two labels in one post")
        seen.add(label.request_id)
        values = label.value if isinstance(label.value, list) else [label.value]
        if not 1 <= len(values) <= MAX_LABEL_VALUES or not all(map(_label_value, values)):
            raise InvalidParameter(
                f"the label of request {label.request_id!r} must be a finite number, a boolean "
                f"or a text of at most {MAX_LABEL_TEXT} characters, or a list of 1 to "
                f"{MAX_LABEL_VALUES} of them (one per row)"
            )
    return list(labels)


def _label_value(value: Any) -> bool:
    if isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_LABEL_TEXT


def check_feature_service(name: str | None) -> str | None:
    """A feature service's name (as the feature store's names are), or None."""
    if name is None:
        return None
    if not isinstance(name, str) or not _FEATURE_SERVICE_RE.fullmatch(name):
        raise InvalidParameter(
            "a feature service's name is lower-case letters, digits and '_', starting with a "
            "letter (at most 63)"
        )
    return name


def check_sticky_header(header: str) -> str:
    """A header name (letters, digits, ``-``); stored lower-case, as routers see headers."""
    if not isinstance(header, str) or not _HEADER_RE.fullmatch(header):
        raise InvalidParameter("the sticky header is a header name: letters, digits and '-'")
    return header.lower()


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_split(split: TrafficSplit) -> TrafficSplit:
    """One model, 1-8 primaries, at most one canary and 4 shadows, each version in one role.

    Raises:
        InvalidParameter: the split breaks one of these rules.
    """
    primaries, shadows = split.primaries, split.shadows
    if not 1 <= len(primaries) <= MAX_PRIMARIES:
        raise InvalidParameter(f"a deployment has 1 to {MAX_PRIMARIES} primary versions")
    if len(shadows) > MAX_SHADOWS:
        raise InvalidParameter(f"a deployment has at most {MAX_SHADOWS} shadows")
    if sum(r.role is RouteRole.CANARY for r in split.routes) > 1:
        raise InvalidParameter("a deployment has at most one canary")
    if len({r.model_name for r in split.routes}) != 1:
        raise InvalidParameter("every route of a deployment serves a version of one model")
    if len({r.version for r in split.routes}) != len(split.routes):
        raise InvalidParameter("each version appears once in a deployment (one role each)")
    for route in primaries:
        check_weight(route.weight, what="a primary's weight")
    for route in shadows:
        check_percent(route.weight, "a shadow's mirrored percentage")
    if split.canary is not None:
        check_weight(split.canary.weight, low=0, high=100, what="the canary's percentage")
    return split


# ---------------------------------------------------------------------- routing
def key_point(key: str) -> float:
    """Where a request key falls in [0, 1): the same in every process (no salted hash)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def choose_route(
    split: TrafficSplit, key: str | None, *, draw: Callable[[], float] = random.random
) -> RouteChoice:
    """The version that answers a request, and the shadows that get a copy.

    The canary takes the first ``canary_percent`` of [0, 1); primaries share the rest by
    weight. With a key, the point is :func:`key_point`; without one, ``draw()``. Each shadow
    mirrors its percentage of requests (by the key too, when there is one); a shadow is never
    the answering version.
    """
    point = key_point(key) if key else draw()
    canary = split.canary
    cut = split.canary_percent / 100.0 if canary is not None else 0.0
    if canary is not None and point < cut:
        chosen = canary
    else:
        primaries = split.primaries
        total = sum(r.weight for r in primaries)
        rest = (point - cut) / (1.0 - cut) if cut < 1.0 else 0.0
        target = rest * total
        chosen = primaries[-1]
        running = 0
        for route in primaries:
            running += route.weight
            if target < running:
                chosen = route
                break
    shadows = tuple(
        s.version_key
        for s in split.shadows
        if s.version != chosen.version and _mirrors(s, key, draw)
    )
    return RouteChoice(chosen.version_key, shadows)


def _mirrors(shadow: Route, key: str | None, draw: Callable[[], float]) -> bool:
    if shadow.weight >= 100:
        return True
    point = key_point(f"{key}\x00shadow\x00{shadow.version}") if key else draw()
    return point < shadow.weight / 100.0


# ---------------------------------------------------------------------- statistics
def latency_slot(latency_ms: float) -> int:
    """The histogram slot of one latency."""
    return bisect.bisect_left(LATENCY_BOUNDS_MS, latency_ms)


def p99_ms(counts: Sequence[int]) -> float:
    """The 99th percentile read off a histogram (the bound of its bucket; inf past the last)."""
    return percentile_ms(counts, 0.99)


def percentile_ms(counts: Sequence[int], fraction: float) -> float:
    total = sum(counts)
    if total <= 0:
        return 0.0
    rank = max(1, math.ceil(fraction * total))
    running = 0
    for slot, count in enumerate(counts):
        running += count
        if running >= rank:
            return LATENCY_BOUNDS_MS[slot] if slot < len(LATENCY_BOUNDS_MS) else math.inf
    return math.inf  # pragma: no cover - the loop always reaches the rank


def merge_stats(a: VersionStats, b: VersionStats) -> VersionStats:
    """Two windows' statistics added up (from two serve processes, or two reports)."""
    width = max(len(a.latency_counts), len(b.latency_counts))
    left = list(a.latency_counts) + [0] * (width - len(a.latency_counts))
    right = list(b.latency_counts) + [0] * (width - len(b.latency_counts))
    return VersionStats(
        a.requests + b.requests,
        a.errors + b.errors,
        tuple(x + y for x, y in zip(left, right, strict=True)),
    )


# ---------------------------------------------------------------------- rollout
def reached_steps(plan: RolloutPlan, weight: int) -> int:
    """How many of the plan's steps a canary at ``weight`` percent has reached."""
    return bisect.bisect_right(plan.steps, weight)


def next_step(plan: RolloutPlan, weight: int) -> int | None:
    """The next percentage for a canary at ``weight``; None when it has passed the last."""
    index = reached_steps(plan, weight)
    return plan.steps[index] if index < len(plan.steps) else None


def initial_state(split: TrafficSplit, plan: RolloutPlan, now: datetime) -> RolloutState:
    """A new spec's state: progressing from the canary's percentage, else stable."""
    canary = split.canary
    if canary is None:
        return RolloutState(RolloutPhase.STABLE, 0, 0, now)
    return RolloutState(
        RolloutPhase.PROGRESSING, canary.weight, reached_steps(plan, canary.weight), now
    )


def decide_rollout(
    deployment: Deployment,
    window: Mapping[str, VersionStats],
    now: datetime,
    loads: LoadStatus | None = None,
) -> RolloutDecision:
    """The rollout controller: what to do with the canary, given its window's statistics.

    Args:
        deployment: the deployment as stored.
        window: statistics per version (as strings) since the current revision began.
        now: the current time (aware).
        loads: what a serve process reported about versions it has not loaded (None: nothing).

    Returns:
        ``rollback`` when a serve process could not load the canary, or when the canary has
        at least ``slo.min_requests`` requests and its error rate or p99 latency breaks the
        SLO; ``hold`` while the canary is still loading, has fewer requests, or has been
        healthy for less than ``plan.interval_s``; then ``step`` to the plan's next
        percentage, or ``promote`` once it has passed the last step. ``hold`` when no rollout
        is progressing.
    """
    canary = deployment.split.canary
    state = deployment.state
    if canary is None or state.phase is not RolloutPhase.PROGRESSING:
        return RolloutDecision(RolloutAction.HOLD, "no rollout in progress")
    stats = window.get(canary.version_key, VersionStats())
    slo, plan = deployment.slo, deployment.plan
    held = RolloutDecision(RolloutAction.HOLD, "", state.canary_weight, state.step_index)
    who = f"canary v{canary.version}"
    early = _load_decision(who, canary.version_key, loads, held)
    if early is None and stats.requests < slo.min_requests:
        early = replace(
            held, reason=f"{who} has {stats.requests} of the {slo.min_requests} requests needed"
        )
    if early is not None:
        return early
    breach = slo_breach(who, stats, slo)
    if breach is not None:
        return RolloutDecision(RolloutAction.ROLLBACK, breach)
    latency = p99_ms(stats.latency_counts)
    elapsed = (now - state.since).total_seconds()
    if elapsed < plan.interval_s:
        return replace(held, reason=f"{who} healthy for {elapsed:.0f} s of {plan.interval_s:g} s")
    following = next_step(plan, state.canary_weight)
    if following is None:
        return RolloutDecision(
            RolloutAction.PROMOTE,
            f"{who} healthy at {state.canary_weight}% for {elapsed:.0f} s: promoted",
        )
    return RolloutDecision(
        RolloutAction.STEP,
        f"{who} healthy at {state.canary_weight}% for {elapsed:.0f} s "
        f"(p99 {_ms(latency)}, errors {stats.error_rate:.2%}): {following}%",
        following,
        reached_steps(plan, following),
    )


def _load_decision(
    who: str, version: str, loads: LoadStatus | None, held: RolloutDecision
) -> RolloutDecision | None:
    """Roll back a canary a serve process could not load; hold one it is still loading."""
    if loads is None:
        return None
    failure = loads.failed.get(version)
    if failure is not None:
        return RolloutDecision(RolloutAction.ROLLBACK, f"{who} failed to load: {failure}")
    if version in loads.loading:
        return replace(held, reason=f"{who} is still loading; it gets no traffic yet")
    return None


def slo_breach(who: str, stats: VersionStats, slo: Slo) -> str | None:
    """Why ``stats`` break ``slo`` (error rate first, then p99), or None if they keep it."""
    if stats.error_rate > slo.max_error_rate:
        return (
            f"{who} error rate {stats.error_rate:.2%} ({stats.errors}/{stats.requests}) "
            f"breaks the SLO's {slo.max_error_rate:.2%}"
        )
    latency = p99_ms(stats.latency_counts)
    if latency > slo.max_p99_ms:
        return (
            f"{who} p99 latency {_ms(latency)} breaks the SLO's {slo.max_p99_ms:g} ms "
            f"({stats.requests} requests)"
        )
    return None


def _ms(value: float) -> str:
    return "over 2 minutes" if math.isinf(value) else f"{value:.3g} ms"


def with_canary_weight(split: TrafficSplit, weight: int) -> TrafficSplit:
    """The split with the canary at ``weight`` percent."""
    return TrafficSplit(
        tuple(replace(r, weight=weight) if r.role is RouteRole.CANARY else r for r in split.routes)
    )


def promoted(split: TrafficSplit) -> TrafficSplit:
    """The canary becomes the only primary (all answered traffic); shadows stay."""
    canary = split.canary
    if canary is None:
        raise InvalidParameter("there is no canary to promote")
    primary = replace(canary, role=RouteRole.PRIMARY, weight=100)
    return TrafficSplit((primary, *split.shadows))


def rolled_back(split: TrafficSplit) -> TrafficSplit:
    """The split without its canary."""
    return TrafficSplit(tuple(r for r in split.routes if r.role is not RouteRole.CANARY))
