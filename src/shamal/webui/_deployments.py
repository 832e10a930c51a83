"""The deployments pages: the deployments a person may see, and one deployment's traffic
split, rollout, history, recorded traffic and its roll-back control.

Every read calls the deployments service with the signed-in principal, as
``/api/v1/deployments`` does; the roll-back form goes through the same service method as
``POST /api/v1/deployments/{name}/rollback`` (the member role of the deployment's team,
checked by the service, and audited as ``deployment.rollback``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated
from urllib.parse import quote

from fastapi import Form, Path, Query, Request
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.deployments import (
    Deployment,
    DeploymentEvent,
    DeploymentService,
    RolloutPhase,
    RouteRole,
    Sample,
    VersionStats,
    decide_rollout,
    percentile_ms,
)
from shamal.deployments import (
    Route as TrafficRoute,
)
from shamal.errors import ShamalError
from shamal.monitoring import MonitorService
from shamal.security import AuditContext, AuditLog, Principal, Role
from shamal.webui._common import Route, context, may_write, service_of
from shamal.webui._render import fragment, page, redirect
from shamal.webui._session import CsrfChecked, SessionPrincipal
from shamal.webui._svg import Series, line_chart, split_bar

#: A deployment's name, as the deployments API takes it in a path.
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
DeploymentName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64)]
PER_PAGE = 50
#: Changes the history shows (the newest).
EVENTS_SHOWN = 200
#: Sampled requests read for the traffic chart (the service keeps about this many).
SAMPLES_READ = 1000
#: Monitors of the deployment the page links to.
MONITORS_SHOWN = 20
#: Event kinds that are rollout decisions (a person's or the controller's).
DECISIONS = frozenset({"canary", "step", "promote", "rollback", "slo_breach"})
_BUCKETS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
_MAX_BUCKETS = 60


def _deployments(request: Request) -> DeploymentService:
    return service_of(request, "deployments", DeploymentService)


def _ms(at: datetime | None) -> int | None:
    """Milliseconds since the epoch (what the ``when`` filter shows); naive times are UTC."""
    if at is None:
        return None
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000)


def model_href(model: str, version: int) -> str:
    """The UI's page of a model version (a registered model's name has no ``/``)."""
    return f"/ui/models/{quote(model, safe='')}/versions/{version}"


# ---------------------------------------------------------------------------- the list
async def deployments_page(
    request: Request,
    principal: SessionPrincipal,
    after: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=64)] = None,
) -> Response:
    """The deployments the principal may see, by name, 50 a page."""
    svc = _deployments(request)
    found = await run_in_threadpool(
        svc.list_deployments, principal, limit=PER_PAGE + 1, after=after
    )
    shown = found[:PER_PAGE]
    values = context(
        request,
        principal,
        "Deployments",
        deployments=shown,
        next_after=shown[-1].name if len(found) > PER_PAGE else None,
        after=after or "",
        ms=_ms,
        model_href=model_href,
    )
    return page("deployments.html", values)


# ---------------------------------------------------------------------------- the split
def split_parts(d: Deployment) -> list[tuple[str, float]]:
    """The answered traffic, in percent, per primary and the canary (shadows answer
    nothing: they get a copy)."""
    canary = d.split.canary
    percent = d.split.canary_percent
    total = sum(r.weight for r in d.split.primaries) or 1
    parts = [
        (f"v{r.version} primary", (100 - percent) * r.weight / total) for r in d.split.primaries
    ]
    if canary is not None:
        parts.append((f"v{canary.version} canary", float(percent)))
    return parts


def _percentile(counts: tuple[int, ...], fraction: float) -> float | None:
    """A percentile read off a latency histogram (the upper bound of its bucket); None
    with no calls."""
    return percentile_ms(counts, fraction) if sum(counts) > 0 else None


@dataclass(frozen=True)
class VersionWindow:
    """One version's calls since the current revision began."""

    version: str
    role: str
    requests: int
    errors: int
    error_rate: float
    #: p50, p95 and p99 in words ("≤ 12 ms"): a histogram bounds a percentile from above.
    latency: tuple[str, str, str]


def _roles(routes: tuple[TrafficRoute, ...]) -> dict[str, str]:
    roles: dict[str, str] = {}
    for route in routes:
        roles.setdefault(route.version_key, route.role.value)
    return roles


def _latency_text(ms: float | None) -> str:
    if ms is None:
        return "—"
    return "over 2 min" if math.isinf(ms) else f"≤ {ms:.3g} ms"


