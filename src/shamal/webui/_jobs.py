"""The jobs pages: the queue, a job (its facts, state history and live log tail) and
cancelling one.

Each page calls the jobs service as the API's routes do, with the signed-in principal, so
a person sees exactly the jobs, events and logs their token may read through the API; a
cancel posted here goes through the same service method (which checks the role and
audits) as ``POST /api/v1/jobs/{id}/cancel``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from shamal.jobs import Job, JobState, job_cursor, job_cursor_after
from shamal.security import Principal, Role
from shamal.webui._common import Route, context, may_write
from shamal.webui._jobs_common import ENDED, TIME_TEXT, TeamName, audited_change, jobs_of
from shamal.webui._render import SECURITY_HEADERS, fragment, page, redirect
from shamal.webui._session import CsrfChecked, SessionPrincipal

logger = logging.getLogger(__name__)

JOBS_PER_PAGE = 50
#: The most of a log one poll answers: a browser appends it as text, a few times a second
#: at most while the log grows.
LOG_CHUNK = 64 * 1024

JobId = Annotated[str, Path(min_length=6, max_length=32, pattern=r"^[0-9a-f]+$")]
States = Annotated[list[JobState] | None, Query(max_length=8)]
PageToken = Annotated[str | None, Query(max_length=200)]


# ---------------------------------------------------------------------------- the queue
async def _queue(
    request: Request, principal: Principal, team: str, states: list[JobState], token: str | None
) -> dict[str, Any]:
    """One page of the jobs ``principal`` may see, newest first, with what queued ones wait
    for and the next page's token."""
    svc = jobs_of(request)
    after = job_cursor_after(token)

    def read() -> tuple[list[Job], dict[str, str]]:
        found = svc.list_jobs(
            principal, states=states, team=team or None, limit=JOBS_PER_PAGE + 1, after=after
        )
        return found, svc.waiting(found[:JOBS_PER_PAGE])

    found, waiting = await run_in_threadpool(read)
    shown = found[:JOBS_PER_PAGE]
    next_token = None
    if len(found) > JOBS_PER_PAGE:
        last = shown[-1]
        next_token = job_cursor(last.submitted_at, last.id)
    filters = {"team": team, "state": [s.value for s in states]}
    return {
        "jobs": shown,
        "waiting": waiting,
        "next_page_token": next_token,
        "page_token": token or "",
        "filters": filters,
    }


async def jobs_page(
    request: Request,
    principal: SessionPrincipal,
    team: TeamName = "",
    state: States = None,
    page_token: PageToken = None,
) -> Response:
    """``/ui/jobs``: the queue (queued, running and recent jobs), filtered by team and
    state, 50 a page; its rows follow the server (``/ui/jobs/fragment``)."""
    states = list(dict.fromkeys(state or []))
    queue = await _queue(request, principal, team, states, page_token)
    values = context(
        request,
        principal,
        "Jobs",
        all_states=[s.value for s in JobState],
        teams=sorted(principal.roles),
        **queue,
        **TIME_TEXT,
    )
    return page("jobs.html", values)


async def jobs_fragment(
    request: Request,
    principal: SessionPrincipal,
    team: TeamName = "",
    state: States = None,
    page_token: PageToken = None,
) -> Response:
    """The queue's rows alone, for ``live.js``."""
    states = list(dict.fromkeys(state or []))
    queue = await _queue(request, principal, team, states, page_token)
    return fragment("jobs_rows.html", context(request, principal, "Jobs", **queue, **TIME_TEXT))


# ---------------------------------------------------------------------------- a job
def _cost_period(job: Job) -> tuple[datetime, datetime | None] | None:
    if job.started_at is None:
        return None
    until = job.finished_at + timedelta(seconds=1) if job.finished_at else None
    return job.submitted_at, until


async def _job_state(request: Request, principal: Principal, job_id: str) -> dict[str, Any]:
    """A job, its events, its usage and cost (when it ran) and whether it may be cancelled
    by ``principal``."""
    svc = jobs_of(request)

    def read() -> dict[str, Any]:
        job = svc.get(principal, job_id)
        events = svc.events(principal, job.id)
        waiting = svc.waiting([job]).get(job.id)
        usage = None
        period = _cost_period(job)
        if period is not None:
            lines = svc.cost_report(principal, by="job", since=period[0], until=period[1])
            usage = next((line for line in lines if line.key == job.id), None)
        return {"job": job, "events": events, "waiting": waiting, "usage": usage}

    found = await run_in_threadpool(read)
    job: Job = found["job"]
    ended = job.state in ENDED
    found["ended"] = ended
    found["may_cancel"] = (
        not ended and job.stop_request != "cancel" and may_write(principal, job.team, Role.MEMBER)
    )
    found["nodes"] = _nodes(job)
    return found


