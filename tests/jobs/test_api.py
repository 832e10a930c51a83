"""Jobs through the native API: submit, list, show, events, cancel, snapshots, tenancy."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from shamal.clock import utc_now
from shamal.errors import Conflict
from shamal.jobs import JobSpec, JobState, snapshot
from shamal.jobs._entities import Job
from shamal.jobs._service import JobService
from shamal.scheduler.live import JobLifecycle, effective_settings
from shamal.security import AuditContext
from shamal.server import create_app
from shamal.server._platform import Platform
from tests.scheduler.live.test_lifecycle import _run, _submit

JOB = {"command": ["python", "-c", "print('hi')"], "cpus": 0.5, "memory_mib": 256}


def _team_member(api: TestClient, team: str, user: str, role: str = "member") -> dict[str, str]:
    api.post("/api/v1/teams", json={"name": team})
    api.post("/api/v1/users", json={"name": user})
    api.put(f"/api/v1/teams/{team}/members/{user}", json={"role": role})
    token = api.post("/api/v1/tokens", json={"user": user, "name": "t"}).json()["secret"]
    return {"Authorization": f"Bearer {token}"}


def test_submit_list_show_events_and_cancel(api: TestClient, platform: Platform) -> None:
    created = api.post("/api/v1/jobs", json={**JOB, "name": "hello", "time_limit_s": 60})
    assert created.status_code == 201, created.text
    job = created.json()
    assert (job["state"], job["name"], job["cpus"], job["memory_mib"]) == (
        "queued",
        "hello",
        0.5,
        256,
    )
    assert (job["priority"], job["attempt"], job["time_limit_s"]) == ("normal", 0, 60.0)
    listed = api.get("/api/v1/jobs", params={"state": "queued"}).json()
    assert [j["id"] for j in listed] == [job["id"]]
    assert api.get("/api/v1/jobs", params={"state": "running"}).json() == []
    by_prefix = api.get(f"/api/v1/jobs/{job['id'][:8]}")
    assert by_prefix.json()["id"] == job["id"]
    cancelled = api.post(f"/api/v1/jobs/{job['id']}/cancel").json()
    assert (cancelled["state"], cancelled["finished_at"] is not None) == ("cancelled", True)
    events = api.get(f"/api/v1/jobs/{job['id']}/events").json()
    assert [(e["from_state"], e["to_state"]) for e in events] == [
        (None, "queued"),
        ("queued", "cancelled"),
    ]
    again = api.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert (again.status_code, again.json()["error_code"]) == (409, "INVALID_STATE")
    actions = [e.action for e in platform.audit.entries(limit=10)]
    assert "job.submit" in actions
    assert "job.cancel" in actions


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"command": []}, ""),
        ({"cpus": 0}, ""),
        ({"gpus": 1, "gpu_fraction": 0.5}, "not several"),
        ({"mig_profile": "big"}, "a MIG profile is written like 1g.10gb or 3g.40gb"),
        ({"env": {"SHAMAL_TOKEN": "x"}}, "starting with SHAMAL_, and MLFLOW_TRACKING_TOKEN"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "are set by the platform and cannot be"),
        ({"env": {"1BAD": "x"}}, "is not an environment variable name: use letters"),
        ({"pool": "nowhere"}, "no pool named"),
        ({"priority": "urgent"}, "no priority class"),
        ({"command": ["a\x00b"]}, "command"),
        ({"time_limit_s": -1}, ""),
        (
            {"executor": "ray"},
            """runs jobs on the executor(s) 'local' (default 'local'), not 'ray'""",
        ),
        ({"executor": "ray"}, """SHAMAL_SCHEDULER__EXECUTORS='["ray"]'"""),
        ({"executor": "slurm"}, ""),
    ],
)
def test_invalid_submissions_are_refused_and_store_nothing(
    api: TestClient, change: dict[str, object], message: str
) -> None:
    response = api.post("/api/v1/jobs", json={**JOB, **change})
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert message in response.json()["message"]
    assert "should match pattern" not in response.json()["message"]
    assert api.get("/api/v1/jobs").json() == []


def test_teams_see_only_their_jobs_and_priorities_need_a_role(api: TestClient) -> None:
    red = _team_member(api, "red", "rita")
    blue = _team_member(api, "blue", "bo")
    mine = api.post("/api/v1/jobs", json=JOB, headers=red)
    assert (mine.status_code, mine.json()["team"]) == (201, "red")  # the only team: default
    job_id = mine.json()["id"]
    assert api.get(f"/api/v1/jobs/{job_id}", headers=blue).status_code == 404
    assert api.get("/api/v1/jobs", headers=blue).json() == []
    assert api.post(f"/api/v1/jobs/{job_id}/cancel", headers=blue).status_code == 404
    other = api.post("/api/v1/jobs", json={**JOB, "team": "red"}, headers=blue)
    assert other.status_code == 404
    high = api.post("/api/v1/jobs", json={**JOB, "priority": "high"}, headers=red)
    assert (high.status_code, high.json()["error_code"]) == (403, "PERMISSION_DENIED")
    low = api.post("/api/v1/jobs", json={**JOB, "priority": "low"}, headers=red)
    assert low.status_code == 201
    preempt = api.post(f"/api/v1/jobs/{job_id}/preempt", headers=red)
    assert preempt.status_code == 403  # admins only
    assert [j["id"] for j in api.get("/api/v1/jobs", params={"team": "red"}).json()] == [
        low.json()["id"],
        job_id,
    ]


def test_snapshot_upload_is_checked_and_deduplicated(api: TestClient, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('train')\n")
    built = snapshot.build(tmp_path)
    data = built.path.read_bytes()
    built.path.unlink()
    url = f"/api/v1/snapshots/{built.digest}"
    assert api.get(url).status_code == 404
    wrong = api.put(f"/api/v1/snapshots/{'a' * 64}", content=data)
    assert (wrong.status_code, "do not match" in wrong.json()["message"]) == (400, True)
    assert api.put(url, content=data).status_code == 201
    assert api.get(url).status_code == 200
    job = api.post("/api/v1/jobs", json={**JOB, "snapshot": built.digest})
    assert (job.status_code, job.json()["snapshot"]) == (201, built.digest)


def test_only_who_may_submit_a_job_may_upload_its_code(api: TestClient, tmp_path: Path) -> None:
    """A viewer, or an account in no team, can submit no job: its snapshot uploads (up to
    1 GiB each) are refused before a byte is stored."""
    (tmp_path / "train.py").write_text("print('train')\n")
    built = snapshot.build(tmp_path)
    data = built.path.read_bytes()
    url = f"/api/v1/snapshots/{built.digest}"
    viewer = _team_member(api, "vision", "vic", role="viewer")
    api.post("/api/v1/users", json={"name": "loner"})
    secret = api.post("/api/v1/tokens", json={"user": "loner", "name": "t"}).json()["secret"]
    for headers in (viewer, {"Authorization": f"Bearer {secret}"}):
        refused = api.put(url, content=data, headers=headers)
        assert (refused.status_code, refused.json()["error_code"]) == (403, "PERMISSION_DENIED")
        assert "member role in a team" in refused.json()["message"]
    assert api.get(url).status_code == 404
    member = _team_member(api, "vision", "mia")
    assert api.put(url, content=data, headers=member).status_code == 201


def _archive(member: tarfile.TarInfo, payload: bytes = b"") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.addfile(member, io.BytesIO(payload) if payload else None)
    return out.getvalue()


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    "member",
    [
        _link("evil", "/etc/passwd", tarfile.SYMTYPE),
        _link("hard", "/etc/passwd", tarfile.LNKTYPE),
        tarfile.TarInfo("../escape.py"),
        tarfile.TarInfo("/abs.py"),
        _link("dev", "", tarfile.CHRTYPE),
        tarfile.TarInfo("a/../../x.py"),
    ],
    ids=["symlink", "hardlink", "dotdot", "absolute", "device", "nested-dotdot"],
)
def test_hostile_snapshots_are_refused(api: TestClient, member: tarfile.TarInfo) -> None:
    payload = b"x" if member.isfile() else b""
    member.size = len(payload)
    data = _archive(member, payload)
    digest = hashlib.sha256(data).hexdigest()
    response = api.put(f"/api/v1/snapshots/{digest}", content=data)
    assert response.status_code == 400, response.text
    assert api.get(f"/api/v1/snapshots/{digest}").status_code == 404


def test_not_an_archive_is_refused(api: TestClient) -> None:
    data = b"this is not a tarball"
    response = api.put(f"/api/v1/snapshots/{hashlib.sha256(data).hexdigest()}", content=data)
    assert (response.status_code, "not a readable" in response.json()["message"]) == (400, True)


def test_cost_report_needs_a_valid_period(api: TestClient) -> None:
    assert api.get("/api/v1/cost", params={"since": "2026-01-01T00:00:00Z"}).json() == []
    bad = api.get("/api/v1/cost", params={"since": "2099-01-01T00:00:00Z"})
    assert bad.status_code == 400
    assert api.get("/api/v1/cost", params={"since": "yesterday"}).status_code == 400
    assert api.get("/api/v1/cost", params={"since": "2026-01-01", "by": "x"}).status_code == 400


def test_query_parameters_are_strict(api: TestClient) -> None:
    typo = api.get("/api/v1/jobs", params={"stat": "queued"})
    assert (typo.status_code, "unknown query parameter 'stat'" in typo.json()["message"]) == (
        400,
        True,
    )
    twice = api.get("/api/v1/jobs?team=a&team=b")
    assert (twice.status_code, "only once" in twice.json()["message"]) == (400, True)
    many = api.get("/api/v1/jobs?state=queued&state=running")
    assert many.status_code == 200  # a list parameter may repeat


def _running(platform: Platform, job_id: str) -> None:
    """Admit and start a job as a scheduler would (no scheduler runs in these tests)."""
    life = JobLifecycle(platform.db, platform.audit, "test-scheduler")
    _run(life, life.get(job_id))


def test_cancel_and_preempt_answer_what_the_job_waits_for_as_show_does(
    api: TestClient, platform: Platform
) -> None:
    queued = api.post("/api/v1/jobs", json=JOB).json()
    assert queued["waiting"] is not None  # a queued job waits for something
    cancelled = api.post(f"/api/v1/jobs/{queued['id']}/cancel").json()
    shown = api.get(f"/api/v1/jobs/{queued['id']}").json()
    assert (cancelled["state"], cancelled["waiting"], shown["waiting"]) == ("cancelled", None, None)

    job_id = api.post("/api/v1/jobs", json=JOB).json()["id"]
    _running(platform, job_id)
    stopping = api.post(f"/api/v1/jobs/{job_id}/cancel").json()
    assert (stopping["state"], stopping["stop_request"], stopping["waiting"]) == (
        "running",
        "cancel",
        None,
    )

    job_id = api.post("/api/v1/jobs", json=JOB).json()["id"]
    _running(platform, job_id)
    preempting = api.post(f"/api/v1/jobs/{job_id}/preempt")
    assert preempting.status_code == 200, preempting.text
    answer = preempting.json()
    assert (answer["state"], answer["stop_request"], answer["waiting"]) == (
        "running",
        "preempt",
        None,  # it still runs: its scheduler requeues it after the grace period
    )
    life = JobLifecycle(platform.db, platform.audit, "test-scheduler")
    requeued = life.ended(life.get(job_id), JobState.PREEMPTED, reason="preempted by an admin")
    assert requeued is not None
    assert requeued.state is JobState.QUEUED
    shown = api.get(f"/api/v1/jobs/{job_id}").json()
    assert shown["waiting"].startswith("waiting for")  # requeued: it waits again
    again = api.post(f"/api/v1/jobs/{job_id}/preempt")
    assert (again.status_code, again.json()["error_code"]) == (409, "INVALID_STATE")
    assert "is queued: only running jobs preempt" in again.json()["message"]


def test_a_preempt_racing_the_schedulers_requeue_never_cancels_the_job(
    platform: Platform,
) -> None:
    """The scheduler requeues the job while an admin's preempt is in flight: here when the
    service reads its clock, after it read the job (running) and before it writes."""
    job_id = _submit(platform).id
    _running(platform, job_id)
    life = JobLifecycle(platform.db, platform.audit, "test-scheduler")
    requeued: list[Job | None] = []

    def clock() -> datetime:
        if not requeued:
            requeued.append(life.ended(life.get(job_id), JobState.PREEMPTED, reason="priority"))
        return utc_now()

    scheduler = platform.settings.scheduler
    jobs = JobService(
        platform.db,
        platform.audit,
        platform.security,
        platform.artifacts,
        effective_settings(scheduler),
        platform.cluster,
        clock,
    )
    admin = platform.security.authenticate(platform.admin_secret or "")
    ctx = AuditContext(action="job.preempt", actor=admin.name, principal=admin)

    def preempt() -> Job | Conflict:
        try:
            return jobs.preempt(ctx, job_id)
        except Conflict as exc:
            return exc

    outcome = preempt()
    job = life.get(job_id)
    assert job.state is not JobState.CANCELLED
    if isinstance(outcome, Conflict) or requeued:
        # Requeued before the request landed: it waits in the queue, untouched.
        assert "only running jobs preempt" in getattr(outcome, "message", "")
        assert (job.state, job.stop_request, job.reason) == (
            JobState.QUEUED,
            None,
            "requeued after preemption",
        )
    else:
        assert (job.state, job.stop_request) == (JobState.RUNNING, "preempt")


def _guarded_api(
    platform: Platform, token: str, request_limit: int, upload_limit: int
) -> TestClient:
    settings = platform.settings.model_copy(
        update={"max_request_bytes": request_limit, "max_upload_bytes": upload_limit}
    )
    client = TestClient(create_app(settings, platform), raise_server_exceptions=False)
    client.headers["Authorization"] = f"Bearer {token}"
    return client


def test_a_snapshot_may_be_larger_than_a_request_but_not_than_an_upload(
    platform: Platform, admin_token: str, tmp_path: Path
) -> None:
    """Snapshots stream to disk like artifacts: the JSON request limit does not apply to them
    (the 16 MiB default refused every folder with a little data), the upload limit does."""
    sizes = {}
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "train.py").write_text(f"print({name!r})\n")
        (folder / "weights.bin").write_bytes(random.randbytes(64 * 1024))  # incompressible
        built = snapshot.build(folder)
        sizes[name] = (built.digest, built.path.read_bytes())
    digest, data = sizes["first"]
    roomy = _guarded_api(platform, admin_token, 4096, len(data) + 1024)
    assert roomy.put(f"/api/v1/snapshots/{digest}", content=data).status_code == 201
    assert roomy.get(f"/api/v1/snapshots/{digest}").json()["size"] == len(data)
    too_big = b'{"name": "' + b"x" * 5000 + b'"}'  # other routes keep the request limit
    assert roomy.post("/api/v1/teams", content=too_big).status_code == 413
    digest, data = sizes["second"]
    tight = _guarded_api(platform, admin_token, 4096, len(data) - 1024)
    refused = tight.put(f"/api/v1/snapshots/{digest}", content=data)
    assert (refused.status_code, refused.json()["error_code"]) == (413, "REQUEST_TOO_LARGE")
    assert tight.get(f"/api/v1/snapshots/{digest}").status_code == 404


def test_a_job_names_its_executor_among_those_the_server_runs(
    api: TestClient, platform: Platform
) -> None:
    default = api.post("/api/v1/jobs", json=JOB).json()
    local = api.post("/api/v1/jobs", json={**JOB, "executor": "local"}).json()
    assert (default["executor"], local["executor"]) == (None, "local")
    assert api.get(f"/api/v1/jobs/{local['id']}").json()["executor"] == "local"
    # A server that runs Ray beside the default takes a job naming it, and stores the name.
    both = platform.settings.scheduler.model_copy(update={"executors": ("ray",)})
    jobs = JobService(
        platform.db, platform.audit, platform.security, platform.artifacts, both, platform.cluster
    )
    admin = platform.security.authenticate(platform.admin_secret or "")
    ctx = AuditContext(action="job.submit", actor=admin.name, principal=admin)
    on_ray = jobs.submit(ctx, JobSpec(command=("true",), cpus=0.5, memory_mib=64, executor="ray"))
    assert platform.jobs.get(admin, on_ray.id).executor == "ray"
    assert api.get(f"/api/v1/jobs/{on_ray.id}").json()["executor"] == "ray"
