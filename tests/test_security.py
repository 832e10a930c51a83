"""Accounts, teams, roles and tokens through the API, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import stat
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from shamal.config import Settings
from shamal.db.models import ApiTokenRow
from shamal.security import (
    AuditContext,
    AuditLog,
    SecurityService,
    job_of_token_name,
    job_token_name,
)
from shamal.server import Platform


def _as(api: TestClient, secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _token_for(api: TestClient, user: str, **extra: object) -> str:
    response = api.post("/api/v1/tokens", json={"name": "t", "user": user, **extra})
    assert response.status_code == 201, response.text
    secret: str = response.json()["secret"]
    return secret


@pytest.fixture
def team_with_roles(api: TestClient) -> dict[str, str]:
    """Team 'vision' with one account per role, plus an outsider; returns name -> secret."""
    assert api.post("/api/v1/teams", json={"name": "vision"}).status_code == 201
    secrets = {}
    for name in ("ada", "max", "mia", "vic", "out"):
        assert api.post("/api/v1/users", json={"name": name}).status_code == 201
        secrets[name] = _token_for(api, name)
    for name, role in (
        ("ada", "admin"),
        ("max", "maintainer"),
        ("mia", "member"),
        ("vic", "viewer"),
    ):
        r = api.put(f"/api/v1/teams/vision/members/{name}", json={"role": role})
        assert r.status_code == 200, r.text
    return secrets


def test_first_start_writes_an_admin_token_0600(settings: Settings, platform: Platform) -> None:
    mode = stat.S_IMODE(settings.token_file.stat().st_mode)
    assert mode == 0o600
    assert settings.token_file.read_text().strip() == platform.admin_secret
    assert settings.host == "127.0.0.1"
    # A second start finds the admin and creates nothing.
    assert platform.security.bootstrap(settings.token_file) is None


def test_tokens_are_stored_hashed_and_shown_once(api: TestClient, platform: Platform) -> None:
    issued = api.post("/api/v1/tokens", json={"name": "laptop"}).json()
    secret = issued["secret"]
    with platform.db.unit_of_work(write=False) as s:
        row = s.scalar(select(ApiTokenRow).where(ApiTokenRow.id == issued["id"]))
        assert row is not None
        assert row.token_hash == hashlib.sha256(secret.encode()).hexdigest()
        dump = " ".join(str(v) for v in s.execute(text("SELECT * FROM api_tokens")).all())
    assert secret not in dump
    listed = api.get("/api/v1/tokens").json()
    assert all("secret" not in t for t in listed)
    assert api.get("/api/v1/whoami", headers=_as(api, secret)).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic YWRtaW46cGFzc3dvcmQxMjM0",
        "Bearer shm_short",
        "Token shm_" + "a" * 43,
        "Bearer shm_" + "a" * 43,
        "Bearer  shm_" + "b" * 43 + " x",
    ],
)
def test_bad_credentials_get_401(api: TestClient, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    client = TestClient(api.app, raise_server_exceptions=False)
    response = client.get("/api/v1/whoami", headers=headers)
    assert response.status_code == 401
    assert response.json()["error_code"] == "UNAUTHENTICATED"
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_revoked_expired_and_disabled_tokens_stop_working(
    api: TestClient, platform: Platform
) -> None:
    api.post("/api/v1/users", json={"name": "bob"})
    secret = _token_for(api, "bob")
    token_id = next(
        t["id"] for t in api.get("/api/v1/tokens?all=true").json() if t["user"] == "bob"
    )
    assert api.get("/api/v1/whoami", headers=_as(api, secret)).status_code == 200
    assert api.delete(f"/api/v1/tokens/{token_id}").status_code == 200
    assert api.get("/api/v1/whoami", headers=_as(api, secret)).status_code == 401

    # Expiry, with a clock that moves past it.
    later = [datetime.now(UTC)]
    clocked = SecurityService(platform.db, platform.audit, clock=lambda: later[0])
    secret2 = _token_for(api, "bob", expires_in_s=60)
    assert clocked.authenticate(secret2).name == "bob"
    later[0] += timedelta(seconds=61)
    with pytest.raises(Exception, match="expired"):
        clocked.authenticate(secret2)

    secret3 = _token_for(api, "bob")
    assert api.post("/api/v1/users/bob/disable").status_code == 200
    assert api.get("/api/v1/whoami", headers=_as(api, secret3)).status_code == 401
    assert api.post("/api/v1/users/bob/enable").status_code == 200
    assert api.get("/api/v1/whoami", headers=_as(api, secret3)).status_code == 200


def test_roles_give_403_inside_the_team_and_404_outside(
    api: TestClient, team_with_roles: dict[str, str]
) -> None:
    s = team_with_roles
    for who in ("ada", "max", "mia", "vic"):
        assert api.get("/api/v1/teams/vision", headers=_as(api, s[who])).status_code == 200
    assert api.get("/api/v1/teams/vision", headers=_as(api, s["out"])).status_code == 404
    # A missing team and a foreign team look the same to outsiders.
    assert api.get("/api/v1/teams/nope", headers=_as(api, s["out"])).status_code == 404
    assert api.get("/api/v1/teams", headers=_as(api, s["out"])).json() == []
    # Managing members needs the team's admin role.
    body = {"role": "viewer"}
    assert (
        api.put(
            "/api/v1/teams/vision/members/out", json=body, headers=_as(api, s["max"])
        ).status_code
        == 403
    )
    assert (
        api.put(
            "/api/v1/teams/vision/members/out", json=body, headers=_as(api, s["vic"])
        ).status_code
        == 403
    )
    assert (
        api.put(
            "/api/v1/teams/vision/members/out", json=body, headers=_as(api, s["out"])
        ).status_code
        == 404
    )
    invited = api.put("/api/v1/teams/vision/members/out", json=body, headers=_as(api, s["ada"]))
    assert (invited.status_code, invited.json()["status"]) == (202, "invited")
    accepted = api.post("/api/v1/invitations/vision/accept", headers=_as(api, s["out"]))
    assert accepted.status_code == 200, accepted.text
    # Platform-admin actions are 403 for everybody else.
    assert (
        api.post("/api/v1/teams", json={"name": "x"}, headers=_as(api, s["ada"])).status_code == 403
    )
    assert api.get("/api/v1/users", headers=_as(api, s["mia"])).status_code == 403
    assert api.get("/api/v1/audit", headers=_as(api, s["mia"])).status_code == 403
    # Teams list shows only one's own teams.
    names = [t["name"] for t in api.get("/api/v1/teams", headers=_as(api, s["mia"])).json()]
    assert names == ["vision"]
    assert [t["name"] for t in api.get("/api/v1/teams", headers=_as(api, s["out"])).json()] == [
        "vision"
    ]  # out was invited as a viewer above, and accepted


def test_a_team_admin_invites_and_the_account_consents(
    api: TestClient, platform: Platform, team_with_roles: dict[str, str]
) -> None:
    """A team admin cannot put an account in a team (its jobs, costs and audit trail would
    act in that account's name): the account is invited and joins only when it accepts."""
    s = team_with_roles
    ada, out = _as(api, s["ada"]), _as(api, s["out"])
    invited = api.put("/api/v1/teams/vision/members/out", json={"role": "member"}, headers=ada)
    assert (invited.status_code, invited.json()) == (
        202,
        {"user": "out", "role": "member", "status": "invited"},
    )
    assert api.get("/api/v1/whoami", headers=out).json()["teams"] == {}
    members = [m["user"] for m in api.get("/api/v1/teams/vision").json()["members"]]
    assert "out" not in members
    pending = api.get("/api/v1/invitations", headers=out).json()
    assert [(i["team"], i["role"], i["invited_by"]) for i in pending] == [
        ("vision", "member", "ada")
    ]
    assert api.get("/api/v1/invitations", headers=_as(api, s["mia"])).json() == []
    # Nobody else can accept it for the account, nor accept what was never offered.
    assert (
        api.post("/api/v1/invitations/vision/accept", headers=_as(api, s["mia"])).status_code == 404
    )
    job_token = platform.security.issue_job_token("out", "job-x-1", timedelta(hours=1))
    by_job = api.post("/api/v1/invitations/vision/accept", headers=_as(api, job_token.secret))
    assert by_job.status_code == 403
    joined = api.post("/api/v1/invitations/vision/accept", headers=out)
    assert (joined.status_code, joined.json()["role"]) == (200, "member")
    assert api.get("/api/v1/whoami", headers=out).json()["teams"] == {"vision": "member"}
    assert api.get("/api/v1/invitations", headers=out).json() == []
    assert api.post("/api/v1/invitations/vision/accept", headers=out).status_code == 404
    # A member's role changes at once; a platform admin adds without asking.
    promoted = api.put("/api/v1/teams/vision/members/out", json={"role": "viewer"}, headers=ada)
    assert (promoted.status_code, promoted.json()["status"]) == (200, "member")
    api.post("/api/v1/users", json={"name": "zoe"})
    added = api.put("/api/v1/teams/vision/members/zoe", json={"role": "viewer"})
    assert (added.status_code, added.json()["status"]) == (200, "member")
    # Declining drops the invitation and joins nothing.
    api.post("/api/v1/users", json={"name": "yan"})
    yan = _as(api, _token_for(api, "yan"))
    api.put("/api/v1/teams/vision/members/yan", json={"role": "admin"}, headers=ada)
    assert api.delete("/api/v1/invitations/vision", headers=yan).status_code == 204
    assert api.post("/api/v1/invitations/vision/accept", headers=yan).status_code == 404
    assert api.get("/api/v1/whoami", headers=yan).json()["teams"] == {}
    actions = [e.action for e in platform.audit.entries(limit=30)]
    assert {"team.invitation.accept", "team.invitation.decline"} <= set(actions)


def test_tokens_are_private_to_their_owner(
    api: TestClient, team_with_roles: dict[str, str]
) -> None:
    s = team_with_roles
    mine = api.post("/api/v1/tokens", json={"name": "mine"}, headers=_as(api, s["mia"])).json()
    # Not for somebody else, not visible to them, not revocable by them.
    assert (
        api.post(
            "/api/v1/tokens", json={"name": "x", "user": "ada"}, headers=_as(api, s["mia"])
        ).status_code
        == 403
    )
    assert api.get("/api/v1/tokens?all=true", headers=_as(api, s["mia"])).status_code == 403
    theirs = [t["id"] for t in api.get("/api/v1/tokens", headers=_as(api, s["vic"])).json()]
    assert mine["id"] not in theirs
    assert api.delete(f"/api/v1/tokens/{mine['id']}", headers=_as(api, s["vic"])).status_code == 404
    assert api.get("/api/v1/whoami", headers=_as(api, mine["secret"])).status_code == 200


def test_self_escalation_is_impossible(api: TestClient, team_with_roles: dict[str, str]) -> None:
    s = team_with_roles
    # Unknown fields are rejected, not ignored.
    r = api.post("/api/v1/users", json={"name": "mia2", "is_admin": True, "role": "admin"})
    assert r.status_code == 400
    assert (
        api.post(
            "/api/v1/users", json={"name": "evil", "is_admin": True}, headers=_as(api, s["mia"])
        ).status_code
        == 403
    )
    assert (
        api.put(
            "/api/v1/teams/vision/members/mia", json={"role": "admin"}, headers=_as(api, s["mia"])
        ).status_code
        == 403
    )
    who = api.get("/api/v1/whoami", headers=_as(api, s["mia"])).json()
    assert who["user"]["is_admin"] is False
    assert who["teams"] == {"vision": "member"}


def test_job_tokens_act_as_their_user_without_admin_or_account_power(
    api: TestClient, platform: Platform, team_with_roles: dict[str, str]
) -> None:
    """What the scheduler hands a job attempt: the submitter's access, but no admin action
    (even for an admin's job), no token, account or team management; revoked by name."""
    admins = platform.security.issue_job_token("admin", "job-abc-1", timedelta(hours=1))
    adas = platform.security.issue_job_token("ada", "job-abc-1", timedelta(hours=1))
    assert (admins.token.scope, adas.token.scope) == ("job", "job")
    who = api.get("/api/v1/whoami", headers=_as(api, admins.secret)).json()
    assert (who["user"]["name"], who["user"]["is_admin"], who["scope"]) == ("admin", True, "job")
    who = api.get("/api/v1/whoami", headers=_as(api, adas.secret)).json()
    assert who["teams"] == {"vision": "admin"}  # team roles are the submitter's
    refused = [
        api.post("/api/v1/tokens", json={"name": "escape"}, headers=_as(api, adas.secret)),
        api.post("/api/v1/users", json={"name": "x"}, headers=_as(api, admins.secret)),
        api.post("/api/v1/teams", json={"name": "x"}, headers=_as(api, admins.secret)),
        api.get("/api/v1/users", headers=_as(api, admins.secret)),
        api.put(
            "/api/v1/teams/vision/members/out",
            json={"role": "viewer"},
            headers=_as(api, adas.secret),
        ),
        api.delete("/api/v1/teams/vision/members/mia", headers=_as(api, adas.secret)),
        api.delete(f"/api/v1/tokens/{adas.token.id}", headers=_as(api, adas.secret)),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused), [r.text for r in refused]
    assert "use your own token" in refused[0].json()["message"]
    # Reads still work: the job acts as its user (an admin's job sees what its admin sees).
    assert api.get("/api/v1/teams/vision", headers=_as(api, adas.secret)).status_code == 200
    assert api.get("/api/v1/teams/vision", headers=_as(api, admins.secret)).status_code == 200
    # An own token of the same name is not a job token: revoking by name leaves it alone.
    own = _token_for(api, "ada", name="job-abc-1")
    assert platform.security.revoke_job_tokens("ada", "job-abc-1") == 1
    assert platform.security.revoke_job_tokens("ada", "job-abc-1") == 0  # idempotent
    assert api.get("/api/v1/whoami", headers=_as(api, adas.secret)).status_code == 401
    assert api.get("/api/v1/whoami", headers=_as(api, own)).status_code == 200
    assert api.get("/api/v1/whoami", headers=_as(api, admins.secret)).status_code == 200
    listed = {t["id"]: t for t in api.get("/api/v1/tokens", params={"all": True}).json()}
    assert listed[adas.token.id]["scope"] == "job"
    assert listed[adas.token.id]["revoked_at"] is not None


def test_a_job_token_names_its_job_and_no_other_token_does(platform: Platform) -> None:
    """The job a principal acts for comes from the stored name of a token of scope ``job``
    (which only the scheduler issues), never from a name anyone may give their own token."""
    job_id = uuid.uuid4().hex
    name = job_token_name(job_id, 2)
    assert name == f"job-{job_id[:12]}-2"
    assert job_of_token_name(name) == job_id[:12]
    for other in (
        "job-abc-1",
        f"job-{job_id[:12]}-",
        f"job-{job_id[:13]}-1",
        f"job-{job_id[:12].upper()}-1",
        f"xjob-{job_id[:12]}-1",
        f"job-{job_id[:12]}-1-x",
    ):
        assert job_of_token_name(other) is None, other
    security = platform.security
    issued = security.issue_job_token("admin", name, timedelta(hours=1))
    principal = security.authenticate(issued.secret)
    assert (principal.scope, principal.job) == ("job", job_id[:12])
    assert security.cached_principal(issued.secret) == principal
    # Another process (an empty cache) reads the same from the database.
    elsewhere = SecurityService(platform.db, platform.audit)
    assert elsewhere.authenticate(issued.secret).job == job_id[:12]
    # The person's own token of the very same name acts for no job.
    admin = security.authenticate(platform.admin_secret or "")
    assert admin.job is None
    own = security.create_token(AuditContext("token.create", "admin", admin), name, None)
    mine = security.authenticate(own.secret)
    assert (mine.scope, mine.job) == ("full", None)
    assert elsewhere.authenticate(own.secret).job is None
    # A job token whose name is not a job's (none the scheduler makes) names no job either.
    odd = security.issue_job_token("admin", "job-abc-1", timedelta(hours=1))
    assert security.authenticate(odd.secret).job is None
    assert security.principal_of("admin").job is None


def test_what_a_job_changes_is_audited_with_the_job(platform: Platform) -> None:
    """The actor is the person a job acts for; the entry names the job that acted, and an
    entry made with the person's own token names none."""
    security = platform.security
    job_id = uuid.uuid4().hex
    issued = security.issue_job_token("admin", job_token_name(job_id, 1), timedelta(hours=1))
    as_job = AuditContext("team.create", "admin", security.authenticate(issued.secret))
    with platform.db.unit_of_work() as s:
        by_job = platform.audit.record(s, as_job, "team:x", note="made")
    assert (by_job.actor, dict(by_job.detail)) == ("admin", {"note": "made", "job": job_id[:12]})
    admin = security.authenticate(platform.admin_secret or "")
    refused = AuditContext("team.create", "admin", admin, target="team:y")
    platform.audit.record_outcome(refused, "denied")
    (entry,) = [e for e in platform.audit.entries(limit=10) if e.target == "team:y"]
    assert "job" not in entry.detail


def test_admin_cannot_lock_themselves_out(api: TestClient) -> None:
    r = api.post("/api/v1/users/admin/disable")
    assert (r.status_code, r.json()["error_code"]) == (409, "INVALID_STATE")
    assert api.get("/api/v1/whoami").status_code == 200


def test_audit_key_is_kept_outside_the_database(settings: Settings, platform: Platform) -> None:
    key_file = settings.keys_dir / "audit.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    with platform.db.unit_of_work(write=False) as s:
        dump = str(s.execute(text("SELECT * FROM audit_log")).all())
    assert key_file.read_text().strip() not in dump
    assert isinstance(platform.audit, AuditLog)


def test_concurrent_first_starts_agree_on_one_audit_key(tmp_path: pytest.TempPathFactory) -> None:
    import threading

    from shamal.security import load_or_create_key

    path = tmp_path / "keys" / "audit.key"  # type: ignore[operator]
    barrier = threading.Barrier(8)
    keys: list[bytes] = []

    def start() -> None:
        barrier.wait(timeout=10)
        keys.append(load_or_create_key(path, None))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(keys) == 8
    assert len(set(keys)) == 1
    assert bytes.fromhex(path.read_text().strip()) == keys[0]
    assert [p.name for p in path.parent.iterdir()] == ["audit.key"]  # no temp files left


def test_another_process_sees_a_revocation_within_the_cache_window(
    api: TestClient, platform: Platform
) -> None:
    from shamal.security import AuditContext
    from shamal.security._service import PRINCIPAL_CACHE_TTL

    now = [datetime.now(UTC)]
    here = SecurityService(platform.db, platform.audit, clock=lambda: now[0])
    there = SecurityService(platform.db, platform.audit, clock=lambda: now[0])
    api.post("/api/v1/users", json={"name": "carl"})
    issued = api.post("/api/v1/tokens", json={"name": "t", "user": "carl"}).json()
    assert here.authenticate(issued["secret"]).name == "carl"  # now cached here
    admin = there.authenticate(platform.admin_secret or "")
    there.revoke_token(AuditContext("token.revoke", "admin", admin), issued["id"])
    with pytest.raises(Exception, match="revoked"):
        there.authenticate(issued["secret"])  # the revoking process forgets at once
    assert here.authenticate(issued["secret"]).name == "carl"  # still inside the window
    now[0] += PRINCIPAL_CACHE_TTL
    with pytest.raises(Exception, match="revoked"):
        here.authenticate(issued["secret"])  # never longer than the window
