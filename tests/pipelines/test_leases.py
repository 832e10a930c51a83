"""What a crashed server leaves behind, on SQLite and PostgreSQL: a step whose record was
written but whose job may not have been submitted is submitted once, with the id chosen
before; a lease held by a process of this host that is gone is taken at once, one held by
a live process elsewhere is waited out; a lease lasts only as long as a pass."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from shamal.clock import utc_now
from shamal.db.models.jobs import JobRow
from shamal.db.models.pipelines import PipelineRunRow
from shamal.pipelines import PipelineSpec, _store
from shamal.pipelines._advance import RunAdvancer, lease_owner_name
from shamal.security import AuditContext, Principal, Role
from shamal.server import Platform


def _admin(platform: Platform) -> Principal:
    assert platform.admin_secret is not None
    return platform.security.authenticate(platform.admin_secret)


def _ctx(platform: Platform) -> AuditContext:
    principal = _admin(platform)
    return AuditContext(action="test", actor=principal.name, principal=principal)


def _run(platform: Platform) -> str:
    """A run of a -> b that no pass has moved yet."""
    ctx = _ctx(platform)
    platform.security.create_team(ctx, "ml")
    platform.security.set_member(ctx, "ml", ctx.require_principal().name, Role.ADMIN)
    spec = PipelineSpec.from_json(
        {
            "name": "p",
            "team": "ml",
            "steps": [
                {"name": "a", "command": ["echo", "a"]},
                {"name": "b", "command": ["echo", "b"], "after": ["a"]},
            ],
        }
    )
    platform.pipelines.register(ctx, spec)
    run = platform.pipelines.start(ctx, "p", advance=False)
    assert run is not None
    return run.id


def _lease(platform: Platform, run_id: str, owner: str, seconds: float) -> None:
    until = utc_now() + timedelta(seconds=seconds)

    def work(s: Session) -> None:
        s.execute(
            update(PipelineRunRow)
            .where(PipelineRunRow.id == run_id)
            .values(lease_owner=owner, lease_until=until)
        )

    platform.db.run(work)


def _jobs_named(platform: Platform, name: str) -> int:
    with platform.db.unit_of_work(write=False) as s:
        return int(s.scalar(select(func.count()).where(JobRow.name == name)) or 0)


def _gone_owner() -> str:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    host, _, nonce = lease_owner_name().rsplit(":", 2)
    return f"{host}:{ended.pid}:{nonce}"


def test_a_step_written_but_not_submitted_is_submitted_once_by_the_next_server(
    platform: Platform,
) -> None:
    run_id = _run(platform)
    job_id = uuid.uuid4().hex
    # The state a server killed between writing the step and submitting its job leaves,
    # with its lease (a minute long) still on the run.
    platform.db.run(
        lambda s: _store.insert_step(
            s, run_id, "a", name="a", index=None, state="submitting", args={},
            now=utc_now(), job_id=job_id,
        )
    )  # fmt: skip
    _lease(platform, run_id, _gone_owner(), 60)
    assert platform.pipelines.advance_all() >= 1
    run = platform.pipelines.get_run(_admin(platform), run_id)
    steps = {s.key: s for s in run.steps}
    assert (steps["a"].state, steps["a"].job_id) == ("running", job_id)
    assert "b" not in steps
    assert platform.jobs.jobs_of([job_id])[job_id].name == "p.a"
    # Passes again (by this server or another) submit nothing more.
    platform.pipelines.advance_all()
    other = RunAdvancer(platform.pipelines.advancer._s, lease_owner_name(), timedelta(seconds=60))
    other.advance_all()
    assert _jobs_named(platform, "p.a") == 1
    # The lease lasts as long as a pass: none is held between passes.
    with platform.db.unit_of_work(write=False) as s:
        assert _store.lease_owner(s, run_id) is None


def test_a_live_holders_lease_is_waited_out(platform: Platform) -> None:
    run_id = _run(platform)
    # A process on another host (or alive here) holds it: nothing moves until it expires.
    _lease(platform, run_id, "elsewhere:4242:0123abcd", 60)
    assert platform.pipelines.advance_all() == 0
    assert platform.pipelines.get_run(_admin(platform), run_id).steps == ()
    assert _jobs_named(platform, "p.a") == 0
    _lease(platform, run_id, "elsewhere:4242:0123abcd", -1)  # it expired
    assert platform.pipelines.advance_all() >= 1
    assert _jobs_named(platform, "p.a") == 1


@pytest.mark.parametrize("pid", ["1", "notapid", "own"])
def test_a_lease_of_an_odd_owner_is_never_taken_early(platform: Platform, pid: str) -> None:
    run_id = _run(platform)
    host = lease_owner_name().rsplit(":", 2)[0]
    owner = f"{host}:{os.getpid() if pid == 'own' else pid}:0123abcd"
    _lease(platform, run_id, owner, 60)
    assert platform.pipelines.advance_all() == 0
    assert _jobs_named(platform, "p.a") == 0
