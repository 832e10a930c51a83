"""The audit log page in process, on SQLite and PostgreSQL: entries newest first, paged
and filtered by actor, action and object, each detail as escaped JSON; the chain shown
intact, then broken at the entry an edit broke; refused to anyone but a platform admin;
bad addresses answer 400."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from shamal.server import Platform
from shamal.webui import _audit
from tests.webui.conftest import sign_in

HOSTILE = '<img src=x onerror="window.__xss=1">'


def _seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'<tr class="entry[^"]*">\s*<td class="metric">(\d+)', html)]


def _fill(api: TestClient) -> None:
    """Audited changes: teams t00..t59, a user, a membership, an experiment of a hostile
    name."""
    for i in range(60):
        assert api.post("/api/v1/teams", json={"name": f"t{i:02d}"}).status_code == 201
    assert api.post("/api/v1/users", json={"name": "ann"}).status_code == 201
    member = api.put("/api/v1/teams/t07/members/ann", json={"role": "member"})
    assert member.status_code == 200
    made = api.post("/api/2.0/mlflow/experiments/create", json={"name": HOSTILE})
    assert made.status_code == 200


def test_an_admin_reads_pages_of_entries_filtered_and_the_chain_intact(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    _fill(api)
    sign_in(browser, admin_token)
    first = browser.get("/ui/audit")
    assert first.status_code == 200
    html = first.text
    seqs = _seqs(html)
    assert len(seqs) == _audit.PER_PAGE
    assert seqs == sorted(seqs, reverse=True)  # newest first
    assert '<span class="badge ok">intact</span>' in html
    entries = int(re.search(r"</span> (\d+) entries verified", html).group(1))  # type: ignore[union-attr]
    assert entries >= 63
    assert "Verified now" in html  # the server's watch has not checked yet in a test
    assert "<img" not in html
    assert 'onerror="window' not in html
    assert "&lt;img src=x onerror=\\&#34;window.__xss=1\\&#34;&gt;" in html  # its detail
    older = re.search(r'rel="next" href="([^"]+)"', html)
    assert older is not None
    second = browser.get(older.group(1).replace("&amp;", "&"))
    assert _seqs(second.text)[0] == seqs[-1] - 1

    by_action = browser.get("/ui/audit", params={"action": "team.member.set"}).text
    assert len(_seqs(by_action)) == 1
    assert "team:t07" in by_action
    assert "&#34;role&#34;:&#34;member&#34;" in by_action  # the detail, compact JSON
    by_object = browser.get("/ui/audit", params={"object": "team:t1"}).text
    targets = re.findall(r'<td class="value">(team:[^<]*)</td>', by_object)
    assert targets == [f"team:t{i}" for i in range(19, 9, -1)]
    by_actor = browser.get("/ui/audit", params={"actor": "nobody"}).text
    assert "No entries match." in by_actor


def test_the_servers_last_check_is_shown_and_an_object_search_stops_and_reads_on(
    api: TestClient,
    browser: TestClient,
    admin_token: str,
    platform: Platform,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fill(api)
    checked = platform.audit_watch.check()
    sign_in(browser, admin_token)
    html = browser.get("/ui/audit").text
    assert "The server's last check" in html
    assert f"</span> {checked.entries_checked} entries verified" in html
    # A page reads at most MAX_SCANNED entries looking for an object, then says so.
    monkeypatch.setattr(_audit, "MAX_SCANNED", 10)
    monkeypatch.setattr(_audit, "_BATCH", 5)
    first = browser.get("/ui/audit", params={"object": "team:t0"}).text
    assert "Read 10 entries looking for this object" in first
    found = re.findall(r'<td class="value">(team:[^<]*)</td>', first)
    assert found == ["team:t07/user:ann"]  # of the newest 10 entries, only the membership
    pages = 0
    path: str | None = "/ui/audit?object=team%3At0"
    targets: list[str] = []
    while path is not None and pages < 20:
        page = browser.get(path).text
        targets += re.findall(r'<td class="value">(team:[^<]*)</td>', page)
        following = re.search(r'rel="next" href="([^"]+)"', page)
        path = following.group(1).replace("&amp;", "&") if following else None
        pages += 1
    assert targets == ["team:t07/user:ann"] + [f"team:t0{i}" for i in range(9, -1, -1)]


def test_a_broken_chain_is_shown_where_it_breaks(
    api: TestClient, browser: TestClient, admin_token: str, platform: Platform
) -> None:
    _fill(api)
    with platform.db.engine.begin() as connection:
        connection.execute(text("UPDATE audit_log SET target = 'team:innocent' WHERE seq = 3"))
    sign_in(browser, admin_token)
    html = browser.get("/ui/audit", params={"verify": "1"}).text
    assert '<span class="badge bad">broken</span> at entry 3' in html


def test_the_audit_log_is_for_platform_admins_only(api: TestClient, browser: TestClient) -> None:
    api.post("/api/v1/users", json={"name": "rae"}).raise_for_status()
    api.post("/api/v1/teams", json={"name": "red"}).raise_for_status()
    api.put("/api/v1/teams/red/members/rae", json={"role": "maintainer"}).raise_for_status()
    secret = api.post("/api/v1/tokens", json={"name": "ui", "user": "rae"}).json()["secret"]
    sign_in(browser, secret)
    refused = browser.get("/ui/audit")
    assert refused.status_code == 403
    assert "team:red" not in refused.text
    assert "intact" not in refused.text


def test_bad_addresses_answer_400(browser: TestClient, admin_token: str) -> None:
    sign_in(browser, admin_token)
    for params in ({"before": "0"}, {"before": "x"}, {"actor": "a" * 200}, {"verify": "maybe"}):
        answer = browser.get("/ui/audit", params=params)
        assert answer.status_code == 400, params
        assert "Traceback" not in answer.text
