"""The audit log: every change recorded, and every tampering with it caught."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from typer.testing import CliRunner

from shamal.cli import app as cli_app
from shamal.config import Settings
from shamal.security import AuditLog
from shamal.server import Platform
from shamal.server._platform import start_platform


def _fill(api: TestClient) -> None:
    """A few audited changes: entries 2..6 after the bootstrap entry 1."""
    for name in ("a1", "a2", "a3"):
        assert api.post("/api/v1/teams", json={"name": name}).status_code == 201
    assert api.post("/api/v1/users", json={"name": "u1"}).status_code == 201
    assert api.put("/api/v1/teams/a1/members/u1", json={"role": "member"}).status_code == 200


def _sql(platform: Platform, statement: str, **params: object) -> None:
    with platform.db.engine.begin() as connection:
        connection.execute(text(statement), params)


def test_every_change_is_recorded_with_its_outcome(api: TestClient, platform: Platform) -> None:
    _fill(api)
    api.post("/api/v1/teams", json={"name": "a1"})  # exists -> 409
    api.post("/api/v1/teams", json={"name": "NOT valid"})  # 400
    api.delete("/api/v1/teams/nope")  # 404
    anonymous = TestClient(api.app, raise_server_exceptions=False)
    assert anonymous.post("/api/v1/teams", json={"name": "zz"}).status_code == 401
    entries = {(e.action, e.outcome, e.actor) for e in platform.audit.entries(limit=100)}
    assert ("user.bootstrap", "ok", "system") in entries
    assert ("team.create", "ok", "admin") in entries
    assert ("user.create", "ok", "admin") in entries
    assert ("team.member.set", "ok", "admin") in entries
    assert ("team.create", "resource_already_exists", "admin") in entries
    assert ("team.create", "invalid_parameter_value", "admin") in entries
    assert ("team.delete", "resource_does_not_exist", "admin") in entries
    assert ("auth.post", "unauthenticated", "anonymous") in entries
    # Reads are not audited.
    before = len(platform.audit.entries(limit=1000))
    api.get("/api/v1/teams")
    assert len(platform.audit.entries(limit=1000)) == before
    assert platform.audit.verify().ok


def test_entries_name_who_what_target_when(api: TestClient, platform: Platform) -> None:
    api.post("/api/v1/teams", json={"name": "nlp"})
    newest = platform.audit.entries(limit=1)[0]
    assert (newest.actor, newest.action, newest.target, newest.outcome) == (
        "admin",
        "team.create",
        "team:nlp",
        "ok",
    )
    assert newest.ts.tzinfo is not None


Tamper = Callable[[Platform], None]


def _edit(p: Platform) -> None:
    _sql(p, "UPDATE audit_log SET target = 'team:innocent' WHERE seq = 3")


def _delete_middle(p: Platform) -> None:
    _sql(p, "DELETE FROM audit_log WHERE seq = 3")


def _reorder(p: Platform) -> None:
    # Swap the contents of entries 3 and 4 (their seq numbers stay in place).
    _sql(p, "UPDATE audit_log SET seq = -1 WHERE seq = 3")
    _sql(p, "UPDATE audit_log SET seq = 3 WHERE seq = 4")
    _sql(p, "UPDATE audit_log SET seq = 4 WHERE seq = -1")


def _truncate_tail(p: Platform) -> None:
    _sql(p, "DELETE FROM audit_log WHERE seq >= 5")


def _forge_with_plain_sha256(p: Platform) -> None:
    """An attacker without the key rewrites entry 3 and fixes up its hash as best they can."""
    with p.db.engine.begin() as c:
        prev = c.execute(text("SELECT prev_hash FROM audit_log WHERE seq = 3")).scalar()
        fake = hashlib.sha256(f"forged{prev}".encode()).hexdigest()
        c.execute(text("UPDATE audit_log SET outcome='ok', hash=:h WHERE seq=3"), {"h": fake})
        c.execute(text("UPDATE audit_log SET prev_hash=:h WHERE seq=4"), {"h": fake})


@pytest.mark.parametrize(
    ("tamper", "broken_at"),
    [
        (_edit, 3),
        (_delete_middle, 3),
        (_reorder, 3),
        (_truncate_tail, 5),
        (_forge_with_plain_sha256, 3),
    ],
    ids=["edit", "delete", "reorder", "truncate-tail", "forge-hash"],
)
def test_tampering_is_caught_at_the_first_broken_link(
    api: TestClient, platform: Platform, tamper: Tamper, broken_at: int
) -> None:
    _fill(api)
    assert platform.audit.verify().ok
    tamper(platform)
    report = platform.audit.verify()
    assert not report.ok
    assert report.first_broken_seq == broken_at
    # The API reports the same.
    body = api.get("/api/v1/audit/verify").json()
    assert body["ok"] is False
    assert body["first_broken_seq"] == broken_at


def test_cli_verify_reads_the_database_directly(
    api: TestClient, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(api)
    monkeypatch.setenv("SHAMAL_HOME", str(platform.settings.home))
    monkeypatch.setenv("SHAMAL_DATABASE_URL", platform.settings.resolved_database_url)
    runner = CliRunner()
    ok = runner.invoke(cli_app, ["audit", "verify", "--local"])
    assert ok.exit_code == 0, ok.output
    assert "intact" in ok.output
    _edit(platform)
    broken = runner.invoke(cli_app, ["audit", "verify", "--local"])
    assert broken.exit_code == 1
    assert "BROKEN at entry 3" in broken.output


def test_concurrent_appends_keep_one_linear_chain(platform: Platform) -> None:
    audit: AuditLog = platform.audit
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            for j in range(10):
                platform.db.run(
                    lambda s, j=j: audit.append(
                        s, actor=f"w{i}", action="test.append", target=str(j), outcome="ok"
                    )
                )
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    report = audit.verify()
    assert report.ok, report
    assert report.entries_checked == 1 + 80


def _cut_tail_and_rewind_head(p: Platform, keep: int) -> None:
    with p.db.engine.begin() as c:
        c.execute(text("DELETE FROM audit_log WHERE seq > :k"), {"k": keep})
        last = c.execute(text("SELECT hash FROM audit_log WHERE seq = :k"), {"k": keep}).scalar()
        c.execute(text("UPDATE audit_head SET seq = :k, hash = :h"), {"k": keep, "h": last})


def test_a_witness_kept_outside_the_database_catches_a_rewound_head(
    api: TestClient, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(api)
    seen = platform.audit.verify()
    assert seen.ok
    assert seen.head_seq == 6
    _cut_tail_and_rewind_head(platform, keep=4)
    # The chain alone is consistent again: only the witness knows it was longer.
    assert platform.audit.verify().ok
    report = platform.audit.verify(witness=(seen.head_seq, seen.head_hash))
    assert not report.ok
    assert report.first_broken_seq == 5
    body = api.get(
        "/api/v1/audit/verify",
        params={"witness": f"{seen.head_seq}:{seen.head_hash}"},
    ).json()
    assert body["ok"] is False


def test_cli_remembers_the_witness_between_runs(
    api: TestClient, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(api)
    monkeypatch.setenv("SHAMAL_HOME", str(platform.settings.home))
    monkeypatch.setenv("SHAMAL_DATABASE_URL", platform.settings.resolved_database_url)
    runner = CliRunner()
    assert runner.invoke(cli_app, ["audit", "verify", "--local"]).exit_code == 0
    witness_file = platform.settings.home / "audit-witness.json"
    assert oct(witness_file.stat().st_mode & 0o777) == "0o600"
    _cut_tail_and_rewind_head(platform, keep=3)
    caught = runner.invoke(cli_app, ["audit", "verify", "--local"])
    assert caught.exit_code == 1
    assert "BROKEN at entry 4" in caught.output
    # --fresh ignores the witness: exactly the blind spot the witness covers.
    assert runner.invoke(cli_app, ["audit", "verify", "--local", "--fresh"]).exit_code == 0


def test_the_server_checks_the_chain_against_its_own_witness(
    api: TestClient, platform: Platform, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's watch keeps a witness in its home (outside the database): a tail cut
    with the head rewound is caught by its next check, by /audit/status and by
    /audit/verify, even for a client that kept no witness of its own."""
    assert api.get("/api/v1/audit/status").json() == {
        "checked": False,
        "ok": None,
        "checked_at": None,
        "report": None,
    }
    _fill(api)
    first = platform.audit_watch.check()
    assert first.ok
    witness = platform.settings.audit_witness_file
    assert oct(witness.stat().st_mode & 0o777) == "0o600"
    status = api.get("/api/v1/audit/status").json()
    assert (status["checked"], status["ok"], status["report"]["head_seq"]) == (True, True, 6)

    _cut_tail_and_rewind_head(platform, keep=4)
    assert platform.audit.verify().ok  # the chain alone is consistent again
    with caplog.at_level("ERROR", logger="shamal.security._watch"):
        report = platform.audit_watch.check()
    assert (report.ok, report.first_broken_seq) == (False, 5)
    assert "audit chain BROKEN at entry 5" in caplog.text
    status = api.get("/api/v1/audit/status").json()
    assert (status["ok"], status["report"]["first_broken_seq"]) == (False, 5)
    assert api.get("/api/v1/audit/verify").json()["ok"] is False
    # A broken check keeps the last good witness: the next one is caught as well.
    assert platform.audit_watch.check().ok is False


def test_audit_status_is_for_platform_admins(api: TestClient) -> None:
    assert api.post("/api/v1/users", json={"name": "plain"}).status_code == 201
    secret = api.post("/api/v1/tokens", json={"name": "t", "user": "plain"}).json()["secret"]
    answer = api.get("/api/v1/audit/status", headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 403


def test_the_audit_key_and_home_are_taken_back_from_others(tmp_path: Path) -> None:
    """Whoever reads the key can re-sign the chain: a key file or home left open to
    others is closed at start."""
    home = tmp_path / "home"
    start_platform(Settings(home=home)).close()
    key = home / "keys" / "audit.key"
    home.chmod(0o755)
    key.chmod(0o644)
    (home / "keys").chmod(0o755)
    start_platform(Settings(home=home)).close()
    assert oct(home.stat().st_mode & 0o777) == "0o700"
    assert oct((home / "keys").stat().st_mode & 0o777) == "0o700"
    assert oct(key.stat().st_mode & 0o777) == "0o600"
