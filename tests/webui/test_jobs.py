"""The jobs pages in process, on SQLite and PostgreSQL: the queue and its live rows, filters
and pages, a job's page and state fragment, team scopes, cancelling as a member and as a
viewer, the log route's offsets over a real job's log, the allocation chart and the teams'
quotas and cost, hostile names and commands escaped, and bad values answering 400."""

from __future__ import annotations

import html
import re
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from fastapi.testclient import TestClient

from shamal.config import NodeSettings, PoolSettings, QuotaSettings, SchedulerSettings, Settings
from shamal.jobs import JobState
from shamal.scheduler.live import JobLifecycle
from shamal.server import Platform
from shamal.webui._jobs import LOG_CHUNK
from shamal.webui._jobs_usage import allocation
from tests.polling import wait_for
from tests.scheduler.live.test_lifecycle import _run as run
from tests.scheduler.live.test_lifecycle import local_loop
from tests.webui.conftest import csrf_of, sign_in

HOSTILE = '<img src=x onerror="window.__xss=1">'
JOB = {"command": ["true"], "cpus": 0.5, "memory_mib": 64}


@pytest.fixture
def settings(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Settings:
    """One priced pool of one declared node, and a quota for team red."""
    pool = PoolSettings(
        name="main",
        labels={"cost_per_cpu_hour": "3.6"},
        nodes=(NodeSettings(name="n1", cpus=8, memory_mib=16384),),
    )
    quota = QuotaSettings(team="red", pool="main", cpus=4, memory_mib=8192, borrow_cpus=2)
    home = tmp_path_factory.mktemp("home")
    return Settings(
        home=home,
        database_url=database_url,
        allowed_hosts=("*",),
        scheduler=SchedulerSettings(pools=(pool,), quotas=(quota,)),
    )


def _person(api: TestClient, user: str, team: str, role: str = "member") -> str:
    """A new account with ``role`` in ``team`` (made if new); its token's secret."""
    api.post("/api/v1/teams", json={"name": team})
    api.post("/api/v1/users", json={"name": user}).raise_for_status()
    api.put(f"/api/v1/teams/{team}/members/{user}", json={"role": role}).raise_for_status()
    answer = api.post("/api/v1/tokens", json={"name": "ui", "user": user})
    return str(answer.raise_for_status().json()["secret"])


def _submit(api: TestClient, secret: str, **fields: Any) -> dict[str, Any]:
    answer = api.post(
        "/api/v1/jobs", json={**JOB, **fields}, headers={"Authorization": f"Bearer {secret}"}
    )
    assert answer.status_code == 201, answer.text
    job: dict[str, Any] = answer.json()
    return job


def _ids(html: str) -> list[str]:
    """The ids of the job rows a page or fragment lists, in order."""
    return re.findall(r'class="job-link" href="/ui/jobs/([0-9a-f]{32})"', html)


def test_the_queue_lists_a_teams_jobs_live_filtered_and_paged(
    api: TestClient, browser: TestClient
) -> None:
    rita = _person(api, "rita", "red")
    bo = _person(api, "bo", "blue")
    theirs = _submit(api, bo, name="blue-job")
    mine = [_submit(api, rita, name=f"red-{i:02d}") for i in range(51)]
    newest = _submit(api, rita, name="newest", cpus=1.5, workers=2)  # no scheduler: queued
    api.post(f"/api/v1/jobs/{mine[0]['id']}/cancel").raise_for_status()
    sign_in(browser, rita)

    queue = browser.get("/ui/jobs")
    assert queue.status_code == 200
    shown = _ids(queue.text)
    assert len(shown) == 50
    assert shown[0] == newest["id"]  # newest first
    assert theirs["id"] not in queue.text
    assert "blue-job" not in queue.text
    assert "1.5 CPU, 64 MiB, x2 workers" in queue.text  # the resources asked
    assert 'data-live="/ui/jobs/fragment"' in queue.text
    assert "waiting for" in queue.text  # what a queued job waits for
    older = browser.get("/ui/jobs", params={"page_token": _next_token(queue.text)})
    assert _ids(older.text) == [mine[1]["id"], mine[0]["id"]]

    cancelled = browser.get("/ui/jobs", params={"state": "cancelled"})
    assert _ids(cancelled.text) == [mine[0]["id"]]
    assert 'data-live="/ui/jobs/fragment?state=cancelled"' in cancelled.text
    rows = browser.get("/ui/jobs/fragment", params={"state": "cancelled", "team": "red"})
    assert rows.status_code == 200
    assert rows.headers["cache-control"] == "no-store"
    assert "<html" not in rows.text
    assert _ids(rows.text) == [mine[0]["id"]]
    # The rows follow the server: a job cancelled since shows up in the next fragment.
    api.post(f"/api/v1/jobs/{mine[1]['id']}/cancel").raise_for_status()
    again = browser.get("/ui/jobs/fragment", params={"state": "cancelled", "team": "red"})
    assert _ids(again.text) == [mine[1]["id"], mine[0]["id"]]
    assert _ids(browser.get("/ui/jobs", params={"team": "blue"}).text) == []
    both = browser.get("/ui/jobs", params={"state": ["queued", "cancelled"], "team": "red"})
    assert len(_ids(both.text)) == 50


def _next_token(page: str) -> str:
    found = re.search(r'rel="next" href="/ui/jobs\?page_token=([^"]+)"', page)
    assert found is not None, "no next page"
    return unquote(html.unescape(found.group(1)))


def test_a_jobs_page_shows_its_facts_and_history_and_hides_it_from_other_teams(
    api: TestClient, browser: TestClient
) -> None:
    rita = _person(api, "rita", "red")
    bo = _person(api, "bo", "blue")
    job = _submit(api, rita, name=HOSTILE, command=["echo", HOSTILE, "javascript:alert(1)"])
    sign_in(browser, rita)
    page = browser.get(f"/ui/jobs/{job['id']}")
    assert page.status_code == 200
    assert HOSTILE not in page.text
    assert "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;" in page.text
    assert 'href="javascript:' not in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert f'data-live="/ui/jobs/{job["id"]}/state"' in page.text
    assert 'data-log="/ui/api/jobs/' in page.text
    assert 'src="/ui/static/job-log.js"' in page.text
    assert "<td>queued</td>" not in page.text  # the first event has no from-state
    assert "submitted" in page.text
    # A prefix of the id leads to the job's own address.
    short = browser.get(f"/ui/jobs/{job['id'][:10]}")
    assert (short.status_code, short.headers["location"]) == (303, f"/ui/jobs/{job['id']}")
    state = browser.get(f"/ui/jobs/{job['id']}/state")
    assert state.status_code == 200
    assert "x-shamal-final" not in state.headers  # queued: still followed
    assert "State history" in state.text
    assert HOSTILE not in browser.get("/ui/jobs").text

    sign_in(browser, bo)
    for path in ("", "/state"):
        hidden = browser.get(f"/ui/jobs/{job['id']}{path}")
        assert hidden.status_code == 404, path
        assert "echo" not in hidden.text
    log = browser.get(f"/ui/api/jobs/{job['id']}/log")
    assert (log.status_code, log.json()["error_code"]) == (404, "UI_ERROR")
    form = browser.get("/ui/jobs")
    refused = browser.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": csrf_of(form.text)})
    assert refused.status_code == 404
    assert api.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "queued"


def test_cancel_is_for_members_a_viewer_is_refused_and_a_form_needs_its_token(
    api: TestClient, browser: TestClient, platform: Platform
) -> None:
    rita = _person(api, "rita", "red")
    vic = _person(api, "vic", "red", role="viewer")
    job = _submit(api, rita, name="to-cancel")
    path = f"/ui/jobs/{job['id']}"

    sign_in(browser, vic)
    page = browser.get(path)
    assert page.status_code == 200
    assert "Cancel this job" not in page.text
    refused = browser.post(f"{path}/cancel", data={"csrf": csrf_of(page.text)})
    assert refused.status_code == 403
    assert api.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "queued"
    denied = [e for e in platform.audit.entries(limit=20) if e.action == "job.cancel"]
    assert [(e.actor, e.outcome) for e in denied] == [("vic", "permission_denied")]

    sign_in(browser, rita)
    page = browser.get(path)
    assert "Cancel this job" in page.text
    assert browser.post(f"{path}/cancel").status_code == 403  # no form token
    assert browser.post(f"{path}/cancel", data={"csrf": "forged"}).status_code == 403
    assert api.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "queued"
    done = browser.post(f"{path}/cancel", data={"csrf": csrf_of(page.text)})
    assert (done.status_code, done.headers["location"]) == (303, path)
    assert api.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "cancelled"
    after = browser.get(path)
    assert "cancelled by rita" in after.text
    assert "Cancel this job" not in after.text
    assert "data-live=" not in after.text  # an ended job is not followed
    assert 'data-done="1"' in after.text  # nor its (empty) log
    state = browser.get(f"{path}/state")
    assert state.headers["x-shamal-final"] == "1"
    again = browser.post(f"{path}/cancel", data={"csrf": csrf_of(after.text)})
    assert again.status_code == 409  # nothing left to cancel: a page, not a crash


def test_the_log_route_reads_a_real_jobs_log_by_offsets_until_done(
    api: TestClient, browser: TestClient, platform: Platform, tmp_path: Path
) -> None:
    rita = _person(api, "rita", "red")
    # Over one chunk of two-byte characters, with markup in it: read back whole and as text.
    script = "print('<b>start</b>'); [print('é' * 999) for _ in range(50)]; print('end')"
    job = _submit(api, rita, name="talker", command=[sys.executable, "-c", script])
    sign_in(browser, rita)
    url = f"/ui/api/jobs/{job['id']}/log"
    queued = browser.get(url).json()
    assert queued == {
        "text": "",
        "offset": 0,
        "attempt": 0,
        "done": False,
        "next_attempt": None,
        "more": False,
    }

    life = JobLifecycle(platform.db, platform.audit, "ui-test")
    loop = local_loop(platform, life, tmp_path / "jobs")

    def ended() -> bool:
        loop.tick()
        return api.get(f"/api/v1/jobs/{job['id']}").json()["state"] in ("succeeded", "failed")

    wait_for(ended, "the job to end", 60)
    assert api.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "succeeded"
    pieces: list[str] = []
    offset, answer = 0, {"done": False}
    for _ in range(10):
        answer = browser.get(url, params={"offset": offset}).json()
        assert answer["attempt"] == 1
        assert len(answer["text"].encode()) <= LOG_CHUNK
        assert answer["offset"] == offset + len(answer["text"].encode())
        assert answer["more"] is (len(answer["text"].encode()) > LOG_CHUNK - 4)  # a full piece
        pieces.append(answer["text"])
        offset = answer["offset"]
        if answer["done"]:
            break
    assert answer["done"] is True
    whole = "".join(pieces)
    expected = "<b>start</b>\n" + ("é" * 999 + "\n") * 50 + "end\n"
    assert whole[: len(expected)] == expected
    assert whole.endswith("attempt ended: succeeded (exit codes 0)\n")  # the executor's line
    assert len(pieces) >= 3  # 100 KB came in bounded pieces, the last one empty and done
    assert "\ufffd" not in "".join(pieces)  # no character cut in two
    odd = browser.get(url, params={"offset": 14}).json()  # inside a two-byte character
    assert odd["text"].startswith("\ufffd")
    page = browser.get(f"/ui/jobs/{job['id']}")
    assert "&lt;b&gt;start&lt;/b&gt;" in page.text  # the first part, rendered as text
    assert "<b>start</b>" not in page.text
    assert 'data-done="1"' not in page.text  # a whole log is more than the first part
    assert "data-live=" not in page.text
    assert "exited 0" in page.text
    assert "&lt; 0.01 (at its pool's prices)" in page.text  # main's CPUs have a price


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/ui/jobs", {"state": "sleeping"}),
        ("/ui/jobs", {"page_token": "not-a-token"}),
        ("/ui/jobs", {"team": "<script>"}),
        ("/ui/jobs/fragment", {"state": "x"}),
        ("/ui/jobs/usage", {"team": "a" * 65}),
        ("/ui/jobs/not-hex", {}),
        ("/ui/jobs/abc", {}),
        ("/ui/api/jobs/" + "a" * 32 + "/log", {"offset": "-1"}),
        ("/ui/api/jobs/" + "a" * 32 + "/log", {"attempt": "x"}),
    ],
)
def test_bad_values_answer_400(
    api: TestClient, browser: TestClient, admin_token: str, path: str, params: dict[str, str]
) -> None:
    sign_in(browser, admin_token)
    answer = browser.get(path, params=params)
    assert answer.status_code == 400, answer.text
    assert "Traceback" not in answer.text


