"""What the deployments domain hands to callers: frozen values, never ORM rows.

A :class:`Deployment` maps one endpoint (its name) to versions of one registered model:
primaries that share the traffic by relative weight (A/B), at most one canary that takes a
percentage of it while a :class:`RolloutPlan` moves it up step by step, and shadows that get a
copy of requests whose answers are recorded and never returned. Every change makes a new
``revision``; serve processes poll for it.

This module and :mod:`shamal.deployments._rules` are pure: no database, no web framework, so
the data plane (:mod:`shamal.serving`) imports them freely.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: The request header whose value keeps a caller on one version (lower-case, as routers see it).
#: Share of requests whose inputs and outputs are kept for monitoring, unless a deployment says.
DEFAULT_SAMPLE_RATE = 0.01
DEFAULT_STICKY_HEADER = "x-shamal-route-key"
DEFAULT_STEPS: tuple[int, ...] = (10, 25, 50, 100)
DEFAULT_INTERVAL_S = 60.0


class RouteRole(enum.StrEnum):
    PRIMARY = "primary"
    CANARY = "canary"
    SHADOW = "shadow"


class RolloutPhase(enum.StrEnum):
    """Where a deployment's canary stands.

    ``stable``: no canary; ``progressing``: a canary takes a share that grows step by step;
    ``rolled_back``: the controller (or a person) removed a canary; ``promoted``: the canary
    became the primary. The last two are stable too: they only say how the last rollout ended.
    """

    STABLE = "stable"
    PROGRESSING = "progressing"
    ROLLED_BACK = "rolled_back"
    PROMOTED = "promoted"


class RolloutAction(enum.StrEnum):
    HOLD = "hold"
    STEP = "step"
    PROMOTE = "promote"
    ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class Route:
    """One version in a deployment's traffic split.

    Attributes:
        model_name: the registered model.
        version: the concrete version the ``uri`` resolved to when it was deployed.
        weight: primaries: a relative weight (>= 1) among primaries; canary: its percentage of
            all traffic (0-100); shadows: the percentage of requests mirrored to it (1-100).
        role: primary, canary or shadow.
        uri: the ``models:/`` URI the deployer gave (``models:/m@champion``, ``models:/m/3``).
    """

    model_name: str
    version: int
    weight: int
    role: RouteRole
    uri: str = ""

    @property
    def version_key(self) -> str:
        """The version as routers name it (a string, as in the inference protocol)."""
        return str(self.version)

    @property
    def concrete_uri(self) -> str:
        """``models:/<name>/<version>``: what a serve process loads."""
        return f"models:/{self.model_name}/{self.version}"


@dataclass(frozen=True, slots=True)
class TrafficSplit:
    """Every route of a deployment. At least one primary; at most one canary."""

    routes: tuple[Route, ...]

    @property
    def primaries(self) -> tuple[Route, ...]:
        return tuple(r for r in self.routes if r.role is RouteRole.PRIMARY)

    @property
    def canary(self) -> Route | None:
        return next((r for r in self.routes if r.role is RouteRole.CANARY), None)

    @property
    def shadows(self) -> tuple[Route, ...]:
        return tuple(r for r in self.routes if r.role is RouteRole.SHADOW)

    @property
    def canary_percent(self) -> int:
        canary = self.canary
        return 0 if canary is None else canary.weight

    def versions(self) -> tuple[int, ...]:
        """Every version a serve process must load, without repeats, in route order."""
        return tuple(dict.fromkeys(r.version for r in self.routes))

    def shares(self) -> dict[int, float]:
        """The fraction of answered traffic each version gets (shadows excluded)."""
        canary = self.canary_percent / 100.0
        total = sum(r.weight for r in self.primaries)
        out: dict[int, float] = {}
        for route in self.primaries:
            share = (1.0 - canary) * route.weight / total if total else 0.0
            out[route.version] = out.get(route.version, 0.0) + share
        if self.canary is not None:
            out[self.canary.version] = out.get(self.canary.version, 0.0) + canary
        return out


@dataclass(frozen=True, slots=True)
class Slo:
    """What a canary must keep to be promoted: checked once it has ``min_requests`` requests."""

    max_error_rate: float = 0.01
    max_p99_ms: float = 1000.0
    min_requests: int = 100


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    """The canary percentages to pass through, increasing, and the healthy time at each."""

    steps: tuple[int, ...] = DEFAULT_STEPS
    interval_s: float = DEFAULT_INTERVAL_S


@dataclass(frozen=True, slots=True)
class RolloutState:
    """The canary's progress: its share, the plan step it is at and since when."""

    phase: RolloutPhase
    canary_weight: int
    step_index: int
    since: datetime


