"""Deployments: endpoints that split traffic across model versions, and their safe rollout.

The public, pure parts live here: the entities and the rules (:func:`choose_route`, the
rollout controller :func:`decide_rollout`, validation). Importing this package pulls in no
database or web framework, so the data plane (:mod:`shamal.serving`) uses it freely.
:class:`DeploymentService`, the control plane's rules over the database, loads on first use;
the router under ``/api/v1/deployments`` is :mod:`shamal.deployments.api`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.deployments._entities import (
    DEFAULT_INTERVAL_S,
    DEFAULT_SAMPLE_RATE,
    DEFAULT_STEPS,
    DEFAULT_STICKY_HEADER,
    Deployment,
    DeploymentEvent,
    Label,
    LabelsOutcome,
    LoadStatus,
    RolloutAction,
    RolloutDecision,
    RolloutPhase,
    RolloutPlan,
    RolloutState,
    Route,
    RouteChoice,
    RouteRole,
    Sample,
    SampledRequest,
    Slo,
    TrafficSplit,
    VersionStats,
)
from shamal.deployments._rules import (
    LATENCY_BOUNDS_MS,
    LATENCY_SLOTS,
    ModelUri,
    check_deployment_name,
    choose_route,
    decide_rollout,
    key_point,
    latency_slot,
    merge_stats,
    p99_ms,
    parse_model_uri,
    percentile_ms,
)

if TYPE_CHECKING:
    from shamal.deployments._service import DeploymentService

_WHERE: dict[str, tuple[str, str | None]] = {"DeploymentService": ("_service", "DeploymentService")}

__all__ = [
    "DeploymentService",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_STEPS",
    "DEFAULT_SAMPLE_RATE",
    "DEFAULT_STICKY_HEADER",
    "LATENCY_BOUNDS_MS",
    "LATENCY_SLOTS",
    "Deployment",
    "DeploymentEvent",
    "Label",
    "LabelsOutcome",
    "LoadStatus",
    "ModelUri",
    "RolloutAction",
    "RolloutDecision",
    "RolloutPhase",
    "RolloutPlan",
    "RolloutState",
    "Route",
    "RouteChoice",
    "RouteRole",
    "Sample",
    "SampledRequest",
    "Slo",
    "TrafficSplit",
    "VersionStats",
    "check_deployment_name",
    "choose_route",
    "decide_rollout",
    "key_point",
    "latency_slot",
    "merge_stats",
    "p99_ms",
    "parse_model_uri",
    "percentile_ms",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
