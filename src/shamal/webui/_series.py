"""A metric's curve for the charts: read on the server, cut to what a screen can show."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.artifacts import PrincipalSlots
from shamal.security import Principal
from shamal.tracking import MAX_SEARCH, HistoryRow, TrackingService
from shamal.webui._downsample import MIN_POINTS, downsample
from shamal.webui._render import SECURITY_HEADERS
from shamal.webui._session import SessionPrincipal

#: Points a chart asks for by default, and at most: a few per pixel of a wide screen.
DEFAULT_POINTS = 2000
MAX_POINTS = 20_000
_NAN = float("nan")


def _read_all(
    tracking: TrackingService, principal: Principal, run_id: str, key: str
) -> list[HistoryRow]:
    """Every stored point of the metric, in (step, timestamp) order: pages of the service's
    largest size, so a metric of a million points is one index range read."""
    rows: list[HistoryRow] = []
    token = None
    while True:
        found = tracking.metric_history(principal, run_id, key, token, MAX_SEARCH["history"])
        rows.extend(found.items)
        token = found.next_page_token
        if not token:
            return rows


def curve(
    rows: list[HistoryRow], points: int, first: int | None, last: int | None
) -> dict[str, Any]:
    """The chart's answer: the finite points with ``first <= step <= last``, downsampled to
    at most ``points``; ``total`` counts the points in that range before cutting."""
    count = len(rows)
    steps = np.fromiter((r[0] for r in rows), dtype=np.int64, count=count)
    # A stored NaN is 0.0 with its flag set: one pass reads both, as NaN.
    values = np.fromiter((_NAN if r[3] else r[2] for r in rows), dtype=np.float64, count=count)
    keep = np.isfinite(values)
    if first is not None:
        keep &= steps >= first
    if last is not None:
        keep &= steps <= last
    steps, values = steps[keep], values[keep]
    shown_steps, shown_values = downsample(steps, values, points)
    return {
        "total": int(len(steps)),
        "skipped": int(count - int(keep.sum())) if first is None and last is None else 0,
        "downsampled": len(shown_steps) < len(steps),
        "steps": shown_steps.tolist(),
        "values": shown_values.tolist(),
        "min_step": int(steps[0]) if len(steps) else None,
        "max_step": int(steps[-1]) if len(steps) else None,
    }


async def metric_series(
    request: Request,
    principal: SessionPrincipal,
    run_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    key: Annotated[str, Path(min_length=1, max_length=250)],
    points: Annotated[int, Query(ge=MIN_POINTS, le=MAX_POINTS)] = DEFAULT_POINTS,
    first: Annotated[int | None, Query(alias="from")] = None,
    last: Annotated[int | None, Query(alias="to")] = None,
) -> Response:
    """``GET /ui/api/runs/<id>/metrics/<key>?points=N&from=&to=``: the metric's finite
    points between the steps ``from`` and ``to`` (both optional, inclusive), at most
    ``points`` of them, cut by :func:`~shamal.webui._downsample.downsample`. Zooming asks for
    a narrower range, which comes back at full resolution once it fits."""
    tracking: TrackingService = request.app.state.tracking
    slots: PrincipalSlots = request.app.state.search_slots

    def work() -> dict[str, Any]:
        with slots.hold(f"user:{principal.user.id}"):
            rows = _read_all(tracking, principal, run_id, key)
        answer = curve(rows, points, first, last)
        answer.update(run_id=run_id, key=key)
        return answer

    answer = await run_in_threadpool(work)
    return Response(orjson.dumps(answer), media_type="application/json", headers=SECURITY_HEADERS)
