"""The monitors pages in process, on SQLite and PostgreSQL: the list with each monitor's
last verdict, a monitor's drift charts with their thresholds, its last run's verdicts,
quality findings and the actions its policy took, team scopes, hostile column names and
bad addresses.

The monitoring tests' fixtures make team red's deployment ``fraud-api`` and the reference
of ``fraud/1``; monitors are made and run through the HTTP API, samples reach the
deployment as a serve process's do.
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from shamal.deployments import DeploymentService, Label, SampledRequest
from shamal.monitoring import ReferenceService
from shamal.monitoring.core import SketchBuilder
from tests.monitoring.conftest import (
    DEPLOYMENT,
    MODEL,
    People,
    clock,
    deployments,
    excerpt,
    people,
    reference,
    references,
    registry,
    send,
)
from tests.webui.conftest import sign_in

__all__ = ["clock", "deployments", "people", "reference", "references", "registry"]

BASE = "/api/v1/monitors"
HOSTILE = '<img src=x onerror="window.__xss=1">'
ESCAPED = "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;"


def _monitor(api: TestClient, people: People, **body: object) -> None:
    made = api.post(
        BASE,
        json={"deployment": DEPLOYMENT, "schedule_s": 3600, "name": "watch", **body},
        headers=people.headers("mo"),
    )
    assert made.status_code == 200, made.text


def _run(api: TestClient, people: People) -> dict[str, object]:
    ran = api.post(f"{BASE}/watch/run", headers=people.headers("mo"))
    assert ran.status_code == 200, ran.text
    result = ran.json()["result"]
    assert isinstance(result, dict)
    return result


@pytest.mark.usefixtures("reference")
def test_a_monitor_that_ran_shows_its_drift_over_time_and_what_it_did(
    api: TestClient, browser: TestClient, people: People, deployments: DeploymentService
) -> None:
    _monitor(api, people, on_drift="rollback", window=2000)
    send(deployments, people, samples=10)
    assert _run(api, people)["drifted"] is False
    send(deployments, people, samples=10, amount_shift=40.0, seed=9)
    drifted = _run(api, people)
    assert drifted["drifted"] is True
    sign_in(browser, people.secrets["vi"])

    listing = browser.get("/ui/monitors")
    assert listing.status_code == 200
    row = listing.text.split('href="/ui/monitors/watch"')[1].split("</tr>")[0]
    assert 'href="/ui/deployments/fraud-api"' in row
    assert "every 1 h" in row
    assert "drift" in row
    assert re.search(r"\b[1-3] of 3\b", row)
    assert "rollback: failed" in row  # fraud-api has no canary to roll back

    detail = browser.get("/ui/monitors/watch")
    assert detail.status_code == 200
    html = detail.text
    assert html.count('class="chart drift-chart"') == 3  # amount, country, score
    assert html.count('class="rule"') == 3
    assert "threshold (drift above)" in html or "threshold (drift below)" in html
    assert html.count("<polyline") == 3
    assert f'href="/ui/models/{MODEL}/versions/1"' in html
    assert "following the deployment's primary" in html
    assert "<caption>Features</caption>" in html
    assert "<caption>Predictions</caption>" in html  # the score: prediction drift
    assert "amount" in html.split("<caption>Features</caption>")[1]
    assert "score" in html.split("<caption>Predictions</caption>")[1]
    assert '<span class="badge bad">yes</span>' in html
    assert "Data quality" in html
    assert "rollback: failed" in html
    assert "no canary" in html
    deployment = browser.get(f"/ui/deployments/{DEPLOYMENT}").text
    assert 'href="/ui/monitors/watch"' in deployment


@pytest.mark.usefixtures("reference", "deployments")
def test_another_teams_monitor_is_absent_and_unreachable(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _monitor(api, people)
    sign_in(browser, people.secrets["bo"])
    assert "watch" not in browser.get("/ui/monitors").text
    assert browser.get("/ui/monitors/watch").status_code == 404
    browser.cookies.clear()
    sign_in(browser, people.secrets["admin"])
    as_admin = browser.get("/ui/monitors/watch").text
    assert 'href="/ui/audit?object=monitor%3Awatch"' in as_admin
    browser.cookies.clear()
    sign_in(browser, people.secrets["vi"])
    page = browser.get("/ui/monitors/watch")
    assert "/ui/audit" not in page.text.split("</header>")[1]
    assert page.status_code == 200
    assert "No runs with samples yet" in page.text


def test_hostile_column_names_render_as_text_and_bad_addresses_answer_400(
    api: TestClient,
    browser: TestClient,
    people: People,
    deployments: DeploymentService,
    references: ReferenceService,
    reference: None,
) -> None:
    builder = SketchBuilder({HOSTILE: "numeric"})
    builder.update({HOSTILE: [1.0, 2.0, 3.0]})
    references.upload(people.ctx("mo"), MODEL, 1, {HOSTILE: builder.result()[HOSTILE].to_json()})
    _monitor(api, people)
    send(deployments, people, samples=5)
    _run(api, people)
    sign_in(browser, people.secrets["mo"])
    html = browser.get("/ui/monitors/watch").text
    assert "<img" not in html
    assert 'onerror="window' not in html
    assert ESCAPED in html  # missing from the samples, named as text
    for bad in (
        "/ui/monitors/watch?runs=0",
        "/ui/monitors/watch?runs=many",
        "/ui/monitors?after=Not%20A%20Name",
        "/ui/monitors/Not%20A%20Name",
    ):
        answer = browser.get(bad)
        assert answer.status_code == 400, bad
        assert "Traceback" not in answer.text


@pytest.mark.usefixtures("reference")
def test_performance_shows_once_labels_arrive(
    api: TestClient, browser: TestClient, people: People, deployments: DeploymentService
) -> None:
    _monitor(api, people)
    mo = people.principals["mo"]
    revision = deployments.get(mo, DEPLOYMENT).revision
    answers = [0, 1, 1, 0]
    sampled = [
        SampledRequest(
            revision=revision,
            version="1",
            shadow=False,
            inputs={
                "amount": excerpt([100.0, 101.0, 99.0, 100.5]),
                "country": excerpt(["nl"] * 4, "BYTES"),
            },
            outputs={"label": excerpt(answers, "INT64")},
            request_id=f"r{i}",
        )
        for i in range(5)
    ]
    deployments.record_samples(mo, DEPLOYMENT, sampled)
    _run(api, people)
    deployments.record_labels(mo, DEPLOYMENT, [Label(f"r{i}", [0, 1, 1, 1]) for i in range(5)])
    _run(api, people)
    sign_in(browser, people.secrets["vi"])
    html = browser.get("/ui/monitors/watch").text
    assert "On 20 labelled rows (classification)" in html
    assert '<td>accuracy</td><td class="metric">0.75</td>' in html
    assert "performance:accuracy over time" in html
