"""What the cluster is used for: CPUs and GPUs allocated over the last day, and each team's
quota, what it holds now and its cost.

The platform keeps no history of allocation, so the chart is derived from the jobs the
signed-in principal may see: each job's requested resources, held from its start to its
finish (or now, while it runs), summed per time bucket. Quotas and cost come from the jobs
service as ``/api/v1/scheduler/quotas`` and ``/api/v1/cost`` answer them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.jobs import ACTIVE_STATES, CostLine, Job, QuotaUse, request_of
from shamal.scheduler.core import GPU_MILLI
from shamal.security import SecurityService, Team
from shamal.webui._common import Route, context, service_of
from shamal.webui._jobs_common import TIME_TEXT, TeamName, jobs_of, utc
from shamal.webui._render import page
from shamal.webui._session import SessionPrincipal
from shamal.webui._svg import Series, line_chart

#: The jobs the chart is drawn from: the newest this many the principal may see.
CHART_JOBS = 1000
WINDOW = timedelta(hours=24)
BUCKETS = 96  # 15 minutes each
COST_DAYS = 30
ANY_POOL = "any pool"


@dataclass(frozen=True)
class Allocation:
    """CPUs and GPUs held per time bucket (the mean over each bucket), by pool; ``xs`` are
    the buckets' ends in seconds since the epoch (the last one is the moment asked for)."""

    xs: list[float]
    cpus: dict[str, list[float]]
    gpus: dict[str, list[float]]
    jobs: int


def _held_until(job: Job, now: datetime) -> datetime | None:
    """When the job let its resources go (now, while it holds them); None: it never ran."""
    if job.started_at is None:
        return None
    if job.finished_at is not None:
        return utc(job.finished_at)
    return now if job.state in ACTIVE_STATES else utc(job.updated_at)


def allocation(
    jobs: Iterable[Job], now: datetime, window: timedelta = WINDOW, buckets: int = BUCKETS
) -> Allocation:
    """What ``jobs`` held over ``window`` up to ``now``: each job's requested CPUs and GPUs
    (all workers; a GPU fraction or MIG slice as its share of a GPU) from its start to its
    end, spread over ``buckets`` equal buckets as a mean. Pure."""
    start = now - window
    width = window.total_seconds() / buckets
    starts = [start.timestamp() + i * width for i in range(buckets)]
    cpus: dict[str, list[float]] = {}
    gpus: dict[str, list[float]] = {}
    counted = 0
    for job in jobs:
        until = _held_until(job, now)
        if job.started_at is None or until is None:
            continue
        began = utc(job.started_at)
        if until <= start or began >= now:
            continue
        counted += 1
        total = request_of(job).total
        pool = job.pool or ANY_POOL
        cpu_row = cpus.setdefault(pool, [0.0] * buckets)
        gpu_row = gpus.setdefault(pool, [0.0] * buckets)
        begin = max(began, start).timestamp()
        end = min(until, now).timestamp()
        first = int((begin - starts[0]) // width)
        for index in range(max(first, 0), buckets):
            lo, hi = starts[index], starts[index] + width
            if lo >= end:
                break
            share = (min(hi, end) - max(lo, begin)) / width
            cpu_row[index] += share * total.cpu_milli / 1000
            gpu_row[index] += share * total.gpu_milli / GPU_MILLI
    return Allocation([x + width for x in starts], cpus, gpus, counted)


def _series(xs: list[float], rows: dict[str, list[float]]) -> list[Series]:
    series = [Series(name, xs, row) for name, row in sorted(rows.items())]
    if len(series) > 1:
        total = [sum(column) for column in zip(*rows.values(), strict=True)]
        series.insert(0, Series("all pools", xs, total))
    return series or [Series("allocated", xs, [0.0] * len(xs))]


def _day_label(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%m-%d %H:%M")


def _chart(xs: list[float], rows: dict[str, list[float]], title: str) -> Markup | None:
    """The chart of ``rows``; None when nothing was held at all (a flat zero says less than
    a sentence)."""
    if not any(value for row in rows.values() for value in row):
        return None
    return line_chart(_series(xs, rows), title, x_format=_day_label)


async def usage_page(
    request: Request, principal: SessionPrincipal, team: TeamName = ""
) -> Response:
    """``/ui/jobs/usage``: CPUs and GPUs allocated over the last 24 hours, per pool."""
    svc = jobs_of(request)
    jobs = await run_in_threadpool(
        lambda: svc.list_jobs(principal, team=team or None, limit=CHART_JOBS)
    )
    now = datetime.now(UTC)
    found = allocation(jobs, now)
    cpu_chart = _chart(found.xs, found.cpus, "CPUs allocated, last 24 hours")
    gpu_chart = _chart(found.xs, found.gpus, "GPUs allocated, last 24 hours")
    values = context(
        request,
        principal,
        "Cluster use",
        cpu_chart=cpu_chart,
        gpu_chart=gpu_chart,
        counted=found.jobs,
        considered=len(jobs),
        limit=CHART_JOBS,
        team=team,
        teams=sorted(principal.roles),
        now=now,
        bucket_minutes=int(WINDOW.total_seconds() / BUCKETS / 60),
    )
    return page("jobs_usage.html", values)


# ---------------------------------------------------------------------------- teams
@dataclass(frozen=True)
class TeamUse:
    """A team as its page shows it: the principal's role there, its quotas and their use,
    and its usage and cost over the last days."""

    team: Team
    role: str
    quotas: Sequence[QuotaUse]
    cost: CostLine | None


def _team_uses(
    teams: list[Team], roles: dict[str, str], quotas: list[QuotaUse], cost: list[CostLine]
) -> list[TeamUse]:
    by_team: dict[str, list[QuotaUse]] = {}
    for use in quotas:
        by_team.setdefault(use.team, []).append(use)
    costs = {line.key: line for line in cost}
    return [
        TeamUse(t, roles.get(t.name, ""), by_team.get(t.name, []), costs.get(t.name)) for t in teams
    ]


async def teams_page(request: Request, principal: SessionPrincipal) -> Response:
    """``/ui/teams``: the principal's teams (every team, for admins), each with its quota
    per pool and what its jobs hold now, and its usage and cost over the last 30 days."""
    svc = jobs_of(request)
    security = service_of(request, "security", SecurityService)
    now = datetime.now(UTC)

    def read() -> tuple[list[Team], list[QuotaUse], list[CostLine]]:
        teams = security.list_teams(principal)
        quotas = svc.quota_use(principal)
        cost = svc.cost_report(principal, by="team", since=now - timedelta(days=COST_DAYS))
        return teams, quotas, cost

    teams, quotas, cost = await run_in_threadpool(read)
    roles = {name: role.label for name, role in principal.roles.items()}
    values: dict[str, Any] = context(
        request,
        principal,
        "Teams",
        uses=_team_uses(teams, roles, quotas, cost),
        cost_days=COST_DAYS,
        any_priced=any(line.cost for line in cost),
        **TIME_TEXT,
    )
    return page("teams.html", values)


ROUTES = [
    Route("/ui/jobs/usage", usage_page),
    Route("/ui/teams", teams_page),
]
