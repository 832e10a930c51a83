"""The registry's pages in process: models made through the MLflow REST API, read through
the UI (list, model, version with its card and run), team scopes, hostile names, and the
alias form (a member moves an alias, audited; a viewer's post and a post without the form
token are refused and change nothing)."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from shamal.server import Platform
from tests.webui.conftest import csrf_of, sign_in

MLFLOW = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
HOSTILE = '<img src=x onerror="window.__xss=1">'
ESCAPED = "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;"
MLMODEL = (
    "flavors:\n  python_function: {loader_module: mlflow.sklearn}\n  sklearn: {}\n"
    "signature:\n"
    "  inputs: '"
    + json.dumps(
        [{"name": "sepal length (cm)", "type": "double"}, {"name": HOSTILE, "type": "long"}]
    )
    + "'\n  outputs: '"
    + json.dumps([{"type": "tensor", "tensor-spec": {"dtype": "int64", "shape": [-1]}}])
    + "'\n"
)


def _ok(answer: Any) -> dict[str, Any]:
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _token(api: TestClient, user: str, team: str | None = None, role: str = "viewer") -> str:
    api.post("/api/v1/users", json={"name": user}).raise_for_status()
    if team:
        api.put(f"/api/v1/teams/{team}/members/{user}", json={"role": role}).raise_for_status()
    answer = api.post("/api/v1/tokens", json={"name": "ui", "user": user})
    return str(answer.raise_for_status().json()["secret"])


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _run_with_model(api: TestClient, experiment_name: str, headers: dict[str, str]) -> str:
    """A run that logged ``loss`` and a model folder with an MLmodel (formats, signature)."""
    body = {"name": experiment_name, "tags": []}
    experiment = _ok(api.post(f"{MLFLOW}/experiments/create", json=body, headers=headers))
    created = api.post(
        f"{MLFLOW}/runs/create",
        json={"experiment_id": experiment["experiment_id"], "run_name": "trainer"},
        headers=headers,
    )
    run = _ok(created)["run"]["info"]
    batch = {
        "run_id": run["run_id"],
        "metrics": [{"key": "loss", "value": 0.25, "timestamp": 1, "step": 3}],
    }
    _ok(api.post(f"{MLFLOW}/runs/log-batch", json=batch, headers=headers))
    root = run["artifact_uri"].removeprefix("mlflow-artifacts:/")
    put = api.put(f"{ARTIFACTS}/{root}/model/MLmodel", content=MLMODEL.encode(), headers=headers)
    assert put.is_success, put.text
    return str(run["run_id"])


def _model(api: TestClient, name: str, headers: dict[str, str] | None = None, **extra: Any) -> None:
    body = {"name": name, **extra}
    _ok(api.post(f"{MLFLOW}/registered-models/create", json=body, headers=headers or {}))


def _version(
    api: TestClient, name: str, run_id: str | None = None, headers: dict[str, str] | None = None
) -> int:
    body: dict[str, Any] = {"name": name, "source": "mlflow-artifacts:/0/models/m1"}
    if run_id:
        body = {"name": name, "source": f"runs:/{run_id}/model", "run_id": run_id}
    body["tags"] = [{"key": "quality", "value": "gold"}]
    made = api.post(f"{MLFLOW}/model-versions/create", json=body, headers=headers or {})
    return int(_ok(made)["model_version"]["version"])


def _alias(api: TestClient, name: str, alias: str, version: int) -> None:
    body = {"name": name, "alias": alias, "version": str(version)}
    _ok(api.post(f"{MLFLOW}/registered-models/alias", json=body))


def _aliases(api: TestClient, name: str) -> dict[str, str]:
    got = _ok(api.get(f"{MLFLOW}/registered-models/get", params={"name": name}))
    return {a["alias"]: a["version"] for a in got["registered_model"].get("aliases", [])}


def test_models_pages_show_versions_aliases_the_card_and_the_run(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    run_id = _run_with_model(api, "training", {})
    _model(
        api,
        "iris classifier",
        description="# Iris\n\nA **classifier**.",
        tags=[{"key": "domain", "value": "botany"}],
    )
    assert _version(api, "iris classifier") == 1
    assert _version(api, "iris classifier", run_id) == 2
    _alias(api, "iris classifier", "champion", 2)
    _model(api, "another")
    sign_in(browser, admin_token)

    listing = browser.get("/ui/models")
    assert listing.status_code == 200
    assert '<a class="model-link" href="/ui/models/iris%20classifier">iris classifier</a>' in (
        listing.text
    )
    assert 'href="/ui/models/iris%20classifier/versions/2">v2</a>' in listing.text
    assert "@champion → v2" in listing.text
    assert "another" in listing.text
    searched = browser.get("/ui/models", params={"search": "IRIS"})
    assert "iris classifier" in searched.text
    assert "another" not in searched.text

    model = browser.get("/ui/models/iris%20classifier")
    assert model.status_code == 200
    assert '<pre class="text description"># Iris\n\nA **classifier**.</pre>' in model.text
    assert "botany" in model.text
    assert 'class="version-link" href="/ui/models/iris%20classifier/versions/1"' in model.text
    experiment = _ok(api.get(f"{MLFLOW}/runs/get", params={"run_id": run_id}))["run"]["info"][
        "experiment_id"
    ]
    assert f'href="/ui/experiments/{experiment}/runs/{run_id}"' in model.text
    assert "Model card (version 2)" in model.text
    assert "python_function, sklearn" in model.text
    assert "sepal length (cm)" in model.text
    assert "gold" in model.text

    version = browser.get("/ui/models/iris%20classifier/versions/2")
    assert version.status_code == 200
    assert '<span class="badge">@champion</span>' in version.text
    assert 'href="/ui/lineage?uri=models%3A%2Firis+classifier%2F2">Lineage</a>' in version.text
    assert '<td>loss</td><td class="metric">0.25</td><td>3</td>' in version.text
    assert f"runs:/{run_id}/model" in version.text
    assert "tensor-spec" in version.text
    plain = browser.get("/ui/models/iris%20classifier/versions/1")
    assert "No signature recorded." in plain.text
    assert browser.get("/ui/models/iris%20classifier/versions/9").status_code == 404
    assert browser.get("/ui/models/nothing-here").status_code == 404
    assert browser.get("/ui/models/iris%20classifier/versions/zero").status_code == 400
    assert browser.get("/ui/models", params={"search": "x" * 300}).status_code == 400


def test_the_models_list_pages_by_name(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    for i in range(53):
        _model(api, f"m-{i:02d}")
    sign_in(browser, admin_token)
    first = browser.get("/ui/models")
    names = re.findall(r'class="model-link" href="[^"]*">([^<]*)</a>', first.text)
    assert names == [f"m-{i:02d}" for i in range(50)]
    link = re.search(r'rel="next" href="([^"]*)"', first.text)
    assert link is not None
    second = browser.get(link.group(1).replace("&amp;", "&"))
    names = re.findall(r'class="model-link" href="[^"]*">([^<]*)</a>', second.text)
    assert names == ["m-50", "m-51", "m-52"]
    assert 'rel="next"' not in second.text


def test_a_person_sees_only_their_teams_models(
    api: TestClient, browser: TestClient, platform: Platform
) -> None:
    for team in ("red", "blue"):
        api.post("/api/v1/teams", json={"name": team}).raise_for_status()
    mia = _bearer(_token(api, "mia", "red", "maintainer"))
    _model(api, "red-secret", mia, tags=[{"key": "shamal.team", "value": "red"}])
    _version(api, "red-secret", headers=mia)
    _model(api, "open-model")
    sign_in(browser, _token(api, "bea", "blue"))
    listing = browser.get("/ui/models").text
    assert "open-model" in listing
    assert "red-secret" not in listing
    assert browser.get("/ui/models/red-secret").status_code == 404
    assert browser.get("/ui/models/red-secret/versions/1").status_code == 404
    page = browser.get("/ui/models/open-model")
    refused = browser.post(
        "/ui/models/red-secret/aliases",
        data={"csrf": csrf_of(page.text), "alias": "prod", "version": "1"},
    )
    assert refused.status_code == 404
    assert _aliases(api, "red-secret") == {}


def test_hostile_model_names_and_text_render_inert(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    run_id = _run_with_model(api, HOSTILE, {})
    _model(
        api,
        HOSTILE,
        description=f"[x](javascript:alert(1)) {HOSTILE}",
        tags=[{"key": "note", "value": HOSTILE}],
    )
    _version(api, HOSTILE, run_id)
    _alias(api, HOSTILE, "champion", 1)
    sign_in(browser, admin_token)
    encoded = quote(HOSTILE, safe="")
    pages = [
        browser.get("/ui/models"),
        browser.get(f"/ui/models/{encoded}"),
        browser.get(f"/ui/models/{encoded}/versions/1"),
    ]
    for answer in pages:
        assert answer.status_code == 200
        assert "<img" not in answer.text
        assert 'onerror="window' not in answer.text
        assert ESCAPED in answer.text
        assert 'href="javascript' not in answer.text
    assert f'href="/ui/models/{encoded}"' in pages[0].text
    form = pages[1].text
    assert f'action="/ui/models/{encoded}/aliases"' in form
    moved = browser.post(
        f"/ui/models/{encoded}/aliases",
        data={"csrf": csrf_of(form), "alias": "stable", "version": "1"},
    )
    assert moved.status_code == 303
    assert moved.headers["location"] == f"/ui/models/{encoded}"
    assert _aliases(api, HOSTILE) == {"champion": "1", "stable": "1"}

    odd = "50% of #1? yes & no"
    _model(api, odd)
    listing = browser.get("/ui/models", params={"search": "50%"}).text
    link = re.search(r'class="model-link" href="([^"]*)"', listing)
    assert link is not None
    assert link.group(1) == "/ui/models/50%25%20of%20%231%3F%20yes%20%26%20no"
    assert "<h1>50% of #1? yes &amp; no</h1>" in browser.get(link.group(1)).text


def test_a_member_moves_and_removes_aliases_a_viewer_is_refused(
    api: TestClient, browser: TestClient, platform: Platform
) -> None:
    api.post("/api/v1/teams", json={"name": "red"}).raise_for_status()
    mia = _token(api, "mia", "red", "member")
    vic = _token(api, "vic", "red", "viewer")
    _model(api, "ranker", _bearer(mia), tags=[{"key": "shamal.team", "value": "red"}])
    for _ in range(2):
        _version(api, "ranker", headers=_bearer(mia))
    _alias(api, "ranker", "champion", 1)

    sign_in(browser, vic)
    seen = browser.get("/ui/models/ranker")
    assert seen.status_code == 200
    assert "Set alias" not in seen.text
    assert "/aliases/delete" not in seen.text
    token = csrf_of(seen.text)  # the sign-out form's: the session's one token
    refused = browser.post(
        "/ui/models/ranker/aliases", data={"csrf": token, "alias": "champion", "version": "2"}
    )
    assert refused.status_code == 403
    gone = browser.post(
        "/ui/models/ranker/aliases/delete", data={"csrf": token, "alias": "champion"}
    )
    assert gone.status_code == 403
    assert _aliases(api, "ranker") == {"champion": "1"}

    sign_in(browser, mia)
    page = browser.get("/ui/models/ranker")
    assert 'action="/ui/models/ranker/aliases"' in page.text
    assert "Remove alias champion" in page.text
    token = csrf_of(page.text)
    no_token = browser.post("/ui/models/ranker/aliases", data={"alias": "champion", "version": "2"})
    assert no_token.status_code == 403
    forged = browser.post(
        "/ui/models/ranker/aliases", data={"csrf": "A" * 43, "alias": "champion", "version": "2"}
    )
    assert forged.status_code == 403
    assert _aliases(api, "ranker") == {"champion": "1"}

    moved = browser.post(
        "/ui/models/ranker/aliases", data={"csrf": token, "alias": "champion", "version": "2"}
    )
    assert moved.status_code == 303
    assert moved.headers["location"] == "/ui/models/ranker"
    assert _aliases(api, "ranker") == {"champion": "2"}
    assert "<td>@champion</td>" in browser.get("/ui/models/ranker").text
    reserved = browser.post(
        "/ui/models/ranker/aliases", data={"csrf": token, "alias": "latest", "version": "1"}
    )
    assert reserved.status_code == 400
    missing = browser.post(
        "/ui/models/ranker/aliases", data={"csrf": token, "alias": "x", "version": "99"}
    )
    assert missing.status_code == 404
    for bad in ({"alias": "x", "version": "two"}, {"alias": "", "version": "1"}, {"alias": "x"}):
        answer = browser.post("/ui/models/ranker/aliases", data={"csrf": token, **bad})
        assert answer.status_code == 400, bad
    assert _aliases(api, "ranker") == {"champion": "2"}
    removed = browser.post(
        "/ui/models/ranker/aliases/delete", data={"csrf": token, "alias": "champion"}
    )
    assert removed.status_code == 303
    assert _aliases(api, "ranker") == {}

    entries = platform.audit.entries(action="registered_model.alias.set")
    outcomes = [(e.actor, e.outcome) for e in entries]
    assert ("mia", "ok") in outcomes
    assert ("vic", "permission_denied") in outcomes
    assert ("admin", "ok") in outcomes  # the API's own call, the same action
    deleted = platform.audit.entries(action="registered_model.alias.delete")
    assert [(e.actor, e.outcome) for e in deleted][:2] == [
        ("mia", "ok"),
        ("vic", "permission_denied"),
    ]
