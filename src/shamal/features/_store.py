"""SQL access for the feature store's registry and materializations. ORM rows never leave
this module; the service owns transactions."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shamal.db.models import FeatureApplyRow, FeatureMaterializationRow, FeatureObjectRow
from shamal.errors import Conflict, NotFound
from shamal.features._entities import FeatureObject, Materialization, MaterializeState

__all__ = [
    "add_apply",
    "finish_materialization",
    "history",
    "latest_apply",
    "live_objects",
    "materialization",
    "materializations",
    "object_version",
    "progress",
    "start_materialization",
]


def _object(row: FeatureObjectRow) -> FeatureObject:
    return FeatureObject(
        kind=row.kind,
        name=row.name,
        version=row.version,
        owner=row.team_name,
        definition=dict(row.definition),
        digest=row.digest,
        deleted=row.deleted,
        apply_number=row.apply_number,
        created_by=row.created_by,
        created_at=row.created_at,
    )


def latest_apply(s: Session) -> int:
    """The registry's number: that of the last apply (0 before the first)."""
    return int(s.execute(select(func.max(FeatureApplyRow.number))).scalar_one_or_none() or 0)


def live_objects(s: Session) -> list[FeatureObject]:
    """The newest version of every definition that is not deleted, by kind and name."""
    newest = (
        select(
            FeatureObjectRow.kind,
            FeatureObjectRow.name,
            func.max(FeatureObjectRow.version).label("version"),
        )
        .group_by(FeatureObjectRow.kind, FeatureObjectRow.name)
        .subquery()
    )
    rows = s.scalars(
        select(FeatureObjectRow)
        .join(
            newest,
            (FeatureObjectRow.kind == newest.c.kind)
            & (FeatureObjectRow.name == newest.c.name)
            & (FeatureObjectRow.version == newest.c.version),
        )
        .where(FeatureObjectRow.deleted.is_(False))
        .order_by(FeatureObjectRow.kind, FeatureObjectRow.name)
    )
    return [_object(row) for row in rows]


def history(s: Session, kind: str, name: str) -> list[FeatureObject]:
    """Every version of one definition, newest first."""
    rows = s.scalars(
        select(FeatureObjectRow)
        .where(FeatureObjectRow.kind == kind, FeatureObjectRow.name == name)
        .order_by(FeatureObjectRow.version.desc())
    )
    found = [_object(row) for row in rows]
    if not found:
        raise NotFound(f"no {kind.replace('_', ' ')} named {name!r}")
    return found


def object_version(s: Session, kind: str, name: str, version: int) -> FeatureObject:
    row = s.get(FeatureObjectRow, (kind, name, version))
    if row is None:
        raise NotFound(f"{kind.replace('_', ' ')} {name!r} has no version {version}")
    return _object(row)


def _newest_versions(s: Session, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    for kind, name in keys:
        number = s.execute(
            select(func.max(FeatureObjectRow.version)).where(
                FeatureObjectRow.kind == kind, FeatureObjectRow.name == name
            )
        ).scalar_one_or_none()
        found[(kind, name)] = int(number or 0)
    return found


def add_apply(
    s: Session,
    expected: int,
    writes: list[dict[str, Any]],
    changes: list[dict[str, Any]],
    digest: str,
    actor: str,
    now: datetime,
) -> tuple[int, list[FeatureObject]]:
    """Record an apply as registry number ``expected + 1`` and write one new version of each
    object in ``writes`` (``kind``, ``name``, ``team``: (name, id), ``definition``,
    ``digest``, ``deleted``).

    Raises:
        Conflict: another apply took the number first (plan again, then apply).
    """
    number = expected + 1
    if latest_apply(s) != expected:
        raise Conflict("the feature registry changed since it was read; plan again, then apply")
    s.add(
        FeatureApplyRow(
            number=number, digest=digest, changes=changes, created_by=actor, created_at=now
        )
    )
    try:
        s.flush()
    except IntegrityError:
        raise Conflict("another apply ran at the same time; plan again, then apply") from None
    versions = _newest_versions(s, [(w["kind"], w["name"]) for w in writes])
    rows = []
    for write in writes:
        team_name, team_id = write["team"]
        row = FeatureObjectRow(
            kind=write["kind"],
            name=write["name"],
            version=versions[(write["kind"], write["name"])] + 1,
            apply_number=number,
            team_id=team_id,
            team_name=team_name,
            definition=write["definition"],
            digest=write["digest"],
            deleted=write["deleted"],
            created_by=actor,
            created_at=now,
        )
        s.add(row)
        rows.append(row)
    s.flush()
    return number, [_object(row) for row in rows]


# ---------------------------------------------------------------------- materializations
def _materialization(row: FeatureMaterializationRow) -> Materialization:
    return Materialization(
        id=row.id,
        view=row.view,
        view_version=row.view_version,
        source=row.source,
        store=row.store,
        start=row.start_ts,
        end=row.end_ts,
        state=MaterializeState(row.state),
        chunks_done=row.chunks_done,
        chunks_total=row.chunks_total,
        rows=row.rows,
        error=row.error,
        created_by=row.created_by,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def start_materialization(
    s: Session,
    view: tuple[str, int],
    source: str,
    store: str,
    window: tuple[datetime | None, datetime],
    actor: str,
    now: datetime,
) -> Materialization:
    row = FeatureMaterializationRow(
        id=uuid.uuid4().hex,
        view=view[0],
        view_version=view[1],
        source=source,
        store=store,
        start_ts=window[0],
        end_ts=window[1],
        state=MaterializeState.RUNNING.value,
        chunks_done=0,
        chunks_total=0,
        rows=0,
        error=None,
        created_by=actor,
        started_at=now,
        finished_at=None,
    )
    s.add(row)
    s.flush()
    return _materialization(row)


def progress(s: Session, run_id: str, chunks_done: int, chunks_total: int, rows: int) -> None:
    s.execute(
        update(FeatureMaterializationRow)
        .where(FeatureMaterializationRow.id == run_id)
        .values(chunks_done=chunks_done, chunks_total=chunks_total, rows=rows)
        .execution_options(synchronize_session=False)
    )


def finish_materialization(
    s: Session, run_id: str, state: MaterializeState, error: str | None, now: datetime
) -> Materialization:
    s.execute(
        update(FeatureMaterializationRow)
        .where(FeatureMaterializationRow.id == run_id)
        .values(state=state.value, error=error, finished_at=now)
        .execution_options(synchronize_session=False)
    )
    return materialization(s, run_id)


def materialization(s: Session, run_id: str) -> Materialization:
    row = s.get(FeatureMaterializationRow, run_id)
    if row is None:
        raise NotFound(f"no materialization {run_id!r}")
    return _materialization(row)


def materializations(
    s: Session, view: str | None = None, *, limit: int = 100
) -> list[Materialization]:
    """Materializations, newest first (of one view when ``view`` is given)."""
    query = select(FeatureMaterializationRow)
    if view is not None:
        query = query.where(FeatureMaterializationRow.view == view)
    rows = s.scalars(
        query.order_by(
            FeatureMaterializationRow.started_at.desc(), FeatureMaterializationRow.id
        ).limit(limit)
    )
    return [_materialization(row) for row in rows]