def test_allocation_is_derived_from_the_jobs_start_and_finish(
    api: TestClient, platform: Platform, admin_token: str
) -> None:
    """Two CPUs held for the first half of one bucket and a GPU job for a whole bucket."""
    rita = _person(api, "rita", "red")
    cpu = platform.jobs.get(platform.security.authenticate(admin_token), _submit(api, rita)["id"])
    start = cpu.submitted_at
    held = replace(
        cpu,
        cpu_milli=2000,
        state=JobState.SUCCEEDED,
        started_at=start,
        finished_at=start + timedelta(minutes=7, seconds=30),
    )
    gpu = replace(held, gpus=1, cpu_milli=1000, finished_at=start + timedelta(minutes=15))
    never = replace(held, started_at=None, finished_at=None, state=JobState.QUEUED)
    found = allocation([held, gpu, never], start + timedelta(minutes=15), timedelta(minutes=30), 2)
    assert found.jobs == 2
    assert found.cpus == {"any pool": pytest.approx([0.0, 2.0])}
    assert found.gpus == {"any pool": pytest.approx([0.0, 1.0])}


def test_the_usage_and_teams_pages_show_quotas_held_resources_and_cost(
    api: TestClient, browser: TestClient, platform: Platform, admin_token: str
) -> None:
    rita = _person(api, "rita", "red")
    _person(api, "bo", "blue")
    job = _submit(api, rita, name="holder", cpus=2)
    life = JobLifecycle(platform.db, platform.audit, "ui-test")
    run(life, life.get(job["id"]))
    sign_in(browser, rita)
    teams = browser.get("/ui/teams")
    assert teams.status_code == 200
    assert ">red <span" in teams.text
    assert ">blue" not in teams.text
    assert "2 / 4 (+2)" in teams.text  # CPUs held / guaranteed (+borrow)
    assert "<dt>Jobs run</dt><dd>1 (1 attempt)</dd>" in teams.text  # its usage so far
    usage = browser.get("/ui/jobs/usage")
    assert usage.status_code == 200
    assert usage.text.count('<svg class="plot"') == 1  # CPUs; no GPU was held
    assert "No GPU was allocated" in usage.text
    assert "no history of allocation" in usage.text
    assert "1 of 1 jobs ran in the window" in usage.text
    sign_in(browser, admin_token)
    every = browser.get("/ui/teams")
    assert "Every team" in every.text
    assert ">red" in every.text
    assert ">blue" in every.text
    assert "No quota is configured for this team" in every.text  # blue has none
