"""The web UI in process, on SQLite and PostgreSQL: sign-in and its cookie, CSRF, the
security headers, the pages over the tracking service (filter, order, columns, pages),
team scopes, hostile names escaped, and the downsampled curves."""

from __future__ import annotations

import base64
import re
from typing import Any

from fastapi.testclient import TestClient

from shamal.webui import CONTENT_SECURITY_POLICY, SESSION_COOKIE
from tests.webui.conftest import csrf_of, sign_in

MLFLOW = "/api/2.0/mlflow"
HOSTILE = '<img src=x onerror="window.__xss=1">'


def _experiment(api: TestClient, name: str, tags: list[dict[str, str]] | None = None) -> str:
    answer = api.post(f"{MLFLOW}/experiments/create", json={"name": name, "tags": tags or []})
    answer.raise_for_status()
    return str(answer.json()["experiment_id"])


def _run(api: TestClient, experiment: str, name: str, **logged: Any) -> str:
    created = api.post(
        f"{MLFLOW}/runs/create", json={"experiment_id": experiment, "run_name": name}
    )
    created.raise_for_status()
    run_id = str(created.json()["run"]["info"]["run_id"])
    batch = {
        "run_id": run_id,
        "params": [{"key": k, "value": v} for k, v in logged.get("params", {}).items()],
        "tags": [{"key": k, "value": v} for k, v in logged.get("tags", {}).items()],
        "metrics": [
            {"key": k, "value": v, "timestamp": 1, "step": step}
            for k, curve in logged.get("metrics", {}).items()
            for step, v in enumerate(curve)
        ],
    }
    api.post(f"{MLFLOW}/runs/log-batch", json=batch).raise_for_status()
    return run_id


def _member_token(api: TestClient, user: str, team: str | None = None) -> str:
    api.post("/api/v1/users", json={"name": user}).raise_for_status()
    if team:
        api.put(f"/api/v1/teams/{team}/members/{user}", json={"role": "viewer"}).raise_for_status()
    answer = api.post("/api/v1/tokens", json={"name": "ui", "user": user})
    return str(answer.raise_for_status().json()["secret"])


def _assert_headers(answer: Any) -> None:
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "same-origin"


