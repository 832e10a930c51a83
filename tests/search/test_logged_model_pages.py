"""MLflow 3 logged-model searches are bounded as run searches are (issue 18, points 4 and
5): a page stops past ``SHAMAL_MAX_PAGE_BYTES`` of JSON with a token that resumes exactly
at the first model it left out, and a search holds one of the caller's search slots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from shamal.artifacts import PrincipalSlots
from shamal.config import Settings
from shamal.server import create_app
from shamal.server._platform import Platform, start_platform
from tests.live import LiveServer

KIB = 1024
PAGE_BYTES = 64 * KIB
TAG = "t" * 8000  # MLflow's longest tag value
SEARCH = "/api/2.0/mlflow/logged-models/search"
BY_NAME = [{"field_name": "name", "ascending": True}]


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    settings = Settings(
        home=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'shamal.db'}",
        allowed_hosts=("*",),
        max_page_bytes=PAGE_BYTES,
        max_searches_per_principal=2,
    )
    running = start_platform(settings)
    yield running
    running.close()


@pytest.fixture
def api(platform: Platform) -> Iterator[TestClient]:
    assert platform.admin_secret is not None
    with TestClient(create_app(platform.settings, platform)) as client:
        client.headers["Authorization"] = f"Bearer {platform.admin_secret}"
        yield client


def _fat_models(post: Any, count: int) -> tuple[str, list[str]]:
    """An experiment of ``count`` logged models of about 16 KiB of JSON each (four a page),
    named in order; returns its id and their ids."""
    answer = post("/api/2.0/mlflow/experiments/create", json={"name": "fat-logged-models"})
    experiment = str(answer.json()["experiment_id"])
    ids = []
    for i in range(count):
        body = {
            "experiment_id": experiment,
            "name": f"m{i:03d}",
            "tags": [{"key": f"k{j}", "value": TAG} for j in range(2)],
        }
        ids.append(
            post("/api/2.0/mlflow/logged-models", json=body).json()["model"]["info"]["model_id"]
        )
    return experiment, ids


def test_pages_stop_at_their_byte_bound_and_resume_exactly(api: TestClient) -> None:
    experiment, ids = _fat_models(api.post, 30)
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        body = {"experiment_ids": [experiment], "max_results": 1000, "order_by": BY_NAME}
        if token:
            body["page_token"] = token
        answer = api.post(SEARCH, json=body)
        assert answer.status_code == 200, answer.text
        assert len(answer.content) <= PAGE_BYTES + 1 * KIB  # the model past it is left out
        page = answer.json()
        seen += [m["info"]["model_id"] for m in page["models"]]
        pages += 1
        token = page.get("next_page_token")
        if not token:
            break
    assert seen == ids  # every model once, in order
    assert pages >= 7
    # A page size below the byte bound still stops at the size, with the same token kind.
    small = api.post(SEARCH, json={"experiment_ids": [experiment], "max_results": 2}).json()
    assert len(small["models"]) == 2
    assert small["next_page_token"]


def test_a_search_holds_one_of_the_callers_search_slots(
    api: TestClient, platform: Platform
) -> None:
    experiment, _ = _fat_models(api.post, 1)
    slots: PrincipalSlots = api.app.state.search_slots  # type: ignore[attr-defined]
    assert platform.admin_secret is not None
    key = f"user:{platform.security.authenticate(platform.admin_secret).user.id}"
    body = {"experiment_ids": [experiment]}
    with slots.hold(key), slots.hold(key):  # the account's two searches run elsewhere
        refused = api.post(SEARCH, json=body)
        assert refused.status_code == 429
        assert refused.headers["Retry-After"]
        assert "at once per account" in refused.json()["message"]
    assert slots.in_use(key) == 0
    assert len(api.post(SEARCH, json=body).json()["models"]) == 1


def test_the_stock_client_pages_through_logged_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"SHAMAL_MAX_PAGE_BYTES": str(PAGE_BYTES), "SHAMAL_ACCESS_LOG": "false"}
    with LiveServer(tmp_path / "home", env) as live:
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", live.token)
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        client = MlflowClient(tracking_uri=live.url)
        experiment = client.create_experiment("fat-logged-models")
        ids = [
            client.create_logged_model(
                experiment, name=f"m{i:03d}", tags={f"k{j}": TAG for j in range(2)}
            ).model_id
            for i in range(12)
        ]
        got: list[str] = []
        token = None
        pages = 0
        while True:
            page = client.search_logged_models(
                [experiment], max_results=1000, order_by=BY_NAME, page_token=token
            )
            assert len(page) < 12
            got += [m.model_id for m in page]
            pages += 1
            token = page.token
            if not token:
                break
        assert got == ids
        assert pages >= 3
