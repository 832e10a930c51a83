"""The monitors pages: the monitors a person may see with their last verdict, and one
monitor's drift over time per column, its last run, data quality, performance, the
actions it took and the reference it compares with.

Reads call the monitor service with the signed-in principal, as ``/api/v1/monitors``
does (its team's viewers and up); the page shows what ``shamal monitor show`` prints.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Path, Query, Request
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.errors import ShamalError
from shamal.monitoring import (
    ColumnRole,
    Monitor,
    MonitorResult,
    MonitorService,
    ReferenceService,
    SeriesPoint,
)
from shamal.security import Principal
from shamal.webui._common import Route, context, service_of
from shamal.webui._render import page
from shamal.webui._session import SessionPrincipal
from shamal.webui._svg import Rule, Series, line_chart

#: A monitor's name, as the monitors API takes it in a path.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MonitorName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=63)]
PER_PAGE = 50
#: Results whose actions the page lists.
RESULTS_SHOWN = 20
#: Charts of columns drawn at most (the table lists every column of the last run).
MAX_CHARTS = 48
PERFORMANCE = "performance:"


def _monitors(request: Request) -> MonitorService:
    return service_of(request, "monitors", MonitorService)


def _ms(at: datetime | None) -> int | None:
    if at is None:
        return None
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000)


def every(seconds: int) -> str:
    """A schedule in words: ``every 1 h``."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"every {seconds // size} {unit}"
    return f"every {seconds} s"


def describe_action(action: Mapping[str, Any]) -> str:
    """One action of the drift policy in words (as ``shamal monitor show`` prints it):
    ``retrain retrain-fraud: held (a canary is in rollout)``."""
    what = str(action.get("action", "?"))
    if action.get("pipeline"):
        what += f" {action['pipeline']}"
    status = str(action.get("status", ""))
    if action.get("run"):
        status += f" run {action['run']}"
    why = action.get("reason") or action.get("error")
    return f"{what}: {status}" + (f" ({why})" if why else "")


def _columns(result: MonitorResult) -> list[Mapping[str, Any]]:
    found = result.report.get("columns", [])
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def model_href(model: str, version: int) -> str:
    return f"/ui/models/{quote(model, safe='')}/versions/{version}"


# ---------------------------------------------------------------------------- the list
@dataclass(frozen=True)
class MonitorRow:
    monitor: Monitor
    last: MonitorResult | None
    drifted_columns: int
    actions: list[str]


def _row(svc: MonitorService, principal: Principal, monitor: Monitor) -> MonitorRow:
    results = svc.results(principal, monitor.name, limit=1)
    last = results[0] if results else None
    if last is None:
        return MonitorRow(monitor, None, 0, [])
    drifted = sum(1 for c in _columns(last) if c.get("drifted") is True)
    return MonitorRow(monitor, last, drifted, [describe_action(a) for a in last.actions])


async def monitors_page(
    request: Request,
    principal: SessionPrincipal,
    after: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=63)] = None,
) -> Response:
    """The monitors the principal may see, by name, with each one's last verdict."""
    svc = _monitors(request)

    def read() -> tuple[list[MonitorRow], bool]:
        found = svc.list_monitors(principal, limit=PER_PAGE + 1, after=after)
        return [_row(svc, principal, m) for m in found[:PER_PAGE]], len(found) > PER_PAGE

    rows, more = await run_in_threadpool(read)
    values = context(
        request,
        principal,
        "Monitors",
        rows=rows,
        next_after=rows[-1].monitor.name if more else None,
        after=after or "",
        every=every,
        ms=_ms,
    )
    return page("monitors.html", values)


# ---------------------------------------------------------------------------- one monitor
def _time_format(points: Sequence[SeriesPoint]) -> Callable[[float], str]:
    times = [p.at for p in points]
    span = (max(times) - min(times)).total_seconds() if times else 0.0
    pattern = "%m-%d %H:%M" if span > 86400 else "%H:%M:%S" if span < 600 else "%H:%M"
    return lambda seconds: datetime.fromtimestamp(seconds, UTC).strftime(pattern)


def _by_column(points: Sequence[SeriesPoint]) -> dict[str, list[SeriesPoint]]:
    found: dict[str, list[SeriesPoint]] = {}
    for point in points:
        found.setdefault(point.column, []).append(point)
    return found


def _value(value: float | None) -> float:
    return float("nan") if value is None else value


@dataclass(frozen=True)
class ColumnChart:
    column: str
    measure: str
    chart: Markup


def drift_charts(points: Sequence[SeriesPoint]) -> list[ColumnChart]:
    """One chart per column: its p-value (tests that give one) or its distance over the
    runs, the threshold it is judged by as a rule (drift: a p-value below it, a distance
    above it). Performance metrics get a chart each, without a threshold."""
    charts = []
    x_format = _time_format(points)
    for column, series in sorted(_by_column(points).items())[:MAX_CHARTS]:
        last = series[-1]
        xs = [(_ms(p.at) or 0) / 1000 for p in series]
        if column.startswith(PERFORMANCE):
            ys = [_value(p.statistic) for p in series]
            chart = line_chart([Series(column, xs, ys)], f"{column} over time", x_format=x_format)
            charts.append(ColumnChart(column, "score", chart))
            continue
        uses_p = last.p_value is not None
        ys = [_value(p.p_value if uses_p else p.statistic) for p in series]
        measure = f"{last.test} p-value" if uses_p else f"{last.test} distance"
        rules = [Rule(f"threshold ({'drift below' if uses_p else 'drift above'})", last.threshold)]
        title = f"{column}: {measure} over time"
        chart = line_chart([Series(column, xs, ys)], title, rules=rules, x_format=x_format)
        charts.append(ColumnChart(column, measure, chart))
    return charts