def _nodes(job: Job) -> list[str]:
    slots = (job.placement or {}).get("slots") or []
    return list(dict.fromkeys(str(s.get("node", "")) for s in slots if isinstance(s, dict)))


async def job_page(request: Request, principal: SessionPrincipal, job_id: JobId) -> Response:
    """``/ui/jobs/{id}`` (or a unique prefix of 6+): the job's facts, its state history,
    and its log, followed while it runs."""
    state = await _job_state(request, principal, job_id)
    job: Job = state["job"]
    if job.id != job_id:
        return redirect(f"/ui/jobs/{job.id}")
    head = await log_chunk(request, principal, job.id, None, 0)
    if state["ended"] and not head["done"] and len(head["text"]) < LOG_CHUNK // 4:
        # A short log of an ended job: one more read says whether it is whole, so the
        # page need not be followed for a log that will not grow.
        rest = await log_chunk(request, principal, job.id, head["attempt"], head["offset"])
        head["done"] = rest["done"] and not rest["text"]
    values = context(request, principal, job.name or job.id[:12], log=head, **state, **TIME_TEXT)
    return page("job.html", values)


async def job_state_fragment(
    request: Request, principal: SessionPrincipal, job_id: JobId
) -> Response:
    """The job's state part alone, for ``live.js``: final once the job has ended."""
    state = await _job_state(request, principal, job_id)
    values = context(request, principal, "Job", **state, **TIME_TEXT)
    return fragment("job_state.html", values, final=state["ended"])


async def cancel_job(request: Request, principal: CsrfChecked, job_id: JobId) -> Response:
    """Cancel the job through the service, as the API does: a viewer is refused (403)."""
    svc = jobs_of(request)
    job = await audited_change(request, principal, "job.cancel", lambda c: svc.cancel(c, job_id))
    return redirect(f"/ui/jobs/{job.id}")


# ---------------------------------------------------------------------------- the log
def _utf8_cut(data: bytes) -> int:
    """Where ``data`` can be cut without splitting a UTF-8 character at its end (its length
    when it ends on a whole one): a character split across two reads comes whole in the
    second."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: where the last character starts
            width = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) - back if width > back else len(data)
    return len(data)


async def log_chunk(
    request: Request, principal: Principal, job_id: str, attempt: int | None, offset: int
) -> dict[str, Any]:
    """At most :data:`LOG_CHUNK` bytes of an attempt's log from ``offset`` (default: the
    latest attempt), read through the service method the API's log route uses.

    Returns:
        ``text`` (decoded, invalid bytes replaced), ``offset`` (where the next read
        starts), ``attempt``, ``done`` (the job has ended and nothing more will come) and
        ``next_attempt`` (this attempt's log is over and a later attempt's has begun) and
        ``more`` (more is stored already: ask again at once).
    """
    svc = jobs_of(request)

    def read() -> tuple[Any, Job]:
        chunk = svc.read_log(principal, job_id, attempt, offset)
        return chunk, svc.get(principal, job_id)

    chunk, job = await run_in_threadpool(read)
    data: bytes = chunk.data[:LOG_CHUNK]
    cut = _utf8_cut(data)
    if cut > 0 or job.state not in ENDED:  # an ended log's last bytes go out as they are
        data = data[:cut]
    over = chunk.complete and chunk.attempt < job.attempt
    return {
        "text": data.decode("utf-8", errors="replace"),
        "offset": offset + len(data),
        "attempt": chunk.attempt,
        "done": chunk.complete and job.state in ENDED and chunk.attempt >= job.attempt,
        "next_attempt": chunk.attempt + 1 if over else None,
        "more": len(chunk.data) > LOG_CHUNK,
    }


async def job_log(
    request: Request,
    principal: SessionPrincipal,
    job_id: JobId,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    attempt: Annotated[int | None, Query(ge=0, le=10_000)] = None,
) -> Response:
    """``/ui/api/jobs/{id}/log?offset=N``: the next piece of a job's log as JSON, for
    ``job-log.js``."""
    body = await log_chunk(request, principal, job_id, attempt, offset)
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-store"}
    return JSONResponse(body, headers=headers)


ROUTES = [
    Route("/ui/jobs", jobs_page),
    Route("/ui/jobs/fragment", jobs_fragment),
    Route("/ui/jobs/{job_id}", job_page),
    Route("/ui/jobs/{job_id}/state", job_state_fragment),
    Route("/ui/jobs/{job_id}/cancel", cancel_job, ("POST",)),
    Route("/ui/api/jobs/{job_id}/log", job_log),
]
