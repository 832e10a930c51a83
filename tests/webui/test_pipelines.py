"""The pipelines pages in process, on SQLite and PostgreSQL: the list with triggers and last
run, a pipeline's runs, a run's DAG and steps table (live until the run ends) for a run
started through the API, team scopes, hostile text escaped and bad values answering 400."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shamal.jobs import JobState
from shamal.scheduler.live import JobLifecycle
from shamal.server import Platform
from tests.polling import wait_for
from tests.scheduler.live.test_lifecycle import _run as run_job
from tests.webui.conftest import sign_in

HOSTILE = '<img src=x onerror="window.__xss=1">'


def _person(api: TestClient, user: str, team: str, role: str = "member") -> str:
    api.post("/api/v1/teams", json={"name": team})
    api.post("/api/v1/users", json={"name": user}).raise_for_status()
    api.put(f"/api/v1/teams/{team}/members/{user}", json={"role": role}).raise_for_status()
    answer = api.post("/api/v1/tokens", json={"name": "ui", "user": user})
    return str(answer.raise_for_status().json()["secret"])


def _as(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


SPEC: dict[str, Any] = {
    "name": "flow",
    "team": "red",
    "description": HOSTILE,
    "params": {"rows": 10},
    "steps": [
        {"name": "prep", "command": ["echo", "prep"]},
        {"name": "train", "command": ["echo", HOSTILE], "after": ["prep"]},
        {"name": "report", "command": ["true"], "after": ["train"]},
    ],
    "triggers": [{"schedule": "0 3 * * *"}],
}


def _started_run(
    api: TestClient, secret: str, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    body = {"spec": spec or SPEC}
    registered = api.post("/api/v1/pipelines", json=body, headers=_as(secret))
    assert registered.status_code == 200, registered.text
    run = api.post("/api/v1/pipelines/flow/runs", json={"params": {}}, headers=_as(secret))
    assert run.status_code == 200, run.text
    started: dict[str, Any] = run.json()
    return started


def test_a_runs_dag_links_its_steps_jobs_and_follows_the_run_until_it_ends(
    api: TestClient, browser: TestClient
) -> None:
    rita = _person(api, "rita", "red")
    run = _started_run(api, rita)
    prep = next(s for s in run["steps"] if s["key"] == "prep")
    assert prep["job_id"]  # its job was submitted (and stays queued: no scheduler here)
    sign_in(browser, rita)

    listed = browser.get("/ui/pipelines")
    assert listed.status_code == 200
    assert 'href="/ui/pipelines/flow"' in listed.text
    assert "cron: 0 3 * * * (UTC)" in listed.text
    assert f'href="/ui/pipelines/runs/{run["id"]}"' in listed.text
    assert ">running<" in listed.text

    pipeline = browser.get("/ui/pipelines/flow")
    assert pipeline.status_code == 200
    assert HOSTILE not in pipeline.text
    assert "&lt;img src=x onerror=" in pipeline.text  # the description and a step's command
    assert '<svg class="graph"' in pipeline.text
    assert f'href="/ui/pipelines/runs/{run["id"]}"' in pipeline.text
    assert "started by rita" in pipeline.text

    page = browser.get(f"/ui/pipelines/runs/{run['id']}")
    assert page.status_code == 200
    assert HOSTILE not in page.text
    assert f'data-live="/ui/pipelines/runs/{run["id"]}/fragment"' in page.text
    svg = page.text[page.text.index('<svg class="graph"') : page.text.index("</svg>")]
    assert f'<a href="/ui/jobs/{prep["job_id"]}"><g class="node state-' in svg
    assert re.search(r'<g class="node state-waiting"><title>train · waiting', svg)
    assert svg.count('<path class="edge"') == 2  # prep -> train -> report
    assert f'class="job-link" href="/ui/jobs/{prep["job_id"]}"' in page.text
    assert browser.get(f"/ui/jobs/{prep['job_id']}").status_code == 200  # the link leads there

    live = browser.get(f"/ui/pipelines/runs/{run['id']}/fragment")
    assert live.status_code == 200
    assert "x-shamal-final" not in live.headers
    assert "<html" not in live.text
    assert '<svg class="graph"' in live.text
    api.post(f"/api/v1/pipeline-runs/{run['id']}/cancel", headers=_as(rita)).raise_for_status()
    ended = browser.get(f"/ui/pipelines/runs/{run['id']}/fragment")
    assert ended.headers["x-shamal-final"] == "1"
    assert "cancelled by rita" in ended.text
    assert "state-cancelled" in ended.text
    assert "data-live=" not in browser.get(f"/ui/pipelines/runs/{run['id']}").text
    only = browser.get("/ui/pipelines/flow", params={"state": "running"})
    assert "No runs in state running" in only.text


def test_another_teams_pipelines_and_runs_are_hidden(api: TestClient, browser: TestClient) -> None:
    rita = _person(api, "rita", "red")
    bo = _person(api, "bo", "blue")
    run = _started_run(api, rita)
    sign_in(browser, bo)
    listed = browser.get("/ui/pipelines")
    assert listed.status_code == 200
    assert "/ui/pipelines/flow" not in listed.text
    assert "No pipelines yet" in listed.text
    for path in (
        "/ui/pipelines/flow",
        f"/ui/pipelines/runs/{run['id']}",
        f"/ui/pipelines/runs/{run['id']}/fragment",
    ):
        hidden = browser.get(path)
        assert hidden.status_code == 404, path
        assert "echo" not in hidden.text


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/ui/pipelines/Bad%20Name", {}),
        ("/ui/pipelines/flow", {"state": "sleeping"}),
        ("/ui/pipelines/runs/not-a-run", {}),
        ("/ui/pipelines/runs/" + "a" * 31, {}),
        ("/ui/pipelines/runs/" + "g" * 32 + "/fragment", {}),
    ],
)
def test_bad_values_answer_400(
    browser: TestClient, admin_token: str, path: str, params: dict[str, str]
) -> None:
    sign_in(browser, admin_token)
    answer = browser.get(path, params=params)
    assert answer.status_code == 400, answer.text
    assert "Traceback" not in answer.text


def _finish_step_jobs(platform: Platform, run_id: str) -> bool:
    """Play the scheduler for a run's queued step jobs (admit, start, exit 0), as the jobs
    tests do, then let the pipeline move on; whether the run has ended."""
    life = JobLifecycle(platform.db, platform.audit, "ui-test")
    run = platform.pipelines.get_run(
        platform.security.authenticate(platform.admin_secret or ""), run_id
    )
    ids = [s.job_id for s in run.steps if s.job_id]
    for job in platform.jobs.jobs_of(ids).values():
        if job.state is JobState.QUEUED:
            life.ended(run_job(life, job), JobState.SUCCEEDED, reason="exited 0", exit_code=0)
    platform.pipelines.advance_all()
    return run.state != "running"


def test_a_finished_runs_steps_show_their_cache_hits_and_the_page_is_final(
    api: TestClient, browser: TestClient, platform: Platform
) -> None:
    """A run whose step jobs all succeed, then a second run whose steps all come from the
    cache: its DAG draws them cached and the table says whose result they reused."""
    rita = _person(api, "rita", "red")
    first = _started_run(api, rita)
    wait_for(lambda: _finish_step_jobs(platform, first["id"]), "the first run to end", 60)
    sign_in(browser, rita)
    done = browser.get(f"/ui/pipelines/runs/{first['id']}")
    assert '<span class="badge run-state succeeded">succeeded</span>' in done.text
    assert "data-live=" not in done.text
    assert done.text.count('<g class="node state-succeeded">') == 3
    final = browser.get(f"/ui/pipelines/runs/{first['id']}/fragment")
    assert final.headers["x-shamal-final"] == "1"

    again = api.post("/api/v1/pipelines/flow/runs", json={"params": {}}, headers=_as(rita))
    second = again.raise_for_status().json()
    page = browser.get(f"/ui/pipelines/runs/{second['id']}")
    assert page.text.count('<g class="node state-cached">') == 3
    assert page.text.count('<td class="value">hit: ') == 3
    assert "<td>—</td>" in page.text  # a cached step ran no job
