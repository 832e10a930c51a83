"""The audit log service: append inside the caller's transaction, verify the chain."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.db import Database
from shamal.errors import InvalidParameter
from shamal.security import _store
from shamal.security._chain import entry_hash, verify_chain
from shamal.security._entities import AuditEntry, ChainReport, Principal

logger = logging.getLogger(__name__)


@dataclass
class AuditContext:
    """One state-changing request on its way through the services.

    A service calls :meth:`AuditLog.record` with it inside its own unit of work,
    so the change and its audit entry commit together. Whatever the service
    did not record (a failure, a rejection) the API layer records afterwards.
    """

    action: str
    actor: str
    principal: Principal | None = None
    target: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    recorded: bool = False

    def require_principal(self) -> Principal:
        if self.principal is None:  # pragma: no cover - the API guarantees one
            raise RuntimeError("audit context without a principal")
        return self.principal


def _name_the_job(ctx: AuditContext) -> None:
    """An entry made with a job's token names the job (its id's first 12 characters): the
    actor is the person the job acts for, the job is what acted."""
    job = ctx.principal.job if ctx.principal is not None else None
    if job is not None:
        ctx.detail.setdefault("job", job)


def _owner_only(path: Path) -> None:
    """Whoever reads the key can re-sign the chain: only its owner may (0600, in a 0700
    folder); looser modes are taken back, with a warning."""
    for item, wanted in ((path.parent, 0o700), (path, 0o600)):
        mode = stat.S_IMODE(item.stat().st_mode)
        if mode & 0o077:
            logger.warning("%s was open to others (mode %o); now %o", item, mode, wanted)
            item.chmod(wanted)


def load_or_create_key(path: Path, configured: str | None) -> bytes:
    """The audit chain key: from settings (hex), else a 0600 file made on first use."""
    if configured:
        try:
            key = bytes.fromhex(configured)
        except ValueError:
            raise InvalidParameter("SHAMAL_AUDIT_KEY must be hex") from None
        if len(key) < 32:
            raise InvalidParameter("SHAMAL_AUDIT_KEY must hold at least 32 bytes (64 hex digits)")
        return key
    if path.exists():
        _owner_only(path)
        return bytes.fromhex(path.read_text().strip())
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key_hex = secrets.token_hex(32)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key_hex + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, path)  # atomic, and never replaces a key another process made first
    except FileExistsError:
        key_hex = path.read_text().strip()
    finally:
        tmp.unlink()
    return bytes.fromhex(key_hex)


class AuditLog:
    """Append-only, hash-chained record of every change of state.

    Appends serialize on the chain head row (a row lock on PostgreSQL, the write
    lock on SQLite), so the chain stays linear with any number of writers.
    """

    def __init__(self, db: Database, key: bytes, clock: Clock = utc_now) -> None:
        self._db = db
        self._key = key
        self._clock = clock

    def append(
        self,
        session: Session,
        *,
        actor: str,
        action: str,
        target: str,
        outcome: str,
        detail: Mapping[str, Any] | None = None,
    ) -> AuditEntry:
        """Append one entry inside ``session``'s transaction."""
        seq, prev = _store.lock_audit_head(session)
        ts = self._clock().astimezone(UTC)  # stored naive UTC; hashed as read back
        fields: dict[str, Any] = {
            "seq": seq + 1,
            "ts": ts,
            "actor": actor[:128],
            "action": action[:128],
            "target": target[:512],
            "outcome": outcome[:64],
            "detail": dict(detail or {}),
            "prev_hash": prev,
        }
        entry = AuditEntry(**fields, hash=entry_hash(self._key, fields))
        _store.append_audit(session, entry)
        return entry

    def record(self, session: Session, ctx: AuditContext, target: str, **detail: Any) -> AuditEntry:
        """Record the success of ``ctx`` inside the service's own transaction."""
        ctx.target = target
        ctx.detail.update(detail)
        _name_the_job(ctx)
        entry = self.append(
            session,
            actor=ctx.actor,
            action=ctx.action,
            target=target,
            outcome="ok",
            detail=ctx.detail,
        )
        ctx.recorded = True
        return entry

    def record_outcome(self, ctx: AuditContext, outcome: str) -> None:
        """Record what a service did not: a rejection or failure, in a transaction of its own."""
        _name_the_job(ctx)

        def work(session: Session) -> None:
            self.append(
                session,
                actor=ctx.actor,
                action=ctx.action,
                target=ctx.target,
                outcome=outcome,
                detail=ctx.detail,
            )

        self._db.run(work)
        ctx.recorded = True

    def entries(
        self,
        *,
        limit: int = 100,
        before: int | None = None,
        action: str | None = None,
        actor: str | None = None,
    ) -> list[AuditEntry]:
        """Newest first; page with ``before`` = the smallest ``seq`` already seen."""
        with self._db.unit_of_work(write=False) as s:
            return _store.list_audit(s, limit=limit, before=before, action=action, actor=actor)

    def verify(self, witness: tuple[int, str] | None = None) -> ChainReport:
        """Check every link; the report names the first broken one.

        Args:
            witness: ``(head_seq, head_hash)`` of an earlier report, kept outside
                the database; catches a tail cut together with a rewound head.
        """
        with self._db.unit_of_work(write=False) as s:
            head_seq, head_hash = _store.read_audit_head(s)
            return verify_chain(self._key, _store.iter_audit(s), head_seq, head_hash, witness)
