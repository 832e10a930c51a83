"""New names refuse control and invisible characters, as registered-model names already do:
experiments, runs and jobs (users, teams, tokens, studies and deployments take a strict
pattern already). Names in any script are still welcome."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

M = "/api/2.0/mlflow"
HOSTILE = ["evil\x1b[2J", "line\rover", "bell\x07", "abc\u202egpj.exe", "zero\u200bwidth", "a\nb"]
WELCOME = ["résumé 日本語 модель", "resnet50 lr=0.1 (bs 256)", "a[b]c"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused(api: TestClient, name: str) -> None:
    made = api.post(f"{M}/experiments/create", json={"name": name})
    assert (made.status_code, made.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    assert "control or invisible characters" in made.json()["message"]
    experiment = api.post(f"{M}/experiments/create", json={"name": "fine"}).json()
    renamed = api.post(
        f"{M}/experiments/update",
        json={"experiment_id": experiment["experiment_id"], "new_name": name},
    )
    assert renamed.status_code == 400
    run = api.post(
        f"{M}/runs/create", json={"experiment_id": experiment["experiment_id"], "run_name": name}
    )
    assert run.status_code == 400
    good = api.post(f"{M}/runs/create", json={"experiment_id": experiment["experiment_id"]})
    run_id = good.json()["run"]["info"]["run_id"]
    update = api.post(f"{M}/runs/update", json={"run_id": run_id, "run_name": name})
    assert update.status_code == 400
    job = api.post("/api/v1/jobs", json={"command": ["true"], "name": name})
    assert job.status_code == 400
    assert "control or invisible characters" in job.json()["message"]
    assert api.get("/api/v1/jobs").json() == []


@pytest.mark.parametrize("name", WELCOME)
def test_names_in_any_script_are_welcome(api: TestClient, name: str) -> None:
    made = api.post(f"{M}/experiments/create", json={"name": name})
    assert made.status_code == 200, made.text
    run = api.post(
        f"{M}/runs/create", json={"experiment_id": made.json()["experiment_id"], "run_name": name}
    )
    assert run.json()["run"]["info"]["run_name"] == name
    job = api.post("/api/v1/jobs", json={"command": ["true"], "name": name})
    assert (job.status_code, job.json()["name"]) == (201, name)
