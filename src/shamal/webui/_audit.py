"""The audit log page: entries newest first, paged and filtered, and whether the hash
chain holds.

Platform admins only, as ``GET /api/v1/audit`` (anyone else gets the API's refusal, 403).
The chain's state is the server's own last check against its witness (``GET
/api/v1/audit/status``); with none yet, or when asked (``verify=1``), the chain is verified
now as ``GET /api/v1/audit/verify`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shamal.security import AuditEntry, AuditLog, AuditWatch, ChainReport
from shamal.webui._common import Route, context, service_of
from shamal.webui._render import page
from shamal.webui._session import SessionPrincipal

PER_PAGE = 50
#: Entries one page reads at most while looking for those of an object (the log itself
#: filters only by actor and action): past it, the page says where it stopped.
MAX_SCANNED = 5000
_BATCH = 500
#: Characters of an entry's detail shown (the rest is cut, and says so).
MAX_DETAIL = 1000


@dataclass(frozen=True)
class AuditFilter:
    actor: str
    action: str
    target: str
    before: int | None


@dataclass(frozen=True)
class AuditPage:
    """One page: its entries, the ``before`` of the next page (None: no older entries)
    and how many entries were read to find them."""

    entries: list[AuditEntry]
    next_before: int | None
    scanned: int
    stopped_early: bool


def find_entries(audit: AuditLog, wanted: AuditFilter) -> AuditPage:
    """The newest :data:`PER_PAGE` entries older than ``wanted.before`` that match: actor
    and action by the log's own (exact) filters, the object (target) as a part of it, by
    reading on, :data:`MAX_SCANNED` entries at most."""
    batch_size = _BATCH if wanted.target else PER_PAGE + 1
    found: list[AuditEntry] = []
    cursor, scanned = wanted.before, 0
    while scanned < MAX_SCANNED:
        batch = audit.entries(
            limit=batch_size,
            before=cursor,
            action=wanted.action or None,
            actor=wanted.actor or None,
        )
        for entry in batch:
            if len(found) == PER_PAGE:
                return AuditPage(found, found[-1].seq, scanned, False)
            scanned += 1
            cursor = entry.seq
            if wanted.target in entry.target:
                found.append(entry)
        if len(batch) < batch_size:
            return AuditPage(found, None, scanned, False)
    return AuditPage(found, cursor, scanned, True)


def compact(detail: Any) -> str:
    """An entry's detail as compact JSON (keys sorted), cut at :data:`MAX_DETAIL`."""
    text = json.dumps(detail, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


@dataclass(frozen=True)
class ChainState:
    """The verification the page shows: its report, when it was made (ms) and whether it
    was made now or is the server's last check."""

    report: ChainReport
    checked_at_ms: int
    now: bool


def chain_state(watch: AuditWatch, *, verify: bool) -> ChainState:
    """The server's last check of the chain, or a verification now when there is none
    yet or ``verify``."""
    last = None if verify else watch.last()
    if last is not None:
        try:
            report = ChainReport(**last["report"])
            at = int(float(last.get("checked_at") or 0) * 1000)
            return ChainState(report, at, now=False)
        except (TypeError, ValueError):
            pass  # an unreadable record: verify now instead
    report = watch.verify()
    return ChainState(report, int(datetime.now(UTC).timestamp() * 1000), now=True)


def _ts_ms(entry: AuditEntry) -> int:
    ts = entry.ts if entry.ts.tzinfo else entry.ts.replace(tzinfo=UTC)
    return int(ts.timestamp() * 1000)


async def audit_page(
    request: Request,
    principal: SessionPrincipal,
    actor: Annotated[str, Query(max_length=128)] = "",
    action: Annotated[str, Query(max_length=128)] = "",
    target: Annotated[str, Query(alias="object", max_length=512)] = "",
    before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    verify: Annotated[bool, Query()] = False,
) -> Response:
    """The audit log, newest first, 50 a page, filtered by actor, action and object, with
    the chain's verification (platform admins only)."""
    principal.require_admin()
    audit = service_of(request, "audit", AuditLog)
    watch = service_of(request, "audit_watch", AuditWatch)
    wanted = AuditFilter(actor.strip(), action.strip(), target.strip(), before)
    found = await run_in_threadpool(find_entries, audit, wanted)
    chain = await run_in_threadpool(lambda: chain_state(watch, verify=verify))
    values = context(
        request,
        principal,
        "Audit log",
        rows=[(e, _ts_ms(e), compact(e.detail)) for e in found.entries],
        found=found,
        wanted=wanted,
        chain=chain,
        max_scanned=MAX_SCANNED,
    )
    return page("audit.html", values)


ROUTES = [Route("/ui/audit", audit_page)]
