"""Studies and trials through the HTTP API, on SQLite and PostgreSQL: ask, suggest, report,
prune, tell, stale trials, team access and hostile inputs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shamal.server import Platform
from shamal.tune._entities import SAMPLERS
from shamal.tune._service import JobStatus, TuneService
from tests.test_server import api_routes, route_inventory_problems
from tests.tune.conftest import FakeJobs

T = "/api/v1/tune"


def _member(api: TestClient, team: str, user: str, role: str = "member") -> dict[str, str]:
    api.post("/api/v1/teams", json={"name": team})
    api.post("/api/v1/users", json={"name": user})
    api.put(f"/api/v1/teams/{team}/members/{user}", json={"role": role})
    token = api.post("/api/v1/tokens", json={"user": user, "name": "t"}).json()["secret"]
    return {"Authorization": f"Bearer {token}"}


def _ok(response: Any) -> Any:
    assert response.is_success, response.text
    return response.json()


def _study(api: TestClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    return dict(_ok(api.post(f"{T}/studies", json={"name": "s1", **body}, headers=headers)))


def _suggest(api: TestClient, h: dict[str, str], trial: int, name: str, **dist: Any) -> Any:
    body = {"name": name, "distribution": dist}
    return _ok(api.post(f"{T}/trials/{trial}/suggest", json=body, headers=h))["value"]


def test_ask_suggest_report_tell_and_best(tapi: TestClient, platform: Platform) -> None:
    h = _member(tapi, "vision", "ana")
    study = _study(tapi, h, direction="maximize", sampler="random", seed=3)
    assert (study["team"], study["direction"], study["sampler"], study["pruner"]) == (
        "vision",
        "maximize",
        "random",
        "median",
    )
    values = []
    for i in range(3):
        trial = _ok(tapi.post(f"{T}/studies/vision/s1/trials", headers=h))
        assert trial["number"] == i
        assert trial["state"] == "running"
        x = _suggest(tapi, h, trial["id"], "x", type="float", low=-2.0, high=2.0)
        again = _suggest(tapi, h, trial["id"], "x", type="float", low=-2.0, high=2.0)
        depth = _suggest(tapi, h, trial["id"], "depth", type="int", low=1, high=8, log=True)
        kind = _suggest(tapi, h, trial["id"], "kind", type="categorical", choices=["a", "b"])
        assert again == x
        assert -2 <= x <= 2
        assert 1 <= depth <= 8
        assert kind in ("a", "b")
        values.append(-(x**2))
        body = {"state": "complete", "value": -(x**2)}
        told = _ok(tapi.post(f"{T}/trials/{trial['id']}/tell", json=body, headers=h))
        assert told["state"] == "complete"
        assert told["params"]["x"] == x
    again = tapi.post(f"{T}/trials/{trial['id']}/tell", json={"state": "fail"}, headers=h)
    assert again.status_code == 409
    shown = _ok(tapi.get(f"{T}/studies/vision/s1", headers=h))
    assert shown["counts"] == {"complete": 3}
    assert shown["best"]["value"] == max(values)
    assert [s["name"] for s in _ok(tapi.get(f"{T}/studies", headers=h))] == ["s1"]
    actions = [e.action for e in platform.audit.entries(limit=50)]
    assert {"tune.study.create", "tune.trial.ask", "tune.trial.tell"} <= set(actions)


def test_median_pruner_prunes_a_clearly_bad_trial(tapi: TestClient) -> None:
    h = _member(tapi, "vision", "ana")
    _study(tapi, h, pruner="median")
    good = _ok(tapi.post(f"{T}/studies/vision/s1/trials", headers=h))["id"]
    for step in range(3):
        answer = _ok(tapi.post(f"{T}/trials/{good}/report", json={"step": step, "value": 1.0}))
        assert answer == {"prune": False}
    _ok(tapi.post(f"{T}/trials/{good}/tell", json={"state": "complete", "value": 1.0}))
    bad = _ok(tapi.post(f"{T}/studies/vision/s1/trials", headers=h))["id"]
    answer = _ok(tapi.post(f"{T}/trials/{bad}/report", json={"step": 0, "value": 50.0}))
    assert answer == {"prune": True}
    assert _ok(tapi.get(f"{T}/trials/{bad}/should-prune")) == {"prune": True}
    pruned = _ok(tapi.post(f"{T}/trials/{bad}/tell", json={"state": "pruned"}))
    assert (pruned["state"], pruned["intermediate"]) == ("pruned", {"0": 50.0})


def test_stale_trials_are_settled_by_their_jobs_outcome(
    tapi: TestClient, tune: TuneService, fake_jobs: FakeJobs
) -> None:
    h = _member(tapi, "vision", "ana")
    _study(tapi, h)
    ids = [_ok(tapi.post(f"{T}/studies/vision/s1/trials", headers=h))["id"] for _ in range(5)]
    jobs = ["aaaaaa01", "aaaaaa02", "aaaaaa03", "aaaaaa04"]
    fake_jobs.jobs = {job: JobStatus("queued", ended=False, team="vision") for job in jobs}
    for trial, job in zip(ids, jobs, strict=False):
        _ok(tapi.post(f"{T}/trials/{trial}/job", json={"job_id": job}, headers=h))
    _ok(tapi.post(f"{T}/trials/{ids[1]}/report", json={"step": 4, "value": 0.5}, headers=h))
    fake_jobs.jobs = {
        "aaaaaa01": JobStatus("running", ended=False, team="vision"),
        "aaaaaa02": JobStatus("succeeded", ended=True, team="vision"),
        "aaaaaa03": JobStatus("failed", ended=True, team="vision"),
    }  # aaaaaa04 vanished; trial 5 has no job yet
    changed = {t.id: (t.state.value, t.value, t.reason) for t in tune.fail_stale_trials()}
    assert changed == {
        ids[1]: ("complete", 0.5, "job succeeded"),
        ids[2]: ("fail", None, "job failed"),
        ids[3]: ("fail", None, "job vanished"),
    }
    assert tune.fail_stale_trials() == []
    states = [t["state"] for t in _ok(tapi.get(f"{T}/studies/vision/s1/trials", headers=h))]
    assert states == ["running", "complete", "fail", "fail", "running"]
    fake_jobs.jobs["bbbbbb01"] = JobStatus("queued", ended=False, team="vision")
    clash = tapi.post(f"{T}/trials/{ids[0]}/job", json={"job_id": "bbbbbb01"}, headers=h)
    assert clash.status_code == 409


def test_a_restarted_service_settles_stale_trials_at_its_first_pass(
    tapi: TestClient, platform: Platform, fake_jobs: FakeJobs
) -> None:
    """The service opens Optuna's storage on first use, not when the server starts; a new
    one (a restarted server) that has served nothing yet still finds and settles the trials
    whose jobs ended while it was down, at its first housekeeping pass."""
    h = _member(tapi, "vision", "ana")
    _study(tapi, h)
    trial = _ok(tapi.post(f"{T}/studies/vision/s1/trials", headers=h))["id"]
    fake_jobs.jobs = {"eeeeee01": JobStatus("queued", ended=False, team="vision")}
    _ok(tapi.post(f"{T}/trials/{trial}/job", json={"job_id": "eeeeee01"}, headers=h))
    fake_jobs.jobs = {"eeeeee01": JobStatus("failed", ended=True, team="vision")}
    url = platform.settings.resolved_database_url
    restarted = TuneService(platform.db, platform.audit, url, jobs=fake_jobs)
    try:
        changed = [(t.id, t.state.value, t.reason) for t in restarted.fail_stale_trials()]
    finally:
        restarted.close()
    assert changed == [(trial, "fail", "job failed")]


def test_a_trial_takes_only_a_job_of_its_studys_team(
    tapi: TestClient, tune: TuneService, fake_jobs: FakeJobs
) -> None:
    """Another team's job (or one that does not exist) is refused as 404: its state would
    otherwise settle this team's trial, and the trial would report on that job."""
    h = _member(tapi, "vision", "ana")
    _study(tapi, h)
    trial = _ok(tapi.post(f"{T}/studies/vision/s1/trials", headers=h))["id"]
    fake_jobs.jobs = {
        "cccccc01": JobStatus("failed", ended=True, team="speech"),
        "cccccc02": JobStatus("running", ended=False, team="vision"),
    }
    for job in ("cccccc01", "dddddd01"):
        refused = tapi.post(f"{T}/trials/{trial}/job", json={"job_id": job}, headers=h)
        assert refused.status_code == 404, refused.text
        assert refused.json()["message"] == f"job '{job}' does not exist in the study's team"
    assert tune.fail_stale_trials() == []  # nothing was attached: the trial still runs
    assert _ok(tapi.get(f"{T}/trials/{trial}", headers=h))["job_id"] is None
    attached = _ok(tapi.post(f"{T}/trials/{trial}/job", json={"job_id": "cccccc02"}, headers=h))
    assert attached["job_id"] == "cccccc02"


