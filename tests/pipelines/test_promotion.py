"""PromotionService on SQLite and PostgreSQL, with real runs, versions and datasets made
through each domain's service: a first promotion without a champion, a refused one that
moves nothing, a tolerance that lets a slightly worse candidate through, dry runs, the data
validation of what the run read, an optimization's fidelity, roles, and the audit trail."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shamal.errors import InvalidParameter, NotFound, PermissionDenied
from shamal.server import create_app
from tests.pipelines.conftest import SUITE, TOLERANT, World
from tests.pipelines.conftest import csv_bytes as _csv
from tests.test_server import route_inventory_problems


def test_first_promotion_then_a_refusal_then_a_tolerated_candidate(world: World) -> None:
    v1 = world.candidate(0.90)
    first = world.promote(TOLERANT)
    assert first.passed
    assert first.promoted
    assert first.champion_version is None
    assert first.results[0].no_champion
    assert world.champion() == v1

    v2 = world.candidate(0.85)
    refused = world.promote(TOLERANT)
    assert not refused.passed
    assert not refused.promoted
    assert (refused.candidate_version, refused.champion_version) == (v2, v1)
    assert refused.results[0].explanation == (
        "metrics.f1 = 0.85 >= champion.metrics.f1 - 0.01 = 0.89: failed"
    )
    assert world.champion() == v1  # nothing moved

    v3 = world.candidate(0.895)  # a little worse than the champion, within the tolerance
    third = world.promote(TOLERANT, "params.lr == '0.01'", "tags.team == 'churn'")
    assert third.passed
    assert third.promoted
    assert world.champion() == v3
    assert third.results[0].values == {"metrics.f1": 0.895, "champion.metrics.f1": 0.9}


def test_every_gate_is_audited_with_its_rules_and_outcome(world: World) -> None:
    audit = world.platform.audit
    v1 = world.candidate(0.9)
    world.promote(TOLERANT)
    world.candidate(0.5)
    world.promote(TOLERANT, "version > champion.version")
    world.promote(TOLERANT, dry_run=True)
    gates = audit.entries(action="models.promote")
    assert [(e.outcome, e.detail["dry_run"]) for e in gates] == [
        ("refused", True),
        ("refused", False),
        ("ok", False),
    ]
    refused = gates[1]
    assert refused.target == "registered_model:churn"
    assert refused.actor == "mo"
    assert refused.detail["rules"] == [TOLERANT, "version > champion.version"]
    assert refused.detail["failed"] == [TOLERANT]
    assert refused.detail["champion_version"] == v1
    assert gates[2].detail["promoted"] is True
    # The alias move itself went through the registry, which audits it on its own.
    moves = audit.entries(action="registered_model.alias.set")
    assert any(e.detail.get("alias") == "champion" for e in moves)
    assert audit.verify().ok


def test_a_dry_run_reports_and_moves_nothing(world: World) -> None:
    world.candidate(0.9)
    report = world.promote(TOLERANT, who="vi", dry_run=True)  # a viewer may ask
    assert report.passed
    assert report.dry_run
    assert not report.promoted
    assert world.champion() is None


def test_a_missing_metric_fails_the_gate(world: World) -> None:
    world.candidate(0.9)
    report = world.promote(TOLERANT, "metrics.precision >= 0.8")
    assert [r.passed for r in report.results] == [True, False]
    assert "metrics.precision is missing" in report.results[1].explanation
    assert world.champion() is None


def test_data_validation_of_what_the_run_read(world: World) -> None:
    datasets = world.platform.datasets
    datasets.create(world.ctx("mo"), "plain", "red")
    plain = datasets.ingest(world.ctx("mo"), "plain", _csv([1.0]), "csv")
    datasets.create(world.ctx("mo"), "checked", "red")
    datasets.set_suite(world.ctx("rita"), "checked", SUITE)
    good = datasets.ingest(world.ctx("mo"), "checked", _csv([1.0, 1.5]), "csv")
    bad = datasets.ingest(world.ctx("mo"), "checked", _csv([1.0, 2.5]), "csv")
    rule = "data.validation == 'passed'"
    expected = {
        f"plain/{plain.version}": ("none", 0),
        f"checked/{good.version}": ("passed", 0),
        f"checked/{bad.version}": ("failed", 1),
    }
    for data, (verdict, failed) in expected.items():
        world.candidate(0.9, data=data)
        report = world.promote(
            rule, f"data.failed_expectations == {failed}", "data.inputs == 1", dry_run=True
        )
        assert report.results[0].values["data.validation"] == verdict, data
        assert report.results[0].passed is (verdict == "passed")
        assert report.results[1].passed, report.results[1].explanation
        assert report.results[2].passed
    world.candidate(0.9)  # a run that read no Shamal dataset
    report = world.promote(rule, "data.inputs == 0", dry_run=True)
    assert report.results[0].values["data.validation"] == "none"
    assert report.results[1].passed


def test_another_teams_dataset_is_left_out(world: World) -> None:
    datasets = world.platform.datasets
    datasets.create(world.people.ctx("bo"), "blue_data", "blue")
    hidden = datasets.ingest(world.people.ctx("bo"), "blue_data", _csv([1.0]), "csv")
    world.candidate(0.9, data=f"blue_data/{hidden.version}")
    report = world.promote("data.inputs == 0", "data.validation == 'none'", dry_run=True)
    assert report.passed


def test_fidelity_of_an_optimized_version(world: World) -> None:
    fidelity = {
        "shamal.fidelity.metric": "accuracy",
        "shamal.fidelity.original": "0.910000",
        "shamal.fidelity.variant": "0.905000",
        "shamal.fidelity.max_abs_diff": "0.0004",
        "shamal.fidelity.cosine_min": "0.999900",
        "shamal.fidelity.rows": "256",
    }
    world.candidate(0.9, tags=fidelity)
    report = world.promote(
        "fidelity.max_abs_diff < 1e-3",
        "fidelity.drop <= 0.01",
        "fidelity.cosine >= 0.999",
        "fidelity.metric == 'accuracy'",
        "version_tags.`shamal.fidelity.rows` == '256'",
        dry_run=True,
    )
    assert report.passed, [r.explanation for r in report.results]
    world.candidate(0.9)
    plain = world.promote("fidelity.max_abs_diff < 1e-3", dry_run=True)
    assert "fidelity.max_abs_diff is missing" in plain.results[0].explanation


def test_roles_and_teams(world: World) -> None:
    world.candidate(0.9)
    with pytest.raises(PermissionDenied):
        world.promote(TOLERANT, who="vi")
    with pytest.raises(NotFound):
        world.promote(TOLERANT, who="bo")  # another team's model: as if absent
    with pytest.raises(NotFound):
        world.promote(TOLERANT, who="bo", dry_run=True)
    assert world.champion() is None
    assert world.promote(TOLERANT, who="rita").promoted


@pytest.mark.parametrize(
    ("from_alias", "to_alias", "rules", "error"),
    [
        ("candidate", "champion", [], InvalidParameter),
        ("candidate", "champion", ["eval('x') > 1"], InvalidParameter),
        ("candidate", "latest", [TOLERANT], InvalidParameter),
        ("candidate", "V3", [TOLERANT], InvalidParameter),
        ("candidate", "candidate", [TOLERANT], InvalidParameter),
        ("../x", "champion", [TOLERANT], InvalidParameter),
        ("candidate", "a;b", [TOLERANT], InvalidParameter),
        ("candidate", "x" * 300, [TOLERANT], InvalidParameter),
        ("nowhere", "champion", [TOLERANT], NotFound),
    ],
)
def test_bad_requests_change_nothing(
    world: World, from_alias: str, to_alias: str, rules: list[str], error: type[Exception]
) -> None:
    world.candidate(0.9)
    before = world.platform.audit.entries(limit=1)[0].seq
    with pytest.raises(error):
        world.service.promote(
            world.ctx(), "churn", from_alias=from_alias, to_alias=to_alias, rules=rules
        )
    assert world.champion() is None
    assert world.platform.audit.entries(limit=1)[0].seq == before


def test_an_unknown_model_is_not_found(world: World) -> None:
    with pytest.raises(NotFound):
        world.service.promote(
            world.ctx(), "nope", from_alias="candidate", to_alias="champion", rules=[TOLERANT]
        )


def test_a_version_without_a_run_has_only_its_own_figures(world: World) -> None:
    registry = world.platform.registry
    setup = world.ctx(action="setup")
    made = registry.create_model_version(setup, "churn", "mlflow-artifacts:/1/x/model")
    registry.set_registered_model_alias(setup, "churn", "candidate", made.version)
    report = world.promote(f"version == {made.version}", "metrics.f1 > 0", dry_run=True)
    assert [r.passed for r in report.results] == [True, False]


# ---------------------------------------------------------------------- the HTTP API
@pytest.fixture
def http(world: World) -> Iterator[TestClient]:
    app = create_app(world.platform.settings, world.platform)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _post(http: TestClient, world: World, who: str, body: object, name: str = "churn") -> Any:
    return http.post(f"/api/v1/models/{name}/promote", json=body, headers=world.people.headers(who))


def test_the_api_answers_the_report_and_a_refusal_is_200(world: World, http: TestClient) -> None:
    v1 = world.candidate(0.9)
    body = {"from_alias": "candidate", "to_alias": "champion", "rules": [TOLERANT]}
    first = _post(http, world, "mo", body)
    assert first.status_code == 200, first.text
    assert first.json()["promoted"] is True
    assert first.json()["results"][0]["no_champion"] is True
    world.candidate(0.5)
    refused = _post(http, world, "mo", body)
    assert refused.status_code == 200
    answer = refused.json()
    assert (answer["passed"], answer["promoted"], answer["champion_version"]) == (False, False, v1)
    assert answer["results"][0]["values"] == {"metrics.f1": 0.5, "champion.metrics.f1": 0.9}
    assert world.champion() == v1
    world.candidate(0.95, metrics={"loss": float("nan")})
    odd = {**body, "rules": ["metrics.loss < 1"], "dry_run": True}
    dry = _post(http, world, "vi", odd)  # a viewer may dry-run
    assert dry.status_code == 200
    assert dry.json()["dry_run"] is True
    assert dry.json()["results"][0]["values"] == {"metrics.loss": None}  # NaN: JSON has none
    assert dry.json()["passed"] is False
    outcomes = [e.outcome for e in world.platform.audit.entries(action="models.promote")]
    assert outcomes == ["refused", "refused", "ok"]


def test_the_api_refuses_bad_requests_and_audits_them(world: World, http: TestClient) -> None:
    world.candidate(0.9)
    good = {"from_alias": "candidate", "to_alias": "champion", "rules": [TOLERANT]}
    cases: list[tuple[str, str, object, int]] = [
        ("mo", "churn", {**good, "rules": []}, 400),
        ("mo", "churn", {**good, "rules": ["x" * 100_000]}, 400),
        ("mo", "churn", {**good, "rules": ["(" * 3000 + "true" + ")" * 3000]}, 400),
        ("mo", "churn", {**good, "rules": ["().__class__.__bases__ == 1"]}, 400),
        ("mo", "churn", {**good, "rules": ["true"] * 51}, 400),
        ("mo", "churn", {**good, "to_alias": "latest"}, 400),
        ("mo", "churn", {**good, "extra": 1}, 400),
        ("mo", "churn", {**good, "rules": "true"}, 400),
        ("mo", "churn", [good], 400),
        ("mo", "churn", {**good, "from_alias": "nowhere"}, 404),
        ("mo", "nope", good, 404),
        ("bo", "churn", good, 404),  # another team's model
        ("vi", "churn", good, 403),  # a viewer may only dry-run
    ]
    for who, name, body, status in cases:
        answer = _post(http, world, who, body, name)
        assert answer.status_code == status, (body, answer.text)
        assert "Traceback" not in answer.text
        assert set(answer.json()) == {"error_code", "message"}
    assert world.champion() is None
    refused = world.platform.audit.entries(action="models.promote", limit=100)
    assert len(refused) == len(cases)
    assert all(e.outcome != "ok" for e in refused)
    assert http.post("/api/v1/models/churn/promote", json=good).status_code == 401


def test_the_route_needs_a_token_and_is_audited(http: TestClient) -> None:
    app = http.app
    assert isinstance(app, FastAPI)
    assert route_inventory_problems(app) == []
