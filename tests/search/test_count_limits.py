"""Count limits per object (issue 18, point 5): registered models and versions hold at most
1,000 tags like runs, and writers racing at a limit never pass it (the object's row is taken
before counting), on PostgreSQL where writers truly run at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from shamal.config import Settings
from shamal.db.models import ModelVersionTagRow, RegisteredModelRow, RegisteredModelTagRow
from shamal.server import create_app
from shamal.server._platform import Platform, start_platform

LIMIT = 1000
WRITERS = 8


def _platform(home: object, url: str) -> Iterator[Platform]:
    running = start_platform(Settings(home=home, database_url=url, allowed_hosts=("*",)))
    yield running
    running.close()


@pytest.fixture
def sqlite_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    home = tmp_path_factory.mktemp("home")
    yield from _platform(home, f"sqlite:///{home / 'shamal.db'}")


@pytest.fixture
def pg_platform(tmp_path_factory: pytest.TempPathFactory, fresh_pg_url: str) -> Iterator[Platform]:
    yield from _platform(tmp_path_factory.mktemp("home"), fresh_pg_url)


def _tags(count: int, prefix: str = "k") -> list[dict[str, str]]:
    return [{"key": f"{prefix}{i}", "value": "v"} for i in range(count)]


def _fill_model_tags(platform: Platform, name: str, count: int, version: int | None = None) -> None:
    """Give a model (or one of its versions) ``count`` more tags at once: the API takes 100 a
    request, and this is set-up, not what is tested."""
    with platform.db.unit_of_work() as s:
        model_id = s.scalars(
            select(RegisteredModelRow.id).where(RegisteredModelRow.name == name)
        ).one()
        for i in range(count):
            if version is None:
                s.add(RegisteredModelTagRow(model_id=model_id, key=f"fill{i}", value="v"))
            else:
                s.add(
                    ModelVersionTagRow(
                        model_id=model_id, version=version, key=f"fill{i}", value="v"
                    )
                )


def test_registered_models_and_versions_hold_at_most_1000_tags(sqlite_platform: Platform) -> None:
    api = TestClient(create_app(sqlite_platform.settings, sqlite_platform))
    api.headers["Authorization"] = f"Bearer {sqlite_platform.admin_secret}"
    base = "/api/2.0/mlflow"
    created = api.post(f"{base}/registered-models/create", json={"name": "m", "tags": _tags(100)})
    assert created.status_code == 200, created.text
    _fill_model_tags(sqlite_platform, "m", LIMIT - 100)
    one_more = api.post(
        f"{base}/registered-models/set-tag", json={"name": "m", "key": "new", "value": "v"}
    )
    assert (one_more.status_code, one_more.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    again = api.post(
        f"{base}/registered-models/set-tag", json={"name": "m", "key": "k1", "value": "w"}
    )
    assert again.status_code == 200  # overwriting a tag adds none
    model = api.get(f"{base}/registered-models/get", params={"name": "m"}).json()
    assert len(model["registered_model"]["tags"]) == LIMIT  # the refused write rolled back

    exp = api.post(f"{base}/experiments/create", json={"name": "e"}).json()["experiment_id"]
    run = api.post(f"{base}/runs/create", json={"experiment_id": exp}).json()["run"]["info"]
    source = f"{run['artifact_uri']}/model"
    body = {"name": "m", "source": source, "run_id": run["run_id"], "tags": _tags(100)}
    version = api.post(f"{base}/model-versions/create", json=body)
    assert version.status_code == 200, version.text
    number = version.json()["model_version"]["version"]
    _fill_model_tags(sqlite_platform, "m", LIMIT - 100, version=int(number))
    tag = {"name": "m", "version": number, "key": "new", "value": "v"}
    past = api.post(f"{base}/model-versions/set-tag", json=tag)
    assert (past.status_code, past.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")
    got = api.get(f"{base}/model-versions/get", params={"name": "m", "version": number}).json()
    assert len(got["model_version"]["tags"]) == LIMIT


def _race(app: object, token: str, path: str, bodies: list[dict[str, object]]) -> list[int]:
    """Send ``bodies`` to ``path`` at once, a thread each; their statuses."""
    barrier = threading.Barrier(len(bodies))
    statuses: list[int] = [0] * len(bodies)

    def write(index: int) -> None:
        client = TestClient(app)  # type: ignore[arg-type]
        client.headers["Authorization"] = f"Bearer {token}"
        barrier.wait()
        statuses[index] = client.post(path, json=bodies[index]).status_code

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


@pytest.mark.postgres
def test_writers_racing_at_a_tag_limit_never_pass_it(pg_platform: Platform) -> None:
    app = create_app(pg_platform.settings, pg_platform)
    token = pg_platform.admin_secret
    assert token is not None
    base = "/api/2.0/mlflow"
    with TestClient(app) as api:
        api.headers["Authorization"] = f"Bearer {token}"
        for round_ in range(3):
            exp = api.post(f"{base}/experiments/create", json={"name": f"e{round_}"}).json()
            run = api.post(f"{base}/runs/create", json={"experiment_id": exp["experiment_id"]})
            run_id = run.json()["run"]["info"]["run_id"]
            have = len(
                api.get(f"{base}/runs/get", params={"run_id": run_id}).json()["run"]["data"]["tags"]
            )
            for start in range(0, LIMIT - 1 - have, 100):
                tags = _tags(min(100, LIMIT - 1 - have - start), f"k{start}-")
                api.post(
                    f"{base}/runs/log-batch", json={"run_id": run_id, "tags": tags}
                ).raise_for_status()
            bodies: list[dict[str, object]] = [
                {"run_id": run_id, "key": f"race{i}", "value": "v"} for i in range(WRITERS)
            ]
            statuses = _race(app, token, f"{base}/runs/set-tag", bodies)
            assert sorted(statuses) == [200] + [400] * (WRITERS - 1)
            tags = api.get(f"{base}/runs/get", params={"run_id": run_id}).json()["run"]["data"]
            assert len(tags["tags"]) == LIMIT

            name = f"m{round_}"
            api.post(f"{base}/registered-models/create", json={"name": name}).raise_for_status()
            _fill_model_tags(pg_platform, name, LIMIT - 1)
            bodies = [{"name": name, "key": f"race{i}", "value": "v"} for i in range(WRITERS)]
            statuses = _race(app, token, f"{base}/registered-models/set-tag", bodies)
            assert sorted(statuses) == [200] + [400] * (WRITERS - 1)
            model = api.get(f"{base}/registered-models/get", params={"name": name}).json()
            assert len(model["registered_model"]["tags"]) == LIMIT
