"""Scheduler leases: who is alive, and taking over the jobs of a scheduler that is not.

Each scheduler process writes a heartbeat (one row per name) every tick. One that has been
silent for longer than the lease is presumed dead, and a live scheduler adopts the jobs it had
claimed: a compare-and-set of ``claimed_by`` under the scheduling lock, so two survivors never
both adopt one job, and a scheduler that comes back under its old name finds those jobs no
longer its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from shamal.db.models import JobRow, SchedulerRow
from shamal.jobs import ACTIVE_STATES

__all__ = ["adopt", "beat", "silent_claimers"]


def beat(s: Session, name: str, host: str, now: datetime) -> None:
    """Record that scheduler ``name`` is alive at ``now`` (its first beat starts its row)."""
    found = s.get(SchedulerRow, name)
    if found is None:
        s.add(SchedulerRow(name=name, host=host[:256], started_at=now, heartbeat_at=now))
    else:
        found.host, found.heartbeat_at = host[:256], now
    s.flush()


def silent_claimers(
    s: Session, me: str, now: datetime, lease_s: float
) -> dict[str, datetime | None]:
    """Schedulers other than ``me`` that hold active jobs and have not beaten within the lease,
    with their last heartbeat (None: never, e.g. a name from before leases existed)."""
    states = sorted(state.value for state in ACTIVE_STATES)
    claimers = set(
        s.scalars(
            select(JobRow.claimed_by)
            .where(JobRow.state.in_(states), JobRow.claimed_by.is_not(None))
            .where(JobRow.claimed_by != me)
            .distinct()
        )
    )
    if not claimers:
        return {}
    beats: dict[str, datetime] = {
        row.name: row.heartbeat_at
        for row in s.execute(
            select(SchedulerRow.name, SchedulerRow.heartbeat_at).where(
                SchedulerRow.name.in_(sorted(claimers))
            )
        )
    }
    cutoff = now - timedelta(seconds=lease_s)
    return {
        name: beats.get(name)
        for name in claimers
        if name is not None and (beats.get(name) is None or beats[name] < cutoff)
    }


def adopt(s: Session, dead: Sequence[str], me: str) -> list[tuple[str, str]]:
    """Claim for ``me`` every active job ``dead`` schedulers hold: (job id, its old claimer)."""
    states = sorted(state.value for state in ACTIVE_STATES)
    held = s.execute(
        select(JobRow.id, JobRow.claimed_by)
        .where(JobRow.state.in_(states), JobRow.claimed_by.in_(sorted(dead)))
        .order_by(JobRow.id)
    ).all()
    adopted: list[tuple[str, str]] = []
    for job_id, previous in held:
        done = s.execute(
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.claimed_by == previous)
            .values(claimed_by=me)
            .execution_options(synchronize_session=False)
        )
        if done.rowcount == 1 and previous is not None:  # type: ignore[attr-defined]
            adopted.append((job_id, previous))
    return adopted
