"""The deployments pages in process, on SQLite and PostgreSQL: the list, a deployment's
traffic split, rollout (live, final once no rollout is in progress), calls and history,
team scopes, the roll-back form by role and without its form token, hostile model names
and bad addresses.

Deployments are made and driven through the HTTP API as a deployer and a serve process
do (a rollout interval of a millisecond lets the controller step at the first healthy
report); the registry's versions come from the deployment tests' fixtures.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shamal.deployments import LATENCY_SLOTS, latency_slot
from shamal.registry import TEAM_TAG, RegistryService
from tests.deployments.conftest import People, people, registry
from tests.webui.conftest import csrf_of, sign_in

__all__ = ["people", "registry"]

#: Team red's ``fraud`` v1-3 and team blue's ``blues`` v1, in every test.
pytestmark = pytest.mark.usefixtures("registry")

BASE = "/api/v1/deployments"
HOSTILE = '<img src=x onerror="window.__xss=1">'
ESCAPED = "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;"


def _deploy(api: TestClient, people: People, who: str, name: str, body: dict[str, Any]) -> None:
    answer = api.put(f"{BASE}/{name}", json=body, headers=people.headers(who))
    assert answer.status_code == 200, answer.text


def _canary(api: TestClient, people: People) -> None:
    """``fraud-api`` of team red: v1 primary, v2 a canary at 10% stepping 10 → 50 → 100."""
    _deploy(
        api,
        people,
        "mo",
        "fraud-api",
        {
            "primary": [{"model": "models:/fraud/1"}],
            "canary": {"model": "models:/fraud/2", "percent": 10},
            "shadows": [{"model": "models:/fraud/3", "percent": 25}],
            "rollout": {"steps": [10, 50, 100], "interval_s": 0.001},
            "slo": {"min_requests": 20, "max_error_rate": 0.05},
            "team": "red",
        },
    )


def _stats(version: str, ok: int, errors: int = 0, ms: float = 5.0) -> dict[str, Any]:
    counts = [0] * LATENCY_SLOTS
    counts[latency_slot(ms)] = ok + errors
    return {"version": version, "ok": ok, "errors": errors, "latency_counts": counts}


def _report(api: TestClient, people: People, revision: int, *versions: dict[str, Any]) -> str:
    answer = api.post(
        f"{BASE}/fraud-api/reports",
        json={"revision": revision, "versions": list(versions)},
        headers=people.headers("mo"),
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["action"])


def test_the_list_and_a_deployments_split_rollout_calls_and_history(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _canary(api, people)
    # A healthy canary with enough requests steps up at once (interval: 1 ms).
    assert _report(api, people, 1, _stats("2", 30), _stats("1", 300)) == "step"
    assert _report(api, people, 2, _stats("2", 5), _stats("1", 40, errors=2, ms=50)) == "hold"
    sample = {"shape": [1], "datatype": "FP64", "data": [1.0]}
    pushed = api.post(
        f"{BASE}/fraud-api/samples",
        json={
            "samples": [
                {"revision": 2, "version": v, "inputs": {"x": sample}, "outputs": {"y": sample}}
                for v in ("1", "1", "2")
            ]
        },
        headers=people.headers("mo"),
    )
    assert pushed.json()["accepted"] == 3
    sign_in(browser, people.secrets["vi"])

    listing = browser.get("/ui/deployments")
    assert listing.status_code == 200
    assert 'href="/ui/deployments/fraud-api"' in listing.text
    assert "v2</a> at 50%" in listing.text
    assert "v3 (25% mirrored)" in listing.text
    assert "progressing" in listing.text

    detail = browser.get("/ui/deployments/fraud-api")
    assert detail.status_code == 200
    html = detail.text
    assert "v1 primary 50%" in html
    assert "v2 canary 50%" in html
    assert "v3 mirrors 25%" in html
    assert 'href="/ui/models/fraud/versions/2"' in html
    assert 'href="/ui/lineage?uri=deployments%3A%2Ffraud-api"' in html
    assert 'data-live="/ui/deployments/fraud-api/rollout"' in html
    assert "2 of 3" in html  # steps reached
    assert "stepped up" in html
    assert "healthy at 10%" in html  # the controller's reason
    assert "v2 has 5 of the 20 requests needed" in html  # the controller's view now
    assert "4.76%" in html  # v1: 2 errors in 42 calls
    assert "Sampled requests per" in html
    # Latency and errors over time: every reported call, by minute and version.
    assert "Latency per minute (ms, upper bound of the bucket)" in html
    assert "Calls that failed per minute (%)" in html
    for series in ("v1 p50", "v1 p95", "v2 p95"):
        assert re.search(rf'<li class="series-\d">{series}</li>', html), series
    assert 'action="/ui/deployments/fraud-api/rollback"' not in html  # a viewer's page

    live = browser.get("/ui/deployments/fraud-api/rollout")
    assert live.status_code == 200
    assert "X-Shamal-Final" not in live.headers
    assert "<html" not in live.text
    assert "stepped up" in live.text


def test_roll_back_by_role_and_form_token(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _canary(api, people)
    sign_in(browser, people.secrets["vi"])
    viewer_page = browser.get("/ui/deployments/fraud-api").text
    refused = browser.post(
        "/ui/deployments/fraud-api/rollback",
        data={"csrf": csrf_of(viewer_page), "reason": "viewer says no"},
    )
    assert refused.status_code == 403
    assert api.get(f"{BASE}/fraud-api").json()["state"]["phase"] == "progressing"

    browser.cookies.clear()
    sign_in(browser, people.secrets["rita"])
    page = browser.get("/ui/deployments/fraud-api").text
    assert 'action="/ui/deployments/fraud-api/rollback"' in page
    no_token = browser.post("/ui/deployments/fraud-api/rollback", data={"reason": "x"})
    assert no_token.status_code == 403
    stale = browser.post(
        "/ui/deployments/fraud-api/rollback",
        data={"csrf": csrf_of(page), "revision": "7", "reason": "stale form"},
    )
    assert stale.status_code == 409
    assert api.get(f"{BASE}/fraud-api").json()["state"]["phase"] == "progressing"

    done = browser.post(
        "/ui/deployments/fraud-api/rollback",
        data={"csrf": csrf_of(page), "revision": "1", "reason": HOSTILE},
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/ui/deployments/fraud-api"
    state = api.get(f"{BASE}/fraud-api").json()
    assert state["state"]["phase"] == "rolled_back"
    assert [r["role"] for r in state["routes"]] == ["primary", "shadow"]
    after = browser.get("/ui/deployments/fraud-api").text
    assert "rolled back" in after
    assert "v1 primary 100%" in after
    assert "data-live" not in after
    assert "<img" not in after
    assert ESCAPED in after  # the reason, as text
    assert 'action="/ui/deployments/fraud-api/rollback"' not in after  # no canary left
    final = browser.get("/ui/deployments/fraud-api/rollout")
    assert final.headers["X-Shamal-Final"] == "1"
    audited = api.get("/api/v1/audit", params={"action": "deployment.rollback"}).json()
    assert [(e["actor"], e["outcome"]) for e in audited] == [
        ("rita", "ok"),
        ("rita", "invalid_state"),
        ("vi", "permission_denied"),
    ]
    browser.cookies.clear()
    sign_in(browser, people.secrets["admin"])
    as_admin = browser.get("/ui/deployments/fraud-api").text
    assert 'href="/ui/audit?object=deployment%3Afraud-api"' in as_admin
    entries = browser.get("/ui/audit", params={"object": "deployment:fraud-api"}).text
    assert entries.count("<td>deployment.rollback</td>") == 3


def test_another_teams_deployment_is_absent_and_unreachable(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _canary(api, people)
    _deploy(api, people, "bo", "blues-api", {"primary": [{"model": "models:/blues/1"}]})
    sign_in(browser, people.secrets["bo"])
    listing = browser.get("/ui/deployments").text
    assert "blues-api" in listing
    assert "fraud-api" not in listing
    assert browser.get("/ui/deployments/fraud-api").status_code == 404
    assert browser.get("/ui/deployments/fraud-api/rollout").status_code == 404
    page = browser.get("/ui/deployments/blues-api").text
    refused = browser.post(
        "/ui/deployments/fraud-api/rollback", data={"csrf": csrf_of(page), "reason": "mine now"}
    )
    assert refused.status_code == 404
    assert api.get(f"{BASE}/fraud-api").json()["state"]["phase"] == "progressing"


def test_hostile_model_names_render_as_text_and_bad_addresses_answer_400(
    api: TestClient, browser: TestClient, people: People, registry: RegistryService
) -> None:
    registry.create_registered_model(people.ctx("mo"), HOSTILE, tags={TEAM_TAG: "red"})
    registry.create_model_version(people.ctx("mo"), HOSTILE, "mlflow-artifacts:/models/h")
    _deploy(
        api,
        people,
        "mo",
        "odd",
        {"primary": [{"model": f"models:/{HOSTILE}/1"}], "team": "red"},
    )
    sign_in(browser, people.secrets["mo"])
    for path in ("/ui/deployments", "/ui/deployments/odd"):
        html = browser.get(path).text
        assert "<img" not in html
        assert 'onerror="window' not in html
        assert ESCAPED in html
        assert (
            "/ui/models/%3Cimg%20src%3Dx%20onerror%3D%22window.__xss%3D1%22%3E/versions/1" in html
        )
    assert browser.get("/ui/deployments?after=Not%20A%20Name").status_code == 400
    assert browser.get("/ui/deployments/Bad_Name").status_code == 400
    page = browser.get("/ui/deployments/odd").text
    bad_form = browser.post(
        "/ui/deployments/odd/rollback", data={"csrf": csrf_of(page), "revision": "one"}
    )
    assert bad_form.status_code == 400


def test_the_controllers_decisions_are_shown_with_their_reasons(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _canary(api, people)
    assert _report(api, people, 1, _stats("2", 30)) == "step"  # 10% -> 50%
    assert _report(api, people, 2, _stats("2", 30)) == "step"  # 50% -> 100%
    assert _report(api, people, 3, _stats("2", 30)) == "promote"
    sign_in(browser, people.secrets["vi"])
    promoted = browser.get("/ui/deployments/fraud-api").text
    decisions = promoted.split("Decisions taken")[1].split("</table>")[0]
    assert decisions.index("promoted") < decisions.index("stepped up")  # newest first
    assert "healthy at 100%" in decisions
    assert "v2 primary 100%" in promoted
    assert "data-live" not in promoted
    assert browser.get("/ui/deployments/fraud-api/rollout").headers["X-Shamal-Final"] == "1"

    _canary(api, people)  # a new spec: v2 is a canary again, from 10%
    assert _report(api, people, 5, _stats("2", 10, errors=20)) == "rollback"
    rolled = browser.get("/ui/deployments/fraud-api").text
    decisions = rolled.split("Decisions taken")[1].split("</table>")[0]
    newest = decisions.split("<tr class=")[1]  # [0]: the table head
    assert "rolled back" in newest
    assert "rollout-controller" in newest
    assert "breaks the SLO" in newest
    assert "rolled back" in rolled.split("Rollout</dt>")[1]
