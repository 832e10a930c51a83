"""Experiments owned by a team (tag `shamal.team`) follow the team's roles, on both backends."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient


def _account(api: TestClient, name: str, role: str | None) -> dict[str, str]:
    api.post("/api/v1/users", json={"name": name})
    if role:
        assert (
            api.put(f"/api/v1/teams/vision/members/{name}", json={"role": role}).status_code == 200
        )
    secret = api.post("/api/v1/tokens", json={"name": "t", "user": name}).json()["secret"]
    return {"Authorization": f"Bearer {secret}"}


def _call(api: TestClient, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    return api.post(f"/api/2.0/mlflow/{path}", json=body, headers=headers)


@pytest.fixture
def team_experiment(api: TestClient) -> tuple[str, dict[str, dict[str, str]]]:
    api.post("/api/v1/teams", json={"name": "vision"})
    people = {
        "mia": _account(api, "mia", "member"),
        "vic": _account(api, "vic", "viewer"),
        "out": _account(api, "out", None),
    }
    created = _call(
        api,
        "experiments/create",
        {"name": "cv", "tags": [{"key": "shamal.team", "value": "vision"}]},
        people["mia"],
    )
    assert created.status_code == 200, created.text
    return created.json()["experiment_id"], people


def test_team_roles_apply_to_experiments_and_runs(
    api: TestClient, team_experiment: tuple[str, dict[str, dict[str, str]]]
) -> None:
    exp_id, people = team_experiment
    get = "/api/2.0/mlflow/experiments/get"
    assert api.get(get, params={"experiment_id": exp_id}, headers=people["vic"]).status_code == 200
    outsider = api.get(get, params={"experiment_id": exp_id}, headers=people["out"])
    assert (outsider.status_code, outsider.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    search = _call(api, "experiments/search", {"max_results": 100}, people["out"]).json()
    assert exp_id not in [e["experiment_id"] for e in search.get("experiments", [])]
    denied = _call(api, "runs/create", {"experiment_id": exp_id}, people["vic"])
    assert denied.status_code == 403
    run = _call(api, "runs/create", {"experiment_id": exp_id}, people["mia"]).json()["run"]
    run_id = run["info"]["run_id"]
    logged = _call(
        api,
        "runs/log-batch",
        {"run_id": run_id, "metrics": [{"key": "acc", "value": 0.9, "timestamp": 1, "step": 0}]},
        people["out"],
    )
    assert logged.status_code == 404
    assert _call(api, "runs/delete", {"run_id": run_id}, people["mia"]).status_code == 403
    # Someone outside the team cannot claim it for a new experiment either.
    claim = _call(
        api,
        "experiments/create",
        {"name": "mine", "tags": [{"key": "shamal.team", "value": "vision"}]},
        people["out"],
    )
    assert claim.status_code == 404


def test_a_team_that_owns_experiments_cannot_be_deleted(
    api: TestClient, team_experiment: tuple[str, dict[str, dict[str, str]]]
) -> None:
    exp_id, people = team_experiment
    r = api.delete("/api/v1/teams/vision")
    assert (r.status_code, r.json()["error_code"]) == (409, "INVALID_STATE")
    # Nothing changed: the experiment is still the team's, still hidden from outsiders.
    still = api.get(
        "/api/2.0/mlflow/experiments/get", params={"experiment_id": exp_id}, headers=people["out"]
    )
    assert still.status_code == 404
    assert "vision" in [t["name"] for t in api.get("/api/v1/teams").json()]


def test_searching_a_hidden_experiment_looks_like_searching_a_missing_one(
    api: TestClient, team_experiment: tuple[str, dict[str, dict[str, str]]]
) -> None:
    """Runs and logged models of experiments that do not exist are an empty answer, as on
    a stock server; an experiment the caller cannot see answers exactly the same."""
    exp_id, people = team_experiment
    run = _call(api, "runs/create", {"experiment_id": exp_id}, people["mia"]).json()["run"]
    model = _call(api, "logged-models", {"experiment_id": exp_id}, people["mia"])
    assert model.status_code == 200, model.text
    for path, field in (("runs/search", "runs"), ("logged-models/search", "models")):
        seen = _call(api, path, {"experiment_ids": [exp_id]}, people["vic"]).json()
        assert len(seen[field]) == 1
        hidden = _call(api, path, {"experiment_ids": [exp_id]}, people["out"])
        missing = _call(api, path, {"experiment_ids": ["987654"]}, people["out"])
        assert hidden.status_code == 200
        assert hidden.json().get(field, []) == []
        assert (missing.status_code, missing.json()) == (hidden.status_code, hidden.json())
    assert run["info"]["experiment_id"] == exp_id
