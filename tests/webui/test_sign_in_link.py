"""The one-time sign-in link `shamal server --quickstart` prints: it signs its user in once,
with a token of its own, and never again; an expired or made-up link signs nobody in."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from shamal.webui import SESSION_COOKIE
from tests.webui.conftest import csrf_of


def _use(browser: TestClient, code: str) -> object:
    form = browser.get("/ui/sign-in")
    data = {"once": code, "csrf": csrf_of(form.text)}
    return browser.post("/ui/sign-in", data=data)


def _audit(api: TestClient, action: str) -> list[dict[str, object]]:
    entries = api.get("/api/v1/audit", params={"action": action, "limit": 50})
    entries.raise_for_status()
    return list(entries.json())


def test_a_link_signs_the_admin_in_once_with_a_token_of_its_own(
    api: TestClient, browser: TestClient
) -> None:
    code = api.app.state.security.issue_sign_in_link("admin")
    answer = _use(browser, code)
    assert answer.status_code == 303  # type: ignore[attr-defined]
    assert browser.cookies.get(SESSION_COOKIE)
    page = browser.get("/ui/experiments")
    assert page.status_code == 200
    assert "Signed in as <strong>admin</strong>" in page.text
    tokens = api.get("/api/v1/tokens").raise_for_status().json()
    web = [t for t in tokens if t["name"] == "web-ui"]
    assert len(web) == 1
    assert web[0]["expires_at"]  # it ends with the session
    # The same link again, from another browser: refused, and nobody is signed in.
    with TestClient(api.app, follow_redirects=False) as other:
        again = _use(other, code)
        assert again.status_code == 401  # type: ignore[attr-defined]
        assert "used already or has expired" in again.text  # type: ignore[attr-defined]
        assert not other.cookies.get(SESSION_COOKIE)
    assert [e["target"] for e in _audit(api, "ui.sign_in_link")] == ["user:admin"]
    outcomes = [e["outcome"] for e in _audit(api, "ui.sign_in")]
    assert sorted(outcomes) == ["ok", "unauthenticated"]


def test_an_expired_or_made_up_link_signs_nobody_in(api: TestClient, browser: TestClient) -> None:
    expired = api.app.state.security.issue_sign_in_link("admin", timedelta(seconds=-1))
    for code in (expired, "x" * 43, "<script>alert(1)</script>"):
        answer = _use(browser, code)
        assert answer.status_code == 401  # type: ignore[attr-defined]
        assert "<script>alert" not in answer.text  # type: ignore[attr-defined]
        assert not browser.cookies.get(SESSION_COOKIE)


def test_a_link_without_its_form_token_is_refused_and_stays_usable(
    api: TestClient, browser: TestClient
) -> None:
    code = api.app.state.security.issue_sign_in_link("admin")
    browser.get("/ui/sign-in")
    refused = browser.post("/ui/sign-in", data={"once": code, "csrf": "forged"})
    assert refused.status_code == 403
    assert _use(browser, code).status_code == 303  # type: ignore[attr-defined]


def test_a_link_for_an_unknown_user_is_not_issued(api: TestClient) -> None:
    from shamal.errors import NotFound

    with pytest.raises(NotFound):
        api.app.state.security.issue_sign_in_link("nobody-here")


def test_the_quickstart_banner_prints_a_link_that_signs_in(
    api: TestClient, browser: TestClient
) -> None:
    from shamal.cli.server import sign_in_link

    link = sign_in_link(api.app.state.platform, "http://127.0.0.1:8600")
    assert link is not None
    found = re.fullmatch(r"http://127\.0\.0\.1:8600/ui/sign-in#once=([A-Za-z0-9_-]+)", link)
    assert found is not None, link
    assert _use(browser, found[1]).status_code == 303  # type: ignore[attr-defined]
