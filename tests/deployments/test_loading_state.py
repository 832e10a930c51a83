"""Versions a serve process has not loaded yet (or could not load): what the controller makes of
them, how the control plane records it, and the data plane's side (the loader, the routable
split)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from shamal.client import ShamalClient
from shamal.deployments import (
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
    decide_rollout,
    latency_slot,
)
from shamal.deployments._entities import DeploymentSpec, LoadStatus, VersionReport, WeightedUri
from shamal.deployments._service import DeploymentService
from shamal.deployments.api import ReportIn
from shamal.errors import InvalidParameter, ServiceUnavailable
from shamal.server import Platform
from shamal.serving._deployment import DeploymentRouter, routable_split
from shamal.serving._repository import (
    LoadState,
    ModelRepository,
    ModelSource,
    ServedModel,
    VersionLoader,
)
from shamal.serving._types import ModelMetadata, TensorSpec
from tests.deployments.conftest import ManualClock, People

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SLO = Slo(max_error_rate=0.05, max_p99_ms=50.0, min_requests=20)


def _stats(requests: int, errors: int = 0, ms: float = 5.0) -> VersionStats:
    counts = [0] * LATENCY_SLOTS
    counts[latency_slot(ms)] = requests
    return VersionStats(requests, errors, tuple(counts))


def _deployment(canary: int = 2) -> Deployment:
    split = TrafficSplit(
        (
            Route("m", 1, 100, RouteRole.PRIMARY),
            Route("m", canary, 10, RouteRole.CANARY),
            Route("m", 3, 100, RouteRole.SHADOW),
        )
    )
    return Deployment(
        name="d",
        team="red",
        split=split,
        slo=SLO,
        plan=RolloutPlan((10, 50), 60.0),
        state=RolloutState(RolloutPhase.PROGRESSING, 10, 1, T0),
        revision=4,
    )


# ---------------------------------------------------------------------- the pure controller
def test_a_canary_that_failed_to_load_is_rolled_back_with_the_reason() -> None:
    loads = LoadStatus(failed={"2": "Model 'd': model.onnx is a pickle"})
    decision = decide_rollout(_deployment(), {}, T0, loads)
    assert decision.action is RolloutAction.ROLLBACK
    assert decision.reason == "canary v2 failed to load: Model 'd': model.onnx is a pickle"


def test_a_loading_canary_is_neither_judged_nor_stepped() -> None:
    later = T0 + timedelta(seconds=600)
    healthy = {"2": _stats(500)}
    assert decide_rollout(_deployment(), healthy, later).action is RolloutAction.STEP
    held = decide_rollout(_deployment(), healthy, later, LoadStatus(loading=frozenset({"2"})))
    assert (held.action, held.canary_weight, held.step_index) == (RolloutAction.HOLD, 10, 1)
    assert "still loading" in held.reason
    failing = {"2": _stats(500, errors=500)}
    assert decide_rollout(_deployment(), failing, later).action is RolloutAction.ROLLBACK
    not_judged = decide_rollout(_deployment(), failing, later, LoadStatus(frozenset({"2"})))
    assert not_judged.action is RolloutAction.HOLD


def test_other_versions_failing_to_load_do_not_touch_the_canary() -> None:
    loads = LoadStatus(loading=frozenset({"1"}), failed={"3": "bad files"})
    decision = decide_rollout(_deployment(), {"2": _stats(5)}, T0, loads)
    assert decision.action is RolloutAction.HOLD
    assert "5 of the 20" in decision.reason
    stable = Deployment(**_stable_fields())
    no_rollout = decide_rollout(stable, {}, T0, LoadStatus(failed={"2": "x"}))
    assert no_rollout.action is RolloutAction.HOLD


def _stable_fields() -> dict[str, Any]:
    d = _deployment()
    return {
        "name": d.name,
        "team": d.team,
        "split": TrafficSplit(d.split.primaries),
        "slo": d.slo,
        "plan": d.plan,
        "state": RolloutState(RolloutPhase.STABLE, 0, 0, T0),
        "revision": d.revision,
    }


# ---------------------------------------------------------------------- the control plane
def _spec() -> DeploymentSpec:
    return DeploymentSpec(
        primaries=(WeightedUri("models:/fraud@champion"),),
        canary=WeightedUri("models:/fraud/2", 10),
        slo=SLO,
        plan=RolloutPlan((10, 50), 60.0),
    )


def test_service_rolls_back_a_canary_reported_as_failed_to_load_and_audits_it(
    service: DeploymentService, people: People, platform: Platform
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo = people.principals["mo"]
    reason = "Model 'fraud-api': model.onnx is a pickle"
    outcome = service.record_report(mo, "fraud-api", 1, [], LoadStatus(failed={"2": reason}))
    assert (outcome.decision.action, outcome.revision) == (RolloutAction.ROLLBACK, 2)
    after = service.get(mo, "fraud-api")
    assert (after.state.phase, after.split.canary) == (RolloutPhase.ROLLED_BACK, None)
    last = service.events(mo, "fraud-api")[-1]
    assert (last.kind, last.actor) == ("rollback", "rollout-controller")
    assert last.reason == f"canary v2 failed to load: {reason}"
    assert last.detail["rolled_back"] == "models:/fraud/2"
    entry = platform.audit.entries(limit=5)[0]
    assert (entry.action, entry.actor) == ("deployment.rollout.rollback", "rollout-controller")


def test_service_holds_a_loading_canary_and_ignores_load_news_of_an_old_revision(
    service: DeploymentService, people: People, clock: ManualClock
) -> None:
    service.deploy(people.ctx("mo"), "fraud-api", _spec())
    mo = people.principals["mo"]
    clock.advance(120)
    healthy = VersionReport("2", _stats(30))
    loading = LoadStatus(loading=frozenset({"2"}))
    held = service.record_report(mo, "fraud-api", 1, [healthy], loading)
    assert (held.decision.action, held.revision) == (RolloutAction.HOLD, 1)
    assert "still loading" in held.decision.reason
    service.set_shadows(people.ctx("mo"), "fraud-api", [WeightedUri("models:/fraud/3", 50)])
    stale = service.record_report(mo, "fraud-api", 1, [], LoadStatus(failed={"2": "gone"}))
    assert (stale.decision.action, stale.revision) == (RolloutAction.HOLD, 2)
    assert service.get(mo, "fraud-api").split.canary is not None


# ---------------------------------------------------------------------- the data plane
def _route(version: int, role: RouteRole, weight: int = 100) -> Route:
    return Route("m", version, weight, role)


def test_routable_split_keeps_only_loaded_versions_and_falls_back() -> None:
    split = TrafficSplit(
        (
            _route(1, RouteRole.PRIMARY, 3),
            _route(4, RouteRole.PRIMARY, 1),
            _route(2, RouteRole.CANARY, 25),
            _route(3, RouteRole.SHADOW),
        )
    )
    only_primary = routable_split(split, {1}, None)
    assert only_primary == TrafficSplit((split.routes[0],))
    assert only_primary.canary is None  # its 25% goes to the primary
    everything = routable_split(split, {1, 2, 3, 4}, None)
    assert everything == split
    before = TrafficSplit((_route(9, RouteRole.PRIMARY),))
    assert routable_split(split, {2, 3}, before) is before  # no primary loaded: keep serving
    assert routable_split(split, set(), None) is None


class _Host:
    """A version host that records what it was given (the loader's contract partner)."""

    def __init__(self) -> None:
        self.repository = ModelRepository()
        self.retired: list[str] = []

    def install(self, served: ServedModel) -> None:
        self.repository.add(served)

    def retire(self, name: str, version: str, grace_s: float) -> None:
        assert grace_s == 2.0
        served = self.repository.withdraw(name, version)
        assert served is not None
        served.backend.close()
        self.retired.append(version)


class _Backend:
    platform = "test"
    inputs = (TensorSpec("x", "FP32", (-1, 2)),)
    outputs = (TensorSpec("y", "FP32", (-1, 2)),)
    max_batch_size = 8

    def __init__(self) -> None:
        self.closed = False

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"]}

    def close(self) -> None:
        self.closed = True


def _load(source: ModelSource) -> ServedModel:
    if source.location == "refused":
        raise InvalidParameter(f"Model '{source.name}': model.onnx is a pickle")
    if source.location == "broken":
        raise RuntimeError("/secret/path/model.onnx: protobuf parse error")
    meta = ModelMetadata(source.name, (), "test", _Backend.inputs, _Backend.outputs)
    assert source.version is not None
    return ServedModel(source.name, source.version, _Backend(), meta)


def test_loader_loads_fails_unloads_and_retries_on_request() -> None:
    host = _Host()
    loader = VersionLoader("d", host, _load, grace_s=2.0)
    changes = threading.Semaphore(0)
    loader.subscribe(changes.release)
    loader.want({"1": "ok", "2": "refused", "3": "broken"})
    loader.run_pending()
    statuses = loader.statuses()
    assert statuses["1"].state is LoadState.LOADED
    assert statuses["2"].state is LoadState.FAILED
    assert statuses["2"].reason == "Model 'd': model.onnx is a pickle"
    assert statuses["3"].state is LoadState.FAILED
    assert "secret" not in statuses["3"].reason  # a runtime's words never leave the process
    assert host.repository.versions("d") == ["1"]
    assert host.repository.get("d", "1").metadata.versions == ("1",)
    assert sum(changes.acquire(blocking=False) for _ in range(5)) == 3
    # Failed versions stay failed until asked again; unwanted ones are unloaded.
    loader.want({"2": "ok", "4": "ok"})
    loader.run_pending()
    assert host.retired == ["1"]
    assert loader.statuses()["2"].state is LoadState.FAILED
    assert host.repository.versions("d") == ["4"]
    loader.want({"2": "ok", "4": "ok"}, retry_failed=True)
    loader.run_pending()
    assert loader.loaded() == frozenset({"2", "4"})
    assert host.repository.get("d", "4").metadata.versions == ("4", "2")


def test_loader_thread_follows_wishes_until_stopped() -> None:
    host = _Host()
    loader = VersionLoader("d", host, _load, grace_s=2.0)
    loaded = threading.Event()
    loader.subscribe(lambda: loaded.set() if "5" in loader.loaded() else None)
    loader.start()
    try:
        loader.want({"5": "ok"})
        assert loaded.wait(10), "the loader thread never loaded the version"
        assert host.repository.versions("d") == ["5"]
    finally:
        loader.stop()


def _report_body(**extra: Any) -> dict[str, Any]:
    return {"revision": 1, "versions": [], **extra}


def test_report_schema_reads_loading_and_failed_versions() -> None:
    body = _report_body(loading=["3"], failed=[{"version": "2", "reason": " "}])
    loads = ReportIn.model_validate(body).loads()
    assert loads == LoadStatus(frozenset({"3"}), {"2": "no reason given"})
    assert ReportIn.model_validate(_report_body()).loads() == LoadStatus()


@pytest.mark.parametrize(
    "extra",
    [
        {"failed": [{"version": "2", "reason": "x" * 301}]},
        {"failed": [{"version": "2", "reason": "bad\x00reason"}]},
        {"failed": [{"version": "../2", "reason": "r"}]},
        {"failed": [{"version": "2"}]},
        {"loading": ["0"]},
        {"loading": ["1"] * 65},
    ],
)
def test_report_schema_refuses_bad_load_news(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ReportIn.model_validate(_report_body(**extra))


class _ControlPlane:
    """The control plane's deployment API as a transport: a spec to read, reports to keep."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] = {}
        self.reports: list[dict[str, Any]] = []

    def set_routes(self, revision: int, *routes: tuple[int, str, int]) -> None:
        self.spec = {
            "name": "d",
            "team": "red",
            "revision": revision,
            "routes": [
                {"model": "m", "version": v, "role": role, "weight": w, "uri": f"models:/m/{v}"}
                for v, role, w in routes
            ],
            "slo": {"max_error_rate": 0.01, "max_p99_ms": 100.0, "min_requests": 10},
            "rollout": {"steps": [10, 100], "interval_s": 60.0},
            "state": {"phase": "stable", "canary_weight": 0, "step_index": 0, "since": str(T0)},
            "sticky_header": "x-key",
            "sample_rate": 0.0,
        }

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/api/v1/deployments/d":
            return httpx.Response(200, json=self.spec)
        if request.method == "POST" and request.url.path == "/api/v1/deployments/d/reports":
            self.reports.append(json.loads(request.content))
            return httpx.Response(200, json={"revision": self.spec["revision"], "action": "hold"})
        return httpx.Response(404, json={"error_code": "NOT_FOUND", "message": "no"})


def _load_by_uri(source: ModelSource) -> ServedModel:
    refused = source.location.endswith("/2")
    return _load(ModelSource(source.name, source.version, "refused" if refused else "ok"))


def _routed(router: DeploymentRouter) -> set[str]:
    return {router.choose("d", {"x-key": f"k{i}"}).version for i in range(200)}


def test_router_routes_only_to_loaded_versions_and_reports_the_others() -> None:
    plane = _ControlPlane()
    plane.set_routes(1, (1, "primary", 100), (2, "canary", 50))
    client = ShamalClient("http://control", "t", transport=httpx.MockTransport(plane.handle))
    router = DeploymentRouter(client, "d")
    assert router.refresh()
    host = _Host()
    loader = VersionLoader("d", host, _load_by_uri, grace_s=2.0)
    router.attach(loader)
    with pytest.raises(ServiceUnavailable):
        router.choose("d", {})  # nothing loaded yet
    router.push()
    assert (plane.reports[-1]["loading"], plane.reports[-1]["failed"]) == (["1", "2"], [])
    loader.run_pending()  # v1 loads, the canary v2 is refused: its share goes to v1
    assert _routed(router) == {"1"}
    router.push()
    assert plane.reports[-1]["loading"] == []
    assert plane.reports[-1]["failed"] == [
        {"version": "2", "reason": "Model 'd': model.onnx is a pickle"}
    ]
    plane.set_routes(2, (1, "primary", 100), (3, "canary", 50))
    assert router.refresh()
    assert _routed(router) == {"1"}  # v3 is still loading
    loader.run_pending()
    assert _routed(router) == {"1", "3"}
    # A new primary: the old split serves until it is loaded, then the old version goes.
    plane.set_routes(3, (4, "primary", 100))
    assert router.refresh()
    assert _routed(router) == {"1", "3"}
    loader.run_pending()
    assert _routed(router) == {"4"}
    assert sorted(host.retired) == ["1", "3"]
    assert host.repository.versions("d") == ["4"]
    client.close()
