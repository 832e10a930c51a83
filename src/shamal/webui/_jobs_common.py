"""What the jobs and pipelines pages share: the jobs service, moments and durations in
words, which job ids may make a link, and a change audited as the API audits it."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, TypeVar

from fastapi import Query, Request
from starlette.concurrency import run_in_threadpool

from shamal.errors import ShamalError
from shamal.jobs import JobService, JobState
from shamal.security import AuditContext, AuditLog, Principal
from shamal.webui._common import service_of

T = TypeVar("T")

#: States a job never leaves: its page stops following it.
ENDED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})
TeamName = Annotated[str, Query(max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")]
_FULL_ID = re.compile(r"^[0-9a-f]{32}$")


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC; one stored without its zone is UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def at_text(moment: datetime | None) -> str:
    """A moment as the pages show it: ``YYYY-MM-DD HH:MM:SS`` in UTC ("" for None)."""
    if moment is None:
        return ""
    return utc(moment).strftime("%Y-%m-%d %H:%M:%S")


def took_text(start: datetime | None, end: datetime | None) -> str:
    """How long from ``start`` to ``end`` (``1h02m``, ``3m05s``); "" when either is missing."""
    if start is None or end is None:
        return ""
    seconds = max(0, int((utc(end) - utc(start)).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def held_text(seconds: float, unit: str) -> str:
    """Resource-seconds in words: ``40 CPU-seconds`` under an hour, else ``2.50 CPU-hours``."""
    if seconds < 3600:
        return f"{seconds:.0f} {unit}-seconds"
    return f"{seconds / 3600:.2f} {unit}-hours"


def cost_text(cost: float) -> str:
    """A cost to two decimals (``< 0.01`` for a small one that is not nothing)."""
    if 0 < cost < 0.005:
        return "< 0.01"
    return f"{cost:.2f}"


#: What the templates of jobs and pipelines format moments, usage and cost with.
TIME_TEXT = {"at": at_text, "took": took_text, "held": held_text, "cost": cost_text}


def jobs_of(request: Request) -> JobService:
    return service_of(request, "jobs", JobService)


def full_job_id(job_id: str) -> bool:
    """Whether ``job_id`` is a whole job id (as stored), fit for a link's path."""
    return bool(_FULL_ID.match(job_id))


async def audited_change(
    request: Request, principal: Principal, action: str, change: Callable[[AuditContext], T]
) -> T:
    """``change`` run in a worker thread with an audit context, as the API's ``audited``
    dependency does: a refusal the service did not record is recorded with its code."""
    ctx = AuditContext(action=action, actor=principal.name, principal=principal)
    try:
        return await run_in_threadpool(change, ctx)
    except ShamalError as exc:
        if not ctx.recorded:
            audit = service_of(request, "audit", AuditLog)
            await run_in_threadpool(audit.record_outcome, ctx, exc.code.lower())
        raise
