"""Bounded answers of the native API (issue 18, point 5): every list under ``/api/v1``
stops a page past ``SHAMAL_MAX_PAGE_BYTES`` of JSON and names the next page, which resumes
exactly after the last item it held; the SDK client follows those pages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from shamal.client import ShamalClient
from shamal.config import Settings
from shamal.server import create_app
from shamal.server._platform import Platform, start_platform

KIB = 1024
PAGE_BYTES = 64 * KIB
#: What a page may hold past its bound: the one item that crossed it is left out, so the
#: JSON's brackets and commas at most.
SLACK = 1 * KIB
HEADER = "X-Shamal-Next-Page-Token"


@pytest.fixture
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    home = tmp_path_factory.mktemp("home")
    settings = Settings(
        home=home,
        database_url=f"sqlite:///{home / 'shamal.db'}",
        allowed_hosts=("*",),
        max_page_bytes=PAGE_BYTES,
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


@pytest.fixture
def sdk(api: TestClient, platform: Platform) -> Iterator[ShamalClient]:
    """The SDK client, in process: its pages go through the same app."""
    with ShamalClient(
        "http://testserver", platform.admin_secret, transport=_AppTransport(api)
    ) as client:
        yield client


class _AppTransport(httpx.BaseTransport):
    """The SDK's requests sent through the test client's app (a real transport, no mock)."""

    def __init__(self, api: TestClient) -> None:
        self._api = api

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._api.request(
            request.method,
            str(request.url),
            content=request.read(),
            headers=dict(request.headers),
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def _walk(
    api: TestClient, path: str, params: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Every item of a native list, page by page, checking each page's size; and how many
    pages it took."""
    items: list[dict[str, Any]] = []
    query = dict(params or {})
    pages = 0
    while True:
        r = api.get(path, params=query)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(r.content) <= PAGE_BYTES + SLACK or len(page) == 1
        items += page
        pages += 1
        token = r.headers.get(HEADER)
        if not token:
            return items, pages
        query["page_token"] = token


FAT = "x" * 4000


