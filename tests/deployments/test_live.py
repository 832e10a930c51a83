"""Deployments through a real server process: the CLI, hostile inputs, and the data-plane router.

One `shamal server` (SQLite) per module. People and models are made over HTTP as a user would:
teams and tokens through the native API, the model and its versions through the MLflow REST
dialect (the protocol the stock mlflow client speaks).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from shamal.cli import deploy as deploy_cmd
from shamal.client import ShamalClient
from shamal.errors import NotFound
from shamal.serving._deployment import DeploymentRouter
from tests.live import LiveServer

pytestmark = pytest.mark.slow


@dataclass
class World:
    server: LiveServer
    tokens: dict[str, str]

    def client(self, who: str) -> ShamalClient:
        return ShamalClient(self.server.url, self.tokens[who])

    def http(self, who: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=30)


def _setup(server: LiveServer) -> dict[str, str]:
    tokens = {"admin": server.token}
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=30
    ) as admin:
        for team in ("red", "blue"):
            admin.post("/api/v1/teams", json={"name": team}).raise_for_status()
        for user, team, role in (
            ("mo", "red", "member"),
            ("vi", "red", "viewer"),
            ("rita", "red", "maintainer"),
            ("bo", "blue", "member"),
        ):
            admin.post("/api/v1/users", json={"name": user}).raise_for_status()
            admin.put(
                f"/api/v1/teams/{team}/members/{user}", json={"role": role}
            ).raise_for_status()
            made = admin.post("/api/v1/tokens", json={"user": user, "name": "t"})
            tokens[user] = made.raise_for_status().json()["secret"]
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {tokens['mo']}"}, timeout=30
    ) as mo:
        mlflow = "/api/2.0/mlflow"
        mo.post(
            f"{mlflow}/registered-models/create",
            json={"name": "fraud", "tags": [{"key": "shamal.team", "value": "red"}]},
        ).raise_for_status()
        for _ in range(3):
            mo.post(
                f"{mlflow}/model-versions/create",
                json={"name": "fraud", "source": "mlflow-artifacts:/0/model"},
            ).raise_for_status()
        mo.post(
            f"{mlflow}/registered-models/alias",
            json={"name": "fraud", "alias": "champion", "version": "1"},
        ).raise_for_status()
    return tokens


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with LiveServer(tmp_path_factory.mktemp("deployments-home")) as server:
        yield World(server, _setup(server))


def _name() -> str:
    return f"d-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------- CLI
@pytest.fixture
def cli(world: World, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("SHAMAL_URL", world.server.url)
    monkeypatch.setenv("SHAMAL_TOKEN", world.tokens["mo"])
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("deploy")(deploy_cmd.deploy)
    app.add_typer(deploy_cmd.deployments, name="deployments")
    return app


def test_cli_deploy_show_promote_samples_delete(
    cli: CliRunner, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, name = _app(), _name()
    made = cli.invoke(
        app,
        [
            "deploy", name, "--model", "models:/fraud@champion", "--canary", "models:/fraud/2",
            "--percent", "10", "--steps", "10,25,50,100", "--interval", "5m",
            "--shadow", "models:/fraud/3=50", "--slo-error-rate", "0.02", "--slo-p99-ms", "50",
            "--slo-min-requests", "200", "--sample-rate", "0.01", "--json",
        ],
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    body = json.loads(made.output)
    assert [(r["role"], r["version"], r["share"]) for r in body["routes"]] == [
        ("primary", 1, 0.9),
        ("canary", 2, 0.1),
        ("shadow", 3, 0.5),
    ]
    assert (body["rollout"]["interval_s"], body["slo"]["max_p99_ms"]) == (300.0, 50.0)
    shown = cli.invoke(app, ["deployments", "show", name])
    assert shown.exit_code == 0, shown.output
    assert "canary at 10%" in shown.output
    assert "models:/fraud@champion" in shown.output
    assert "Recent events" in shown.output
    listed = json.loads(cli.invoke(app, ["deployments", "list", "--json"]).output)
    assert name in [d["name"] for d in listed]
    promoted = cli.invoke(app, ["deployments", "promote", name, "--revision", "1"])
    assert promoted.exit_code == 0, promoted.output
    again = cli.invoke(app, ["deployments", "rollback", name])
    assert again.exit_code == 1
    assert "INVALID_STATE" in again.output
    after = json.loads(cli.invoke(app, ["deployments", "show", name, "--json"]).output)
    assert after["state"]["phase"] == "promoted"
    assert [e["kind"] for e in after["events"]] == ["create", "promote"]
    assert json.loads(cli.invoke(app, ["deployments", "samples", name, "--json"]).output) == []
    labelled = cli.invoke(
        app, ["deployments", "labels", name, "-"], input="request_id,label\nr1,1\nr2,no\n"
    )
    assert labelled.exit_code == 0, labelled.output
    assert "stored 2 labels" in labelled.output
    assert "2 labels name requests no kept sample has (yet)" in labelled.output
    lines = '{"request_id": "r1", "label": 0}\n{"request_id": "r1", "label": 1}\n'
    twice = cli.invoke(app, ["deployments", "labels", name, "-"], input=lines)
    assert (twice.exit_code, "appears twice" in twice.output) == (1, True)
    both = cli.invoke(app, ["deploy", name, "--model", "models:/fraud/1", "--weights", "x=1"])
    assert both.exit_code == 1
    denied = cli.invoke(app, ["deployments", "delete", name])
    assert (denied.exit_code, "PERMISSION_DENIED" in denied.output) == (1, True)
    monkeypatch.setenv("SHAMAL_TOKEN", world.tokens["rita"])
    assert cli.invoke(app, ["deployments", "delete", name]).exit_code == 0
    gone = cli.invoke(app, ["deployments", "show", name])
    assert (gone.exit_code, "RESOURCE_DOES_NOT_EXIST" in gone.output) == (1, True)


# ---------------------------------------------------------------------- hostile inputs
GOOD = {"primary": [{"model": "models:/fraud/1"}]}
HOSTILE_BODIES = [
    {"primary": [{"model": "models:/fraud/1", "weight": 10**12}]},
    {"primary": [{"model": "models:/fraud/1", "weight": -1}]},
    {"primary": [{"model": "models:/fraud/1", "weight": 0}]},
    {"primary": [{"model": "models:/fraud/1"}] * 10_000},
    {"primary": []},
    {**GOOD, "canary": {"model": "models:/fraud/2", "percent": -10}},
    {**GOOD, "canary": {"model": "models:/fraud/2", "percent": 101}},
    {**GOOD, "evil": True},
    {"primary": [{"model": "models:/fraud/1", "evil": 1}]},
    {"primary": [{"model": "file:///etc/passwd"}]},
    {"primary": [{"model": "models:/fraud@x' OR '1'='1"}]},
    {"primary": [{"model": "models:/fraud/1; DROP TABLE deployments; --"}]},
    {"primary": [{"model": "models:/../../etc/1"}]},
    {"primary": [{"model": "runs:/0123/model"}]},
    {**GOOD, "sticky_header": "x\r\nX-Injected: 1"},
    {**GOOD, "rollout": {"steps": [0], "interval_s": 60}},
    {**GOOD, "rollout": {"steps": [10], "interval_s": -1}},
    {**GOOD, "slo": {"max_error_rate": 5}},
    {**GOOD, "slo": {"min_requests": 0}},
    {**GOOD, "team": "../blue"},
    {**GOOD, "sample_rate": 2},
]
HOSTILE_NAMES = ["Bad Name", "x' OR 1=1 --", "a" * 65, "..", "%2e%2e%2fetc", "a;b", "-lead"]


@pytest.fixture
def safe(world: World) -> Iterator[str]:
    name = _name()
    with world.http("mo") as mo:
        spec = {**GOOD, "canary": {"model": "models:/fraud/2", "percent": 10}}
        mo.put(f"/api/v1/deployments/{name}", json=spec).raise_for_status()
    yield name
    with world.http("admin") as admin:
        admin.delete(f"/api/v1/deployments/{name}")


def _report(**change: object) -> dict[str, object]:
    return {"revision": 1, "versions": [{"version": "2", "ok": 1, "errors": 0, **change}]}


def _sample(**change: object) -> dict[str, object]:
    tensor = {"shape": [1], "datatype": "float32", "data": [1.0], **change}
    return {"revision": 1, "version": "2", "inputs": {"x": tensor}, "outputs": {}}


def _assert_refused(response: httpx.Response, *statuses: int) -> None:
    assert response.status_code in statuses, (response.status_code, response.text)
    assert set(response.json()) == {"error_code", "message"}
    assert "Traceback" not in response.text
    assert "sqlalchemy" not in response.text.lower()


def test_hostile_inputs_are_refused_and_change_nothing(world: World, safe: str) -> None:
    with world.http("mo") as mo:
        before = mo.get(f"/api/v1/deployments/{safe}").json()
        names = sorted(d["name"] for d in mo.get("/api/v1/deployments").json())
        for body in HOSTILE_BODIES:
            _assert_refused(mo.put(f"/api/v1/deployments/{safe}", json=body), 400)
            _assert_refused(mo.put("/api/v1/deployments/fresh", json=body), 400)
        for name in HOSTILE_NAMES:
            _assert_refused(mo.put(f"/api/v1/deployments/{name}", json=GOOD), 400, 404)
        nan = b'{"primary": [{"model": "models:/fraud/1"}], "sample_rate": NaN}'
        raw = mo.put(
            f"/api/v1/deployments/{safe}", content=nan, headers={"Content-Type": "application/json"}
        )
        _assert_refused(raw, 400)
        inf = json.dumps({"samples": [_sample(data=["INF"])]}).replace('"INF"', "1e309")
        raw = mo.post(
            f"/api/v1/deployments/{safe}/samples",
            content=inf.encode(),
            headers={"Content-Type": "application/json"},
        )
        _assert_refused(raw, 400)
        base = f"/api/v1/deployments/{safe}"
        for method, path, body in [
            ("PUT", f"{base}/canary", {"model": "models:/fraud/2", "percent": -5}),
            ("PUT", f"{base}/canary", {"model": "models:/fraud/2", "percent": 5, "revision": 0}),
            ("PUT", f"{base}/weights", {"primary": [{"model": "models:/fraud/1", "weight": 1e9}]}),
            ("PUT", f"{base}/shadows", {"shadows": [{"model": "models:/fraud/3"}] * 5}),
            ("POST", f"{base}/promote", {"revision": "1; DROP TABLE deployments"}),
            ("POST", f"{base}/rollback", {"reason": "a\x00b"}),
            ("POST", f"{base}/reports", _report(ok=-1)),
            ("POST", f"{base}/reports", _report(version="../2")),
            ("POST", f"{base}/reports", _report(latency_counts=[1] * 500)),
            ("POST", f"{base}/samples", {"samples": [_sample(shape=[1] * 50)]}),
            ("POST", f"{base}/samples", {"samples": [_sample()] * 101}),
            ("POST", f"{base}/samples", {"samples": [{**_sample(), "request_id": "a b"}]}),
            ("POST", f"{base}/labels", {"labels": []}),
            ("POST", f"{base}/labels", {"labels": [{"request_id": "a b", "label": 1}]}),
            ("POST", f"{base}/labels", {"labels": [{"request_id": "r", "label": {"x": 1}}]}),
            ("POST", f"{base}/labels", {"labels": [{"request_id": "r", "label": None}]}),
            ("POST", f"{base}/labels", {"labels": [{"request_id": "r", "label": 1}] * 2}),
            ("POST", f"{base}/labels", {"labels": [{"request_id": "r" * 129, "label": 1}]}),
        ]:  # fmt: skip
            _assert_refused(mo.request(method, path, json=body), 400)
        _assert_refused(mo.get(f"{base}/events", params={"limit": 10**6}), 400)
        _assert_refused(mo.get(f"{base}/samples", params={"limit": -1}), 400)
        _assert_refused(mo.get(base, params={"evil": "1"}), 400)
        assert mo.get(base).json() == before
        assert mo.get(f"{base}/samples").json() == []
        assert sorted(d["name"] for d in mo.get("/api/v1/deployments").json()) == names
    with world.http(None) as anonymous:
        _assert_refused(anonymous.get(base), 401)
        _assert_refused(anonymous.post(f"{base}/rollback"), 401)
    with world.http("bo") as outsider:
        _assert_refused(outsider.get(base), 404)
        _assert_refused(outsider.post(f"{base}/rollback"), 404)
        _assert_refused(outsider.post(f"{base}/reports", json={"revision": 1, "versions": []}), 404)
        labels = {"labels": [{"request_id": "r1", "label": 1}]}
        _assert_refused(outsider.post(f"{base}/labels", json=labels), 404)
    with world.http("vi") as viewer:
        assert viewer.get(base).status_code == 200
        _assert_refused(viewer.post(f"{base}/promote"), 403)
        _assert_refused(viewer.delete(base), 403)
        _assert_refused(viewer.post(f"{base}/labels", json=labels), 403)
    with world.http("mo") as mo:
        assert mo.get(base).json() == before
    with world.http("admin") as admin:
        entries = admin.get("/api/v1/audit", params={"action": "deployment.deploy"}).json()
        assert "invalid_parameter_value" in {e["outcome"] for e in entries}
        assert admin.get("/api/v1/audit/verify").json()["ok"] is True


# ---------------------------------------------------------------------- the data-plane router
def test_router_routes_reports_and_sees_the_rollback(world: World) -> None:
    name = _name()
    with world.client("admin") as admin, world.client("mo") as mo:
        _route_report_and_roll_back(admin, mo, name)


def _route_report_and_roll_back(admin: ShamalClient, mo: ShamalClient, name: str) -> None:
    spec = {
        "primary": [{"model": "models:/fraud@champion"}],
        "canary": {"model": "models:/fraud/2", "percent": 20},
        "slo": {"max_error_rate": 0.05, "max_p99_ms": 1000, "min_requests": 30},
        "sample_rate": 1.0,
    }
    mo.deploy(name, spec)
    router = DeploymentRouter(mo, name, interval_s=0.05)
    assert router.refresh()
    assert router.versions() == {name: ["1", "2"]}
    assert router.model_uris() == {"1": "models:/fraud/1", "2": "models:/fraud/2"}
    headers = {"x-shamal-route-key": "user-7"}
    assert router.choose(name, headers) == router.choose("fraud", headers)
    with pytest.raises(NotFound, match="not served here"):
        router.choose("other", {})
    chosen = [router.choose(name, {"x-shamal-route-key": f"u{i}"}).version for i in range(400)]
    assert 40 <= chosen.count("2") <= 120  # 20% of 400, give or take
    for version in chosen:
        router.observe(name, version, latency_s=0.004, ok=version != "2", shadow=False)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    x[0, 0] = np.nan
    router.sample(name, "2", {"x": x}, {"y": np.array([b"ok", b"\xff"])}, "req-1")
    answer = router.push()
    assert answer is not None
    assert answer["action"] == "rollback", answer
    assert router.deployment is not None
    assert router.deployment.revision == 2  # refreshed at once: the answer named revision 2
    assert {router.choose(name, {"x-shamal-route-key": f"u{i}"}).version for i in range(200)} == {
        "1"
    }
    assert router.versions() == {name: ["1"]}
    assert mo.post_deployment_labels(name, {"req-1": ["fraud", "ok"], "req-9": "ok"}) == {
        "stored": 2,
        "unmatched": ["req-9"],
    }
    (sample,) = admin.deployment_samples(name)
    assert sample["inputs"]["x"] == {
        "shape": [2, 3],
        "datatype": "float32",
        "rows": 2,
        "data": [None, 1.0, 2.0, 3.0, 4.0, 5.0],
    }
    assert sample["outputs"]["y"]["data"] == ["ok", "\ufffd"]
    assert (sample["request_id"], sample["label"]) == ("req-1", ["fraud", "ok"])
    events = admin.deployment_events(name)
    assert [(e["kind"], e["actor"]) for e in events] == [
        ("create", "mo"),
        ("rollback", "rollout-controller"),
    ]
    assert "error rate" in events[-1]["reason"]


def test_router_thread_follows_changes_and_keeps_the_last_good_spec(world: World) -> None:
    name = _name()
    with world.client("mo") as mo:
        mo.deploy(name, {"primary": [{"model": "models:/fraud/1"}]})
    calls = {"n": 0}
    upstream = httpx.Client(base_url=world.server.url)

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] % 3 == 0:  # every third call finds the control plane unreachable
            raise httpx.ConnectError("control plane down", request=request)
        forwarded = upstream.send(
            upstream.build_request(
                request.method, request.url.path, headers=request.headers, content=request.content
            )
        )
        return httpx.Response(
            forwarded.status_code, headers=forwarded.headers, content=forwarded.content
        )

    client = ShamalClient(
        world.server.url, world.tokens["mo"], transport=httpx.MockTransport(flaky)
    )
    router = DeploymentRouter(client, name, interval_s=0.02)
    router.start()
    try:
        assert router.deployment is not None
        with world.client("mo") as mo:
            mo.set_canary(name, "models:/fraud/3", 30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            current = router.deployment
            if current is not None and current.revision == 2:
                break
            time.sleep(0.01)  # polling with a deadline
        assert router.deployment is not None
        assert router.deployment.revision == 2
        assert router.versions() == {name: ["1", "3"]}
        assert calls["n"] >= 3  # the thread kept going through failed rounds
        assert router.choose(name, {}).version in {"1", "3"}
    finally:
        router.stop()
        client.close()
        upstream.close()
    assert router.spec_age_s() is not None


def test_router_samples_at_the_deployment_rate_and_ships_them(world: World) -> None:
    name = _name()
    with world.client("mo") as mo:
        mo.deploy(name, {"primary": [{"model": "models:/fraud/1"}], "sample_rate": 0.25})
        router = DeploymentRouter(mo, name, rng=random.Random(7))
        assert router.refresh()
        for i in range(600):
            router.sample(name, "1", {"x": np.full((1, 3), i, dtype=np.int64)}, {})
            if i % 150 == 149:  # four rounds, each under the router's buffer
                assert router.push() is not None
        kept = mo.deployment_samples(name, limit=1000)
    assert 110 <= len(kept) <= 190  # 25% of 600, give or take
    values = [s["inputs"]["x"]["data"][0] for s in kept]
    assert values == sorted(values, reverse=True)  # newest first
    assert {s["version"] for s in kept} == {"1"}