def test_another_teams_study_and_trials_answer_404(tapi: TestClient) -> None:
    ana = _member(tapi, "vision", "ana")
    bob = _member(tapi, "speech", "bob")
    viewer = _member(tapi, "vision", "vic", role="viewer")
    _study(tapi, ana)
    trial = _ok(tapi.post(f"{T}/studies/vision/s1/trials", headers=ana))["id"]
    for method, path in [
        ("GET", f"{T}/studies/vision/s1"),
        ("GET", f"{T}/studies/vision/s1/trials"),
        ("POST", f"{T}/studies/vision/s1/trials"),
        ("GET", f"{T}/trials/{trial}"),
    ]:
        assert tapi.request(method, path, headers=bob).status_code == 404, path
    body = {"name": "x", "distribution": {"type": "float", "low": 0, "high": 1}}
    assert tapi.post(f"{T}/trials/{trial}/suggest", json=body, headers=bob).status_code == 404
    assert _ok(tapi.get(f"{T}/studies", headers=bob)) == []
    other = tapi.post(f"{T}/studies", json={"name": "s2", "team": "vision"}, headers=bob)
    assert other.status_code == 404
    assert tapi.get(f"{T}/trials/{trial}", headers=viewer).status_code == 200
    assert tapi.post(f"{T}/trials/{trial}/suggest", json=body, headers=viewer).status_code == 403