@dataclass(frozen=True)
class ColumnVerdict:
    column: str
    role: str
    kind: str
    test: str
    statistic: str
    p_value: str
    threshold: str
    drifted: bool
    band: str


def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return f"{value:.{digits}g}"


def _band(raw: Any) -> str:
    if not isinstance(raw, Mapping):
        return "—"
    where = "outside" if raw.get("outside") else "inside"
    distance, upper = _number(raw.get("distance")), _number(raw.get("upper"))
    return f"{distance} ({where} the reference's band, upper {upper})"


def column_verdicts(result: MonitorResult, roles: Mapping[str, str]) -> list[ColumnVerdict]:
    """The last run's verdict per column: the test, statistic, p-value (or distance),
    threshold, drifted or not, and the distance against the reference's chunk band."""
    bands = result.report.get("bands", {})
    bands = bands if isinstance(bands, Mapping) else {}
    rows = []
    for c in _columns(result):
        name = str(c.get("column", ""))
        rows.append(
            ColumnVerdict(
                column=name,
                role=roles.get(name, "feature"),
                kind=str(c.get("kind", "")),
                test=str(c.get("test", "")),
                statistic=_number(c.get("statistic")),
                p_value=_number(c.get("p_value"), 3),
                threshold=_number(c.get("threshold"), 3),
                drifted=c.get("drifted") is True,
                band=_band(bands.get(name)),
            )
        )
    return rows


def _list_of_mappings(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


@dataclass(frozen=True)
class LastRun:
    result: MonitorResult
    at_ms: int | None
    features: list[ColumnVerdict]
    predictions: list[ColumnVerdict]
    quality: list[Mapping[str, Any]]
    missing: list[str]
    performance: Mapping[str, Any] | None
    metrics: list[tuple[str, str]]


def last_run(result: MonitorResult, roles: Mapping[str, str]) -> LastRun:
    verdicts = column_verdicts(result, roles)
    report = result.report
    scored = report.get("performance")
    scored = scored if isinstance(scored, Mapping) else None
    raw_metrics = scored.get("metrics", {}) if scored else {}
    metrics = [
        (str(k), _number(v))
        for k, v in sorted((raw_metrics if isinstance(raw_metrics, Mapping) else {}).items())
    ]
    missing = report.get("missing", [])
    return LastRun(
        result=result,
        at_ms=_ms(result.at),
        features=[v for v in verdicts if v.role != ColumnRole.PREDICTION.value],
        predictions=[v for v in verdicts if v.role == ColumnRole.PREDICTION.value],
        quality=_list_of_mappings(report.get("quality")),
        missing=[str(m) for m in missing] if isinstance(missing, list) else [],
        performance=scored,
        metrics=metrics,
    )


def _roles(request: Request, principal: Principal, monitor: Monitor) -> dict[str, str]:
    """Each reference column's role (feature, prediction, label); empty when the
    reference profile cannot be read (deleted since)."""
    references = service_of(request, "references", ReferenceService)
    try:
        profile = references.get(principal, monitor.reference_model, monitor.reference_version)
    except ShamalError:
        return {}
    return {name: c.role.value for name, c in profile.columns.items()}


async def monitor_page(
    request: Request,
    principal: SessionPrincipal,
    name: MonitorName,
    runs: Annotated[int, Query(ge=2, le=1000)] = 50,
) -> Response:
    """A monitor: its spec and reference, each column's drift over the newest ``runs``
    runs, the last run's verdicts, quality findings and performance, and the actions
    its policy took."""
    svc = _monitors(request)

    def read() -> tuple[Monitor, list[MonitorResult], list[SeriesPoint], dict[str, str]]:
        monitor = svc.get(principal, name)
        results = svc.results(principal, name, limit=RESULTS_SHOWN)
        points = svc.series(principal, name, limit=runs)
        return monitor, results, points, _roles(request, principal, monitor)

    monitor, results, points, roles = await run_in_threadpool(read)
    values = context(
        request,
        principal,
        monitor.name,
        monitor=monitor,
        charts=drift_charts(points),
        columns_charted=len({p.column for p in points}),
        max_charts=MAX_CHARTS,
        last=last_run(results[0], roles) if results else None,
        results=[(r, _ms(r.at), [describe_action(a) for a in r.actions]) for r in results],
        every=every,
        ms=_ms,
        runs=runs,
        model_href=model_href,
        tests=json.dumps(dict(monitor.tests), sort_keys=True) if monitor.tests else "",
    )
    return page("monitors_detail.html", values)


ROUTES = [
    Route("/ui/monitors", monitors_page),
    Route("/ui/monitors/{name}", monitor_page),
]
