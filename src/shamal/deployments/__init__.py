"""Deployments: endpoints that split traffic across model versions, and their safe rollout.

The public, pure parts live here: the entities and the rules (:func:`choose_route`, the
rollout controller :func:`decide_rollout`, validation). Importing this package pulls in no
database or web framework, so the data plane (:mod:`shamal.serving`) uses it freely. The
control plane imports :mod:`shamal.deployments._service` (``DeploymentService``) and
:mod:`shamal.deployments.api` (the router under ``/api/v1/deployments``) explicitly.
"""

from __future__ import annotations

from shamal.deployments._entities import (
    DEFAULT_INTERVAL_S,
    DEFAULT_SAMPLE_RATE,
    DEFAULT_STEPS,
    DEFAULT_STICKY_HEADER,
    Deployment,
    DeploymentEvent,
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
)

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_STEPS",
    "DEFAULT_SAMPLE_RATE",
    "DEFAULT_STICKY_HEADER",
    "LATENCY_BOUNDS_MS",
    "LATENCY_SLOTS",
    "Deployment",
    "DeploymentEvent",
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
]
