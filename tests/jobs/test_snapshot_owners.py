"""Code snapshots belong to the teams that uploaded them: the blob is stored once, but a
digest learned from another team answers 404, to reads and to submissions alike."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from shamal.db import open_database
from shamal.db import upgrade as migrate
from shamal.jobs import snapshot
from tests.jobs.test_api import JOB, _team_member


def _snapshot(tmp_path: Path) -> tuple[str, bytes]:
    (tmp_path / "train.py").write_text("print('red team code')\n")
    built = snapshot.build(tmp_path)
    data = built.path.read_bytes()
    built.path.unlink()
    return built.digest, data


def test_a_digest_from_another_team_answers_404(api: TestClient, tmp_path: Path) -> None:
    red = _team_member(api, "red", "rita")
    blue = _team_member(api, "blue", "bo")
    digest, data = _snapshot(tmp_path)
    url = f"/api/v1/snapshots/{digest}"
    assert api.put(url, content=data, headers=red).status_code == 201
    assert api.get(url, headers=red).json()["size"] == len(data)

    # Blue learned the digest (a log, a job listing): it neither sees nor runs the code.
    assert api.get(url, headers=blue).status_code == 404
    stolen = api.post("/api/v1/jobs", json={**JOB, "snapshot": digest}, headers=blue)
    assert (stolen.status_code, stolen.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    unknown = api.post("/api/v1/jobs", json={**JOB, "snapshot": "0" * 64}, headers=blue)
    assert unknown.status_code == 404
    assert unknown.json()["message"] == stolen.json()["message"].replace(digest[:12], "0" * 12)
    assert api.get("/api/v1/jobs", headers=blue).json() == []

    mine = api.post("/api/v1/jobs", json={**JOB, "snapshot": digest}, headers=red)
    assert (mine.status_code, mine.json()["snapshot"]) == (201, digest)

    # The same bytes uploaded by blue make blue an owner too (the blob is stored once).
    assert api.put(url, content=data, headers=blue).status_code == 201
    again = api.post("/api/v1/jobs", json={**JOB, "snapshot": digest}, headers=blue)
    assert again.status_code == 201
    # A platform admin sees every snapshot.
    assert api.get(url).status_code == 200


def test_an_account_in_several_teams_names_the_team(api: TestClient, tmp_path: Path) -> None:
    both = _team_member(api, "red", "pat")
    api.post("/api/v1/teams", json={"name": "blue"})
    assert api.put("/api/v1/teams/blue/members/pat", json={"role": "member"}).status_code < 300
    digest, data = _snapshot(tmp_path)
    url = f"/api/v1/snapshots/{digest}"

    unnamed = api.put(url, content=data, headers=both)
    assert unnamed.status_code == 400
    assert "(yours: blue, red)" in unnamed.json()["message"]
    landed = api.post("/api/v1/jobs", json=JOB, headers=both)
    assert landed.status_code == 400  # refused with the list, never put in one of them
    assert "with --team (yours: blue, red)" in landed.json()["message"]
    assert api.get("/api/v1/jobs").json() == []

    assert api.put(url, params={"team": "red"}, content=data, headers=both).status_code == 201
    assert api.get(url, params={"team": "red"}, headers=both).status_code == 200
    assert api.get(url, params={"team": "blue"}, headers=both).status_code == 404
    refused = api.post(
        "/api/v1/jobs", json={**JOB, "team": "blue", "snapshot": digest}, headers=both
    )
    assert refused.status_code == 404
    ran = api.post("/api/v1/jobs", json={**JOB, "team": "red", "snapshot": digest}, headers=both)
    assert (ran.status_code, ran.json()["team"]) == (201, "red")


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_migration_0011_makes_each_team_owner_of_the_snapshots_its_jobs_ran(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path}/old.db"
        if backend == "sqlite"
        else request.getfixturevalue("empty_pg_url")
    )
    database = open_database(url)
    migrate(database, "0010")
    now = datetime(2026, 11, 30, tzinfo=UTC)
    with database.engine.begin() as c:
        for team in ("red", "blue"):
            c.execute(
                text(
                    "INSERT INTO teams (id, name, description, created_at) VALUES (:i, :n, '', :t)"
                ),
                {"i": f"id-{team}", "n": team, "t": now},
            )
        for team_id, digest in [("id-red", "a" * 64), ("id-red", "a" * 64), (None, "b" * 64)]:
            c.execute(
                text(
                    "INSERT INTO jobs (id, name, team_id, team_name, user_id, command, env, "
                    "snapshot, cpu_milli, memory_mib, gpus, gpu_milli, gpu_models, workers, "
                    "priority, priority_value, max_retries, retries_used, attempt, state, "
                    "reason, submitted_at, updated_at, attained_s, preemptions, fingerprint) "
                    "VALUES (:id, 'j', :team, 'red', 'rita', '[]', '{}', :digest, 1000, 256, 0, "
                    "0, '[]', 1, 'normal', 0, 0, 0, 0, 'succeeded', '', :t, :t, 0, 0, 'f')"
                ),
                {"id": uuid.uuid4().hex, "team": team_id, "digest": digest, "t": now},
            )
    assert migrate(database)[0] == "0010"
    with database.engine.connect() as c:
        owners = c.execute(text("SELECT digest, team_id FROM snapshot_owners")).fetchall()
    database.dispose()
    assert [tuple(row) for row in owners] == [("a" * 64, "id-red")]