def test_signed_out_requests_go_to_sign_in_and_the_cookie_is_sealed(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    page = browser.get("/ui/experiments/0")
    assert page.status_code == 303
    assert page.headers["location"] == "/ui/sign-in?next=/ui/experiments/0"
    _assert_headers(page)
    assert browser.get("/").headers["location"] == "/ui/sign-in"
    curve = browser.get(f"/ui/api/runs/{'a' * 32}/metrics/loss")
    assert curve.status_code == 401
    assert curve.json()["error_code"] == "UI_ERROR"
    # A bearer header is no session: the UI reads only its cookie.
    assert browser.get("/", headers={"Authorization": f"Bearer {admin_token}"}).status_code == 303

    answer = sign_in(browser, admin_token, next="/ui/experiments/0")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/experiments/0"
    cookie = next(
        v for k, v in answer.headers.multi_items() if k == "set-cookie" and SESSION_COOKIE in v
    )
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/" in cookie
    assert "Secure" not in cookie  # plain http here; https gets Secure
    assert admin_token not in cookie
    assert admin_token[4:20] not in cookie
    page = browser.get("/ui/experiments")
    assert page.status_code == 200
    assert "Default" in page.text
    _assert_headers(page)


def test_wrong_tokens_and_foreign_return_paths_are_refused(
    browser: TestClient, admin_token: str
) -> None:
    wrong = sign_in(browser, "shm_" + "x" * 43)
    assert wrong.status_code == 401
    assert "was not accepted" in wrong.text
    assert SESSION_COOKIE not in browser.cookies
    for where in ["https://evil.example/", "//evil.example/ui/", "/ui/../api/v1/tokens"]:
        answer = sign_in(browser, admin_token, next=where)
        assert answer.headers["location"] == "/ui/experiments", where
    # The MLflow client's fragment leads to its page (Shamal's, with MLflow's own UI off:
    # test_mlflow_ui_api.py has it on); a made-up one does not.
    app_state = browser.app.state  # type: ignore[attr-defined]
    app_state.settings = app_state.settings.model_copy(update={"mlflow_ui": False})
    link = sign_in(browser, admin_token, fragment=f"#/experiments/12/runs/{'c' * 32}")
    assert link.headers["location"] == f"/ui/experiments/12/runs/{'c' * 32}"
    odd = sign_in(browser, admin_token, fragment="#/experiments/1/../../api")
    assert odd.headers["location"] == "/ui/experiments"


def test_posts_without_the_form_token_are_refused(browser: TestClient, admin_token: str) -> None:
    form = browser.get("/ui/sign-in")
    refused = browser.post("/ui/sign-in", data={"token": admin_token})
    assert refused.status_code == 403
    assert "was refused" in refused.text
    _assert_headers(refused)
    assert SESSION_COOKIE not in browser.cookies
    stale = browser.post("/ui/sign-in", data={"token": admin_token, "csrf": "A" * 43})
    assert stale.status_code == 403
    assert form.status_code == 200

    sign_in(browser, admin_token)
    page = browser.get("/ui/experiments")
    assert browser.post("/ui/sign-out").status_code == 403
    assert browser.post("/ui/sign-out", data={"csrf": "forged"}).status_code == 403
    assert browser.get("/ui/experiments").status_code == 200  # still signed in
    out = browser.post("/ui/sign-out", data={"csrf": csrf_of(page.text)})
    assert out.status_code == 303
    assert out.headers["location"] == "/ui/sign-in"
    assert browser.get("/ui/experiments").status_code == 303


def test_a_revoked_token_or_a_changed_cookie_signs_out(
    api: TestClient, browser: TestClient
) -> None:
    secret = _member_token(api, "rae")
    sign_in(browser, secret)
    assert browser.get("/ui/experiments").status_code == 200
    token_id = next(
        t["id"] for t in api.get("/api/v1/tokens?all=true").json() if t["user"] == "rae"
    )
    api.delete(f"/api/v1/tokens/{token_id}").raise_for_status()
    gone = browser.get("/ui/experiments")
    assert gone.status_code == 303
    assert gone.headers["location"].startswith("/ui/sign-in")
    assert sign_in(browser, secret).status_code == 401

    sign_in(browser, _member_token(api, "tam"))
    cookie = browser.cookies[SESSION_COOKIE]
    browser.cookies.clear()
    browser.cookies.set(SESSION_COOKIE, cookie)
    assert browser.get("/ui/experiments").status_code == 200  # the cookie, set back as it was
    raw = bytearray(base64.urlsafe_b64decode(cookie))
    raw[40] ^= 0x01  # one bit of the sealed token
    browser.cookies.clear()
    browser.cookies.set(SESSION_COOKIE, base64.urlsafe_b64encode(bytes(raw)).decode())
    assert browser.get("/ui/experiments").status_code == 303


def test_the_runs_table_filters_orders_chooses_columns_and_pages(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    experiment = _experiment(api, "sweep")
    for i in range(55):
        _run(
            api, experiment, f"run-{i:02d}", params={"lr": str(i / 100)}, metrics={"loss": [i / 10]}
        )
    sign_in(browser, admin_token)
    base = f"/ui/experiments/{experiment}"
    first = browser.get(base)
    assert first.status_code == 200
    assert first.text.count('class="run-link"') == 50
    assert 'rel="next"' in first.text

    filtered = browser.get(
        base, params={"filter": "metrics.loss < 0.3", "order": "metrics.`loss` DESC"}
    )
    names = _run_names(filtered.text)
    assert names == ["run-02", "run-01", "run-00"]
    ascending = browser.get(
        base, params={"filter": "metrics.loss < 0.3", "order": "metrics.`loss` ASC"}
    )
    assert _run_names(ascending.text) == ["run-00", "run-01", "run-02"]

    with_columns = browser.get(
        base, params={"filter": "params.lr = '0.07'", "param": "lr", "metric": "loss"}
    )
    assert '<td class="param">0.07</td>' in with_columns.text
    assert '<td class="metric">0.7</td>' in with_columns.text
    assert "order=params.%60lr%60+DESC" in with_columns.text  # the header sorts by it

    bad = browser.get(base, params={"filter": "metrics.loss <<< 1"})
    assert bad.status_code == 400
    assert "Invalid filter" in bad.text

    token = first.text.split("page_token=")[1].split('"')[0]
    second = browser.get(f"{base}?page_token={token}")
    assert second.text.count('class="run-link"') == 5


def _run_names(html: str) -> list[str]:
    return re.findall(r'class="run-link" href="[^"]*">([^<]*)</a>', html)


def test_a_person_sees_only_what_the_api_shows_them(api: TestClient, browser: TestClient) -> None:
    api.post("/api/v1/teams", json={"name": "red"}).raise_for_status()
    api.post("/api/v1/teams", json={"name": "blue"}).raise_for_status()
    red = _experiment(api, "red-secrets", [{"key": "shamal.team", "value": "red"}])
    blue = _experiment(api, "blue-work", [{"key": "shamal.team", "value": "blue"}])
    run = _run(api, red, "hidden-run", metrics={"loss": [1.0, 0.5]})
    sign_in(browser, _member_token(api, "bea", team="blue"))
    listing = browser.get("/ui/experiments").text
    assert "blue-work" in listing
    assert "red-secrets" not in listing
    assert browser.get(f"/ui/experiments/{blue}").status_code == 200
    assert browser.get(f"/ui/experiments/{red}").status_code == 404
    assert browser.get(f"/ui/experiments/{red}/runs/{run}").status_code == 404
    assert browser.get(f"/ui/api/runs/{run}/metrics/loss").status_code == 404


def test_hostile_names_render_as_text(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    experiment = _experiment(api, HOSTILE)
    run = _run(
        api,
        experiment,
        HOSTILE,
        params={HOSTILE: "javascript:alert(1)"},
        tags={"note": HOSTILE},
        metrics={HOSTILE: [1.0, 2.0]},
    )
    sign_in(browser, admin_token)
    pages = [
        browser.get("/ui/experiments").text,
        browser.get(f"/ui/experiments/{experiment}", params={"param": HOSTILE}).text,
        browser.get(f"/ui/experiments/{experiment}/runs/{run}").text,
        browser.get("/ui/compare", params={"run": [run, _run(api, experiment, "b")]}).text,
    ]
    for html in pages:
        assert "<img" not in html
        assert 'onerror="window' not in html
        assert "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;" in html
        assert 'href="javascript' not in html


def test_a_curve_comes_back_downsampled_and_zooms_to_full_resolution(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    experiment = _experiment(api, "curves")
    curve = [float(i % 97) for i in range(900)]
    curve[450] = 1e6  # a spike the downsampler must keep
    run = _run(api, experiment, "long", metrics={"train/loss": curve})
    sign_in(browser, admin_token)
    answer = browser.get(f"/ui/api/runs/{run}/metrics/train%2Floss", params={"points": 100})
    assert answer.status_code == 200
    _assert_headers(answer)
    body = answer.json()
    assert body["total"] == 900
    assert body["downsampled"]
    assert len(body["steps"]) <= 100
    assert 1e6 in body["values"]
    assert body["steps"][0] == 0
    assert body["steps"][-1] == 899
    zoom = browser.get(
        f"/ui/api/runs/{run}/metrics/train/loss", params={"points": 100, "from": 400, "to": 460}
    ).json()
    assert zoom["steps"] == list(range(400, 461))
    assert not zoom["downsampled"]
    assert browser.get(f"/ui/api/runs/{run}/metrics/loss", params={"points": 2}).status_code == 400