HOSTILE_DISTRIBUTIONS: list[dict[str, Any]] = [
    {"type": "float", "low": 1.0, "high": 0.0},
    {"type": "float", "low": 0.0, "high": float("inf")},
    {"type": "float", "low": float("nan"), "high": 1.0},
    {"type": "float", "low": 0.0, "high": 1.0, "log": True},
    {"type": "float", "low": 0.1, "high": 1.0, "step": -1},
    {"type": "int", "low": 0, "high": 1.5},
    {"type": "categorical", "choices": []},
    {"type": "categorical", "choices": [{"a": 1}]},
    {"type": "uniform", "low": 0, "high": 1},
    {"type": "float", "low": "0", "high": 1},
    {"type": "float", "low": 0, "high": 1, "extra": 1},
]


def test_hostile_distributions_are_400(tapi: TestClient) -> None:
    _study(tapi, {}, team="-")
    trial = _ok(tapi.post(f"{T}/studies/-/s1/trials"))["id"]
    for dist in HOSTILE_DISTRIBUTIONS:
        body = json.dumps({"name": "x", "distribution": dist}, allow_nan=True)
        response = tapi.post(
            f"{T}/trials/{trial}/suggest",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 400, (dist, response.text)
    assert _ok(tapi.get(f"{T}/trials/{trial}"))["params"] == {}


HOSTILE_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/studies", {"name": "../etc"}),
    ("/studies", {"name": "a b"}),
    ("/studies", {"name": ""}),
    ("/studies", {"name": "x" * 101}),
    ("/studies", {"name": "ok", "sampler": "magic"}),
    ("/studies", {"name": "ok", "pruner": "sometimes"}),
    ("/studies", {"name": "ok", "direction": "sideways"}),
    ("/trials/{t}/report", {"step": 0, "value": "NaN"}),
    ("/trials/{t}/report", {"step": -1, "value": 1.0}),
    ("/trials/{t}/tell", {"state": "complete"}),
    ("/trials/{t}/tell", {"state": "complete", "value": "Infinity"}),
    ("/trials/{t}/tell", {"state": "fail", "value": 1.0}),
    ("/trials/{t}/suggest", {"name": "bad name!", "distribution": {"type": "int"}}),
]


def test_hostile_requests_are_400(tapi: TestClient) -> None:
    _study(tapi, {}, team="-")
    trial = _ok(tapi.post(f"{T}/studies/-/s1/trials"))["id"]
    for path, body in HOSTILE_REQUESTS:
        response = tapi.post(T + path.format(t=trial), json=body)
        assert response.status_code == 400, (path, body, response.text)
    assert _ok(tapi.get(f"{T}/trials/{trial}"))["state"] == "running"
    assert [s["name"] for s in _ok(tapi.get(f"{T}/studies"))] == ["s1"]


def test_another_distribution_for_a_parameter_is_400(tapi: TestClient) -> None:
    _study(tapi, {}, team="-")
    trial = _ok(tapi.post(f"{T}/studies/-/s1/trials"))["id"]
    assert _suggest(tapi, {}, trial, "n", type="int", low=1, high=4) in range(1, 5)
    body = {"name": "n", "distribution": {"type": "float", "low": 0.0, "high": 0.5}}
    assert tapi.post(f"{T}/trials/{trial}/suggest", json=body).status_code == 400


def test_loading_with_the_other_direction_conflicts(tapi: TestClient) -> None:
    first = _study(tapi, {}, team="-", direction="maximize")
    again = _study(tapi, {}, team="-", direction="maximize")
    assert first["name"] == again["name"] == "s1"
    other = tapi.post(f"{T}/studies", json={"name": "s1", "team": "-", "direction": "minimize"})
    assert other.status_code == 409


def test_every_tune_route_needs_a_token_and_changes_are_audited(tapi: TestClient) -> None:
    app = tapi.app
    assert isinstance(app, FastAPI)
    tune_routes = [r for r in api_routes(app) if r.path.startswith(T)]
    assert len(tune_routes) == 12
    assert route_inventory_problems(app) == []
    assert tapi.get(f"{T}/studies", headers={"Authorization": ""}).status_code == 401


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_runs_a_trial(tapi: TestClient, sampler: str) -> None:
    """Optuna calls some samplers experimental: choosing one by name must still work (with
    warnings as errors, as in this suite) from study creation to a told trial."""
    h = _member(tapi, "vision", "ana")
    study = _study(tapi, h, name=f"s-{sampler}", sampler=sampler, seed=1)
    assert study["sampler"] == sampler
    for _ in range(2):
        trial = _ok(tapi.post(f"{T}/studies/vision/s-{sampler}/trials", headers=h))
        x = _suggest(tapi, h, trial["id"], "x", type="float", low=0.0, high=1.0)
        assert 0.0 <= x <= 1.0
        body = {"state": "complete", "value": x}
        assert _ok(tapi.post(f"{T}/trials/{trial['id']}/tell", json=body, headers=h))["state"] == (
            "complete"
        )