@dataclass(frozen=True, slots=True)
class Deployment:
    """A deployment as stored: its spec, where its rollout stands and its revision."""

    name: str
    team: str
    split: TrafficSplit
    slo: Slo
    plan: RolloutPlan
    state: RolloutState
    revision: int
    sticky_header: str = DEFAULT_STICKY_HEADER
    sample_rate: float = DEFAULT_SAMPLE_RATE
    feature_service: str | None = None
    created_by: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def model_name(self) -> str:
        """The registered model every route serves a version of."""
        return self.split.routes[0].model_name


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """Where one request goes: the version that answers and the shadows that get a copy."""

    version: str
    shadows: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class VersionStats:
    """Calls one version answered in a window: counts and a latency histogram.

    ``latency_counts[i]`` counts calls with latency <= ``LATENCY_BOUNDS_MS[i]`` (and above the
    bound before it); the last slot counts the calls slower than every bound. Histograms from
    several serve processes add up, which percentiles do not.
    """

    requests: int = 0
    errors: int = 0
    latency_counts: tuple[int, ...] = ()

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class RolloutDecision:
    """What the rollout controller decided, and why (the reason is written to the events)."""

    action: RolloutAction
    reason: str
    canary_weight: int = 0
    step_index: int = 0


@dataclass(frozen=True, slots=True)
class DeploymentEvent:
    """One change of a deployment: who, when, which revision it made and why."""

    id: int
    at: datetime
    revision: int
    kind: str
    actor: str
    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SampledRequest:
    """A request a serve process sampled: the revision and version that served it, and small
    JSON-able excerpts of its inputs and outputs (tensor name -> excerpt)."""

    revision: int
    version: str
    shadow: bool
    inputs: Mapping[str, Any]
    outputs: Mapping[str, Any]
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One request's inputs and outputs as a serve process sampled them (small, JSON-able),
    its caller's request id and, once posted, its label (the true outcome: a value, or a
    list with one value per row of a batched request)."""

    id: int
    at: datetime
    revision: int
    version: str
    shadow: bool
    inputs: Mapping[str, Any]
    outputs: Mapping[str, Any]
    request_id: str | None = None
    label: Any = None
    labelled_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Label:
    """The true outcome of a served request, posted when it is known (often days later)."""

    request_id: str
    value: Any


@dataclass(frozen=True, slots=True)
class LabelsOutcome:
    """What a post of labels did: how many were stored, and the request ids no kept sample
    has (yet): a serve process ships its samples every few seconds, and only a sampled share
    of requests is kept at all, so such labels are stored too, and joined if their sample
    arrives."""

    stored: int
    unmatched: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WeightedUri:
    """A ``models:/`` URI and its weight (primaries: relative; canary and shadows: percent)."""

    uri: str
    weight: int = 100


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    """What a deployer asks for; URIs are resolved to versions when it is applied.

    Attributes:
        primaries: the versions that answer, with relative weights (A/B).
        canary: a version taking ``weight`` percent of traffic, moved up by ``plan``.
        shadows: versions mirroring ``weight`` percent of requests; answers never returned.
        team: the owning team (default: the caller's only team); fixed once created.
        feature_service: the feature service whose online features are looked up for a
            request's entities before the model is called (and which the feature store then
            refuses to break).
    """

    primaries: tuple[WeightedUri, ...]
    canary: WeightedUri | None = None
    shadows: tuple[WeightedUri, ...] = ()
    plan: RolloutPlan = field(default_factory=RolloutPlan)
    slo: Slo = field(default_factory=Slo)
    sticky_header: str = DEFAULT_STICKY_HEADER
    sample_rate: float = DEFAULT_SAMPLE_RATE
    team: str | None = None
    feature_service: str | None = None


@dataclass(frozen=True, slots=True)
class VersionReport:
    """One serve process's statistics for one version since its last report."""

    version: str
    stats: VersionStats


@dataclass(frozen=True, slots=True)
class LoadStatus:
    """What one serve process says about the versions it has not (yet) loaded.

    Attributes:
        loading: versions it is still loading (they get no traffic there yet).
        failed: version -> why it could not be loaded (bad files, a refused pickle, a failed
            download); such a version never gets traffic there.
    """

    loading: frozenset[str] = frozenset()
    failed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    """What a report led to: the controller's decision and the deployment's revision after it."""

    revision: int
    decision: RolloutDecision