def test_job_pages_stop_at_their_byte_bound_and_resume_exactly(
    api: TestClient, sdk: ShamalClient
) -> None:
    ids = [
        api.post("/api/v1/jobs", json={"command": ["echo", FAT, FAT, FAT, FAT], "cpus": 0.5})
        .raise_for_status()
        .json()["id"]
        for _ in range(12)
    ]
    newest_first = list(reversed(ids))
    listed, pages = _walk(api, "/api/v1/jobs", {"limit": 1000})
    assert [j["id"] for j in listed] == newest_first
    assert pages >= 3
    # The SDK (and the CLI over it) still lists every job, or as many as asked for.
    assert [j["id"] for j in sdk.list_jobs(limit=1000)] == newest_first
    assert [j["id"] for j in sdk.list_jobs(limit=7)] == newest_first[:7]
    # A token this server did not make is a 400, never a query.
    bad = api.get("/api/v1/jobs", params={"page_token": "bm90IGEgdG9rZW4"})
    assert (bad.status_code, bad.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")


def test_artifact_pages_stop_at_their_byte_bound_and_resume_exactly(
    api: TestClient, sdk: ShamalClient
) -> None:
    api.post("/api/v1/teams", json={"name": "vision"}).raise_for_status()
    deep = "/".join(c * 200 for c in "def")
    paths = sorted(f"{deep}/{i:04d}-{'p' * 200}.bin" for i in range(100))
    for path in paths:
        api.put(f"/api/v1/artifacts/vision/{path}", content=b"x").raise_for_status()
    listed, pages = _walk(api, "/api/v1/artifacts/vision", {"limit": 10_000})
    assert [f["path"] for f in listed] == paths
    assert pages >= 2
    assert [f["path"] for f in sdk.list_artifacts("vision")] == paths
    assert [f["path"] for f in sdk.list_artifacts("vision", limit=5)] == paths[:5]


def test_model_pages_stop_at_their_byte_bound_and_resume_exactly(
    api: TestClient, sdk: ShamalClient
) -> None:
    names = [f"model-{i:03d}" for i in range(12)]
    for name in names:
        body = {"name": name, "description": "d" * 8000}
        api.post("/api/2.0/mlflow/registered-models/create", json=body).raise_for_status()
    listed, pages = _walk(api, "/api/v1/models", {"limit": 1000})
    assert [m["name"] for m in listed] == names
    assert pages >= 2
    assert [m["name"] for m in sdk.list_models(limit=1000)] == names
    assert [m["name"] for m in sdk.list_models(limit=3)] == names[:3]
    # The offset still places a first page.
    assert [m["name"] for m in api.get("/api/v1/models?offset=10").json()] == names[10:]


def test_account_team_token_and_audit_pages_resume_exactly(
    api: TestClient, sdk: ShamalClient
) -> None:
    long = "t" * 512
    teams = [f"team-{i:03d}" for i in range(130)]
    for team in teams:
        api.post("/api/v1/teams", json={"name": team, "description": long}).raise_for_status()
    listed, pages = _walk(api, "/api/v1/teams")
    assert [t["name"] for t in listed] == teams
    assert pages >= 2
    assert [t["name"] for t in sdk.list_teams()] == teams
    tokens = [
        api.post("/api/v1/tokens", json={"name": f"tok-{i:02d}"}).json()["id"] for i in range(3)
    ]
    assert set(tokens) <= {t["id"] for t in sdk.list_tokens()}
    deep = "/".join(c * 200 for c in "def")
    for i in range(70):  # an entry each, its target about 1 KiB
        api.put(f"/api/v1/artifacts/team-000/{deep}/{i}", content=b"x").raise_for_status()
    entries, pages = _walk(api, "/api/v1/audit", {"limit": 1000})
    assert pages >= 2
    seqs = [e["seq"] for e in entries]
    assert seqs == sorted(seqs, reverse=True)
    assert len(set(seqs)) == len(seqs) >= 203
    assert [e["seq"] for e in sdk.audit_entries(limit=1000)] == seqs
    # Users: the bootstrap admin and whoever came since, every one once.
    assert [u["name"] for u in _walk(api, "/api/v1/users")[0]] == [
        u["name"] for u in sdk.list_users()
    ]


def test_experiment_run_and_history_listings_are_bounded(
    api: TestClient, sdk: ShamalClient
) -> None:
    ids = []
    for i in range(12):
        body = {"name": f"exp-{i:02d}", "tags": [{"key": f"k{j}", "value": TAG} for j in range(2)]}
        ids.append(api.post("/api/2.0/mlflow/experiments/create", json=body).json())
    first = api.get("/api/v1/experiments", params={"max_results": 1000}).json()
    assert first["next_page_token"]
    assert len(first["items"]) < 13
    assert len(sdk.list_experiments(limit=1000)) == 13  # with the Default one
    experiment = ids[0]["experiment_id"]
    runs = []
    for i in range(12):
        run = api.post(
            "/api/2.0/mlflow/runs/create",
            json={"experiment_id": experiment, "run_name": f"r{i:02d}", "start_time": i},
        ).json()["run"]["info"]["run_id"]
        tags = [{"key": f"k{j}", "value": TAG} for j in range(2)]
        api.post("/api/2.0/mlflow/runs/log-batch", json={"run_id": run, "tags": tags})
        runs.append(run)
    page = api.get(f"/api/v1/experiments/{experiment}/runs", params={"max_results": 1000})
    assert len(page.content) <= PAGE_BYTES + 20 * KIB
    assert page.json()["next_page_token"]
    assert {r["run_id"] for r in sdk.list_runs(experiment, limit=1000)} == set(runs)
    metrics = [{"key": "loss", "value": i / 3, "timestamp": i, "step": i} for i in range(1000)]
    for start in range(0, 5000, 1000):
        shifted = [{**m, "step": m["step"] + start} for m in metrics]
        api.post(
            "/api/2.0/mlflow/runs/log-batch", json={"run_id": runs[0], "metrics": shifted}
        ).raise_for_status()
    url = f"/api/v1/runs/{runs[0]}/metrics/loss"
    first = api.get(url)
    assert len(first.content) <= PAGE_BYTES + SLACK
    assert first.json()["next_page_token"]
    points = sdk.metric_history(runs[0], "loss")
    assert [p["step"] for p in points] == list(range(5000))


TAG = "t" * 8000


def test_trial_pages_stop_at_their_byte_bound_and_resume_exactly(api: TestClient) -> None:
    """A trial carries what its code reported (here, eight attributes of 1,000 characters),
    so a study's trial list stops past the byte bound too."""
    made = api.post("/api/v1/tune/studies", json={"name": "fat-trials"})
    assert made.status_code < 300, made.text
    team = made.json()["team"] or "-"
    path = f"/api/v1/tune/studies/{team}/fat-trials/trials"
    numbers = []
    for _ in range(24):
        trial = api.post(path).raise_for_status().json()
        for key in "abcdefgh":
            attrs = api.post(
                f"/api/v1/tune/trials/{trial['id']}/attrs",
                json={"key": key, "value": FAT[:1000]},
            )
            assert attrs.status_code == 204, attrs.text
        numbers.append(trial["number"])
    listed, pages = _walk(api, path)
    assert [t["number"] for t in listed] == numbers
    assert pages >= 3


def test_a_models_versions_page_through_its_own_list(api: TestClient, sdk: ShamalClient) -> None:
    """A model's own answer holds its newest 100 versions; all of them page through its
    ``/versions`` list, bounded in bytes; the SDK puts them all back together."""
    api.post("/api/2.0/mlflow/registered-models/create", json={"name": "many"}).raise_for_status()
    experiment = api.post(
        "/api/2.0/mlflow/experiments/create", json={"name": "many-training"}
    ).json()["experiment_id"]
    run = api.post("/api/2.0/mlflow/runs/create", json={"experiment_id": experiment}).json()
    run_id = run["run"]["info"]["run_id"]
    for _ in range(110):
        body = {"name": "many", "source": f"runs:/{run_id}/model", "description": FAT[:1000]}
        api.post("/api/2.0/mlflow/model-versions/create", json=body).raise_for_status()
    detail = api.get("/api/v1/models/many").json()
    assert [v["version"] for v in detail["versions"]] == list(range(110, 10, -1))
    assert detail["more_versions"] is True
    listed, pages = _walk(api, "/api/v1/models/many/versions", {"limit": 1000})
    assert [v["version"] for v in listed] == list(range(110, 0, -1))
    assert pages >= 2  # 110 versions of about 1.2 KB against a 64 KiB page
    assert [v["version"] for v in sdk.get_model("many")["versions"]] == list(range(110, 0, -1))
