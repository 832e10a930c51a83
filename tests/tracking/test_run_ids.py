"""Short run ids: `GET /api/v1/runs?id_prefix=` and `ShamalClient.resolve_run_id`, in process.

The client talks to the real app through a transport that hands each request to the app's
TestClient and counts them, so "a full id costs no request" is checked, not assumed.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from shamal.client import AmbiguousRunId, ShamalClient
from shamal.config import Settings
from shamal.db.models.tracking import RunRow
from shamal.errors import InvalidParameter, NotFound


class AppTransport(httpx.BaseTransport):
    """Hands every request to the in-process app; counts them."""

    def __init__(self, api: TestClient) -> None:
        self.api = api
        self.requests: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        answer = self.api.request(
            request.method,
            request.url.raw_path.decode("ascii"),
            headers=headers,
            content=request.read(),
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def _mlflow(api: TestClient, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    answer = api.post(f"/api/2.0/mlflow/{path}", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _account(api: TestClient, name: str, role: str | None) -> str:
    api.post("/api/v1/users", json={"name": name})
    if role:
        assert api.put(f"/api/v1/teams/vision/members/{name}", json={"role": role}).is_success
    secret: str = api.post("/api/v1/tokens", json={"name": "t", "user": name}).json()["secret"]
    return secret


@pytest.fixture
def team_run(api: TestClient) -> tuple[str, dict[str, str]]:
    """A run in an experiment of team vision; the tokens of a member and of an outsider."""
    api.post("/api/v1/teams", json={"name": "vision"})
    tokens = {"mia": _account(api, "mia", "member"), "out": _account(api, "out", None)}
    mia = {"Authorization": f"Bearer {tokens['mia']}"}
    tag = [{"key": "shamal.team", "value": "vision"}]
    exp = _mlflow(api, "experiments/create", {"name": "cv", "tags": tag}, mia)["experiment_id"]
    run = _mlflow(api, "runs/create", {"experiment_id": exp, "run_name": "r"}, mia)
    return run["run"]["info"]["run_id"], tokens


def _client(api: TestClient, token: str) -> tuple[ShamalClient, AppTransport]:
    transport = AppTransport(api)
    return ShamalClient("http://testserver", token, transport=transport), transport


def test_a_prefix_names_a_run_only_for_who_can_see_it(
    api: TestClient, team_run: tuple[str, dict[str, str]]
) -> None:
    run_id, tokens = team_run
    mia, sent = _client(api, tokens["mia"])
    assert mia.resolve_run_id(run_id[:12]) == run_id
    assert mia.resolve_run_id(f" {run_id[:8].upper()} ") == run_id
    assert sent.requests == ["GET /api/v1/runs", "GET /api/v1/runs"]
    outsider, _ = _client(api, tokens["out"])
    with pytest.raises(
        NotFound, match=f"no run you can see has an id starting with '{run_id[:12]}'"
    ):
        outsider.resolve_run_id(run_id[:12])
    # Deleted runs can still be shown, so their ids still resolve.
    _mlflow(api, "runs/delete", {"run_id": run_id}, {})
    assert mia.resolve_run_id(run_id[:10]) == run_id


def test_a_full_id_costs_no_request_and_bad_ids_none_either(api: TestClient) -> None:
    client, sent = _client(api, str(api.headers["Authorization"]).removeprefix("Bearer "))
    full = uuid.uuid4().hex
    assert client.resolve_run_id(full) == full
    assert client.resolve_run_id(full.upper()) == full
    for bad in ("", "f00de26", "xyz12345678", full + "0", "../" + full[:10]):
        with pytest.raises(InvalidParameter, match="is not a run id"):
            client.resolve_run_id(bad)
    assert sent.requests == []
    refused = api.get("/api/v1/runs", params={"id_prefix": "f00de26"})
    assert (refused.status_code, refused.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE")


def test_an_ambiguous_prefix_names_its_first_candidates(
    api: TestClient, settings: Settings, team_run: tuple[str, dict[str, str]]
) -> None:
    run_id, tokens = team_run
    prefix = run_id[:12]
    twins = sorted({prefix + uuid.uuid4().hex[12:] for _ in range(11)} - {run_id})
    engine = sa.create_engine(settings.resolved_database_url)
    try:
        runs = RunRow.__table__
        with engine.begin() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().one()
            conn.execute(sa.insert(runs), [{**row, "run_id": t, "name": "twin"} for t in twins])
    finally:
        engine.dispose()
    mia, _ = _client(api, tokens["mia"])
    with pytest.raises(AmbiguousRunId) as raised:
        mia.resolve_run_id(prefix)
    every = sorted([run_id, *twins])
    assert [r["run_id"] for r in raised.value.candidates] == every[:10]
    assert raised.value.more is (len(every) > 10)
    assert f"run id prefix '{prefix}' is ambiguous: 10 or more runs start with it" in str(
        raised.value.message
    )
    listed = api.get("/api/v1/runs", params={"id_prefix": prefix, "max_results": 100}).json()
    assert [r["run_id"] for r in listed["items"]] == every