def window_rows(d: Deployment, window: dict[str, VersionStats]) -> list[VersionWindow]:
    roles = _roles(d.split.routes)
    rows = []
    for version, stats in sorted(window.items(), key=lambda item: int(item[0])):
        counts = stats.latency_counts
        rows.append(
            VersionWindow(
                version=version,
                role=roles.get(version, "no longer routed"),
                requests=stats.requests,
                errors=stats.errors,
                error_rate=stats.error_rate,
                latency=(
                    _latency_text(_percentile(counts, 0.5)),
                    _latency_text(_percentile(counts, 0.95)),
                    _latency_text(_percentile(counts, 0.99)),
                ),
            )
        )
    return rows


def _bucket_s(span_s: float) -> int:
    return next((b for b in _BUCKETS_S if span_s / b <= _MAX_BUCKETS), _BUCKETS_S[-1])


def _time_format(span_s: float) -> Callable[[float], str]:
    pattern = "%m-%d %H:%M" if span_s > 86400 else "%H:%M"
    return lambda seconds: datetime.fromtimestamp(seconds, UTC).strftime(pattern)


def traffic_chart(samples: list[Sample]) -> Markup | None:
    """Sampled requests per time bucket, one line per version (shadows apart): what the
    sample log records over time. None when nothing was sampled."""
    if not samples:
        return None
    times = [(_ms(s.at) or 0) / 1000 for s in samples]
    start, end = min(times), max(times)
    size = _bucket_s(end - start)
    first = math.floor(start / size) * size
    count = int((end - first) // size) + 1
    lines: dict[str, list[float]] = {}
    for sample, at in zip(samples, times, strict=True):
        key = f"v{sample.version}" + (" shadow" if sample.shadow else "")
        lines.setdefault(key, [0.0] * count)[int((at - first) // size)] += 1
    xs = [first + i * size for i in range(count)]
    series = [Series(key, xs, ys) for key, ys in sorted(lines.items())]
    per = f"{size // 3600} h" if size >= 3600 else f"{size // 60} min"
    title = f"Sampled requests per {per}"
    return line_chart(series, title, x_format=_time_format(end - start))


#: The latency and error charts show the last hours, one point per minute with calls.
CALLS_SHOWN = timedelta(hours=6)
Minute = tuple[datetime, str, VersionStats]


def calls_charts(points: list[Minute]) -> tuple[Markup, Markup] | None:
    """p50 and p95 latency, and the share of calls that failed, per version and minute
    (from every serve process's reports). None when no call was reported."""
    if not points:
        return None
    lines: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {}
    for minute, version, stats in points:
        xs, p50, p95, failed = lines.setdefault(version, ([], [], [], []))
        xs.append(minute.timestamp())
        p50.append(_percentile(stats.latency_counts, 0.5) or 0.0)
        p95.append(_percentile(stats.latency_counts, 0.95) or 0.0)
        failed.append(100.0 * stats.errors / stats.requests if stats.requests else 0.0)
    span = points[-1][0].timestamp() - points[0][0].timestamp()
    ordered = sorted(lines.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0)
    latency = [
        Series(f"v{v} {name}", xs, ys)
        for v, (xs, p50, p95, _) in ordered
        for name, ys in (("p50", p50), ("p95", p95))
    ]
    errors = [Series(f"v{v}", xs, failed) for v, (xs, _, _, failed) in ordered]
    when = _time_format(span)
    return (
        line_chart(latency, "Latency per minute (ms, upper bound of the bucket)", x_format=when),
        line_chart(errors, "Calls that failed per minute (%)", x_format=when),
    )


# ---------------------------------------------------------------------------- the rollout
@dataclass(frozen=True)
class Rollout:
    """Where a deployment's rollout stands, as the rollout section shows it."""

    phase: str
    in_progress: bool
    canary: str
    canary_percent: int
    step: int
    steps: tuple[int, ...]
    next_percent: int | None
    next_at_ms: int | None
    verdict: str
    verdict_reason: str
    decisions: list[DeploymentEvent]


def rollout_of(
    d: Deployment, window: dict[str, VersionStats], events: list[DeploymentEvent], now: datetime
) -> Rollout:
    """The rollout's step, the controller's view of the current window (the same rule
    it applies to every report) and the decisions taken, newest first."""
    canary = d.split.canary
    in_progress = d.state.phase is RolloutPhase.PROGRESSING and canary is not None
    following = [s for s in d.plan.steps if s > d.state.canary_weight]
    next_at = d.state.since + timedelta(seconds=d.plan.interval_s) if in_progress else None
    decision = decide_rollout(d, window, now)
    return Rollout(
        phase=d.state.phase.value.replace("_", " "),
        in_progress=in_progress,
        canary=f"v{canary.version}" if canary is not None else "",
        canary_percent=d.split.canary_percent,
        step=d.state.step_index,
        steps=d.plan.steps,
        next_percent=following[0] if in_progress and following else None,
        next_at_ms=_ms(next_at),
        verdict=decision.action.value,
        verdict_reason=decision.reason,
        decisions=[e for e in reversed(events) if e.kind in DECISIONS],
    )


@dataclass(frozen=True)
class _Read:
    deployment: Deployment
    window: dict[str, VersionStats]
    events: list[DeploymentEvent]


async def _read(request: Request, principal: Principal, name: str) -> _Read:
    svc = _deployments(request)

    def read() -> _Read:
        return _Read(
            svc.get(principal, name),
            svc.window(principal, name),
            svc.events(principal, name, limit=EVENTS_SHOWN),
        )

    return await run_in_threadpool(read)


async def rollout_fragment(
    request: Request, principal: SessionPrincipal, name: DeploymentName
) -> Response:
    """The rollout section alone, for ``live.js``; final once no rollout is in progress."""
    found = await _read(request, principal, name)
    rollout = rollout_of(found.deployment, found.window, found.events, datetime.now(UTC))
    values = context(request, principal, name, deployment=found.deployment, rollout=rollout, ms=_ms)
    return fragment("deployments_rollout.html", values, final=not rollout.in_progress)


# ---------------------------------------------------------------------------- one deployment
async def deployment_page(
    request: Request, principal: SessionPrincipal, name: DeploymentName
) -> Response:
    """A deployment: its split, rollout (live while in progress), the calls of its current
    revision, its sampled traffic over time, its history and, for a member of its team,
    the roll-back form."""
    found = await _read(request, principal, name)
    d = found.deployment
    samples = await run_in_threadpool(
        _deployments(request).samples, principal, name, limit=SAMPLES_READ
    )
    since = datetime.now(UTC) - CALLS_SHOWN
    minutes = await run_in_threadpool(_deployments(request).stats_by_minute, principal, name, since)
    monitors = await run_in_threadpool(
        service_of(request, "monitors", MonitorService).list_monitors,
        principal,
        deployment=name,
        limit=MONITORS_SHOWN,
    )
    split = split_bar(split_parts(d), f"Traffic split of {d.name}")
    values = context(
        request,
        principal,
        d.name,
        deployment=d,
        split=split,
        shadows=d.split.shadows,
        rollout=rollout_of(d, found.window, found.events, datetime.now(UTC)),
        window=window_rows(d, found.window),
        traffic=traffic_chart(samples),
        calls=calls_charts(minutes),
        monitors=[m.name for m in monitors],
        events=list(reversed(found.events)),
        may_roll_back=d.split.canary is not None and may_write(principal, d.team, Role.MEMBER),
        model_href=model_href,
        lineage_uri=f"deployments:/{d.name}",
        ms=_ms,
        primary_role=RouteRole.PRIMARY,
    )
    return page("deployments_detail.html", values)


async def rollback(
    request: Request,
    principal: CsrfChecked,
    name: DeploymentName,
    reason: Annotated[str, Form(max_length=500, pattern=r"^[^\x00]*$")] = "",
    revision: Annotated[int | None, Form(ge=1, le=2**31 - 1)] = None,
) -> Response:
    """Roll the canary back now, through the service as the API's rollback does (the
    member role of the deployment's team; audited as ``deployment.rollback``, refusals
    too). ``revision``: only if the deployment is still at the revision the form showed."""
    svc = _deployments(request)
    audit = service_of(request, "audit", AuditLog)
    ctx = AuditContext(action="deployment.rollback", actor=principal.name, principal=principal)

    def roll_back() -> None:
        try:
            svc.rollback(ctx, name, reason=reason.strip(), expected_revision=revision)
        except ShamalError as exc:
            if not ctx.recorded:
                audit.record_outcome(ctx, exc.code.lower())
            raise

    await run_in_threadpool(roll_back)
    return redirect(f"/ui/deployments/{name}")


ROUTES = [
    Route("/ui/deployments", deployments_page),
    Route("/ui/deployments/{name}", deployment_page),
    Route("/ui/deployments/{name}/rollout", rollout_fragment),
    Route("/ui/deployments/{name}/rollback", rollback, ("POST",)),
]
