"""A metric's curve for the charts: read on the server, cut to what a screen can show."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.artifacts import PrincipalSlots
from shamal.tracking import TrackingService
from shamal.webui._downsample import MIN_POINTS, downsample
from shamal.webui._render import SECURITY_HEADERS
from shamal.webui._session import SessionPrincipal

#: Points a chart asks for by default, and at most: a few per pixel of a wide screen.
DEFAULT_POINTS = 2000
MAX_POINTS = 20_000


_POINT = np.dtype([("step", np.int64), ("value", np.float64)])


def curve(
    points: list[tuple[int, float]], wanted: int, first: int | None, last: int | None
) -> dict[str, Any]:
    """The chart's answer for the points ``(step, value)`` of the asked range (NaNs already
    left out by the read): the finite ones, downsampled to at most ``wanted``; ``total``
    counts them before cutting, ``skipped`` the infinities left out."""
    count = len(points)
    table = np.fromiter(points, dtype=_POINT, count=count)
    steps, values = table["step"], table["value"]
    keep = np.isfinite(values)
    steps, values = steps[keep], values[keep]
    shown_steps, shown_values = downsample(steps, values, wanted)
    return {
        "total": int(len(steps)),
        "skipped": int(count - len(steps)),
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
            found = tracking.metric_points(principal, run_id, key, first, last)
        answer = curve(found, points, first, last)
        answer.update(run_id=run_id, key=key)
        return answer

    answer = await run_in_threadpool(work)
    return Response(orjson.dumps(answer), media_type="application/json", headers=SECURITY_HEADERS)
