"""Monitoring's rows in and out: ORM rows never leave this module.

A monitor run is guarded twice: its lease (``claim`` sets ``lease_owner`` when it is free
or expired, and, for a scheduled run, only while the monitor is due) keeps a second server
or a slow run meeting the next tick out; ``finish`` moves the cursor by compare-and-set
under the lease, so a run whose lease was taken from it stores nothing.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from shamal.db.models import MonitorPointRow, MonitorReferenceRow, MonitorResultRow, MonitorRow
from shamal.errors import NotFound
from shamal.monitoring._entities import (
    ColumnRole,
    Monitor,
    MonitorResult,
    ReferenceColumn,
    ReferenceProfile,
    SeriesPoint,
)
from shamal.monitoring._rules import parse_on_drift
from shamal.monitoring.core import ColumnSketch

__all__ = ["MonitorRef"]


def not_found(name: str) -> NotFound:
    return NotFound(f"monitor {name!r} does not exist")


# ---------------------------------------------------------------------- references
def _profile(row: MonitorReferenceRow) -> ReferenceProfile:
    columns = {
        name: ReferenceColumn(name, ColumnRole(raw["role"]), ColumnSketch.from_json(raw["sketch"]))
        for name, raw in row.columns.items()
    }
    return ReferenceProfile(
        model=row.model,
        version=row.version,
        dataset=row.dataset,
        dataset_version=row.dataset_version,
        rows=row.rows,
        columns=columns,
        chunks=row.chunks,
        created_by=row.created_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def reference(s: Session, model: str, version: int) -> ReferenceProfile | None:
    row = s.scalar(
        select(MonitorReferenceRow).where(
            MonitorReferenceRow.model == model, MonitorReferenceRow.version == version
        )
    )
    return None if row is None else _profile(row)


def references(s: Session, model: str, limit: int) -> list[ReferenceProfile]:
    """The profiles of ``model``'s versions, newest version first."""
    rows = s.scalars(
        select(MonitorReferenceRow)
        .where(MonitorReferenceRow.model == model)
        .order_by(MonitorReferenceRow.version.desc())
        .limit(limit)
    )
    return [_profile(r) for r in rows]


def save_reference(s: Session, new_id: str, profile: ReferenceProfile) -> None:
    """Insert the profile, or replace the one of its model version (locked first)."""
    row = s.scalar(
        select(MonitorReferenceRow)
        .where(
            MonitorReferenceRow.model == profile.model,
            MonitorReferenceRow.version == profile.version,
        )
        .with_for_update()
    )
    columns = {name: c.to_json() for name, c in profile.columns.items()}
    if row is None:
        row = MonitorReferenceRow(
            id=new_id,
            model=profile.model,
            version=profile.version,
            created_by=profile.created_by,
            created_at=profile.created_at,
        )
        s.add(row)
    row.dataset = profile.dataset
    row.dataset_version = profile.dataset_version
    row.rows = profile.rows
    row.columns = columns
    row.chunks = dict(profile.chunks) if profile.chunks is not None else None
    row.updated_at = profile.updated_at
    s.flush()


def delete_reference(s: Session, model: str, version: int) -> bool:
    done = s.execute(
        delete(MonitorReferenceRow).where(
            MonitorReferenceRow.model == model, MonitorReferenceRow.version == version
        )
    )
    return bool(getattr(done, "rowcount", 0))


# ---------------------------------------------------------------------- monitors
@dataclass(frozen=True, slots=True)
class MonitorRef:
    """A monitor's identity and owner: enough to check access."""

    id: str
    team_id: str | None
    lease_owner: str | None
    lease_until: datetime | None


def _monitor(row: MonitorRow) -> Monitor:
    spec: dict[str, Any] = row.spec
    return Monitor(
        name=row.name,
        deployment=row.deployment,
        team=row.team_name,
        reference_model=spec["reference"]["model"],
        reference_version=int(spec["reference"]["version"]),
        columns=tuple(spec.get("columns", ())),
        tests=dict(spec.get("tests", {})),
        threshold=spec.get("threshold"),
        correction=spec.get("correction", "none"),
        drift_share=float(spec.get("drift_share", 0.5)),
        window=int(spec.get("window", 1000)),
        on_drift=parse_on_drift(spec.get("on_drift", "none")),
        retrain_params=dict(spec.get("retrain_params", {})),
        follows=bool(spec["reference"].get("follows", False)),
        schedule_s=row.schedule_s,
        paused=row.paused,
        cursor=row.cursor,
        label_cursor=row.label_cursor,
        next_run_at=row.next_run_at,
        last_run_at=row.last_run_at,
        last_error=row.last_error,
        webhook_id=row.webhook_id,
        created_by=row.created_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _ref(row: MonitorRow) -> MonitorRef:
    return MonitorRef(row.id, row.team_id, row.lease_owner, row.lease_until)


def insert_monitor(
    s: Session, monitor_id: str, team_id: str | None, m: Monitor, spec: dict[str, Any]
) -> None:
    s.add(
        MonitorRow(
            id=monitor_id,
            name=m.name,
            deployment=m.deployment,
            team_id=team_id,
            team_name=m.team,
            spec=spec,
            schedule_s=m.schedule_s,
            paused=m.paused,
            cursor=m.cursor,
            label_cursor=m.label_cursor,
            next_run_at=m.next_run_at,
            last_run_at=None,
            last_error=None,
            webhook_id=m.webhook_id,
            created_by=m.created_by,
            created_at=m.created_at,
            updated_at=m.updated_at,
        )
    )
    s.flush()


def find(s: Session, name: str, *, lock: bool = False) -> tuple[MonitorRef, Monitor] | None:
    query = select(MonitorRow).where(MonitorRow.name == name)
    if lock:
        query = query.with_for_update()
    row = s.scalar(query)
    return None if row is None else (_ref(row), _monitor(row))


def list_monitors(
    s: Session,
    visible: Collection[str] | None,
    deployment: str | None,
    limit: int,
    after: str | None,
) -> list[Monitor]:
    """By name; ``visible``: the team ids the caller may read (None: every monitor)."""
    query = select(MonitorRow).order_by(MonitorRow.name).limit(limit)
    if visible is not None:
        query = query.where(MonitorRow.team_id.in_(list(visible)))
    if deployment is not None:
        query = query.where(MonitorRow.deployment == deployment)
    if after is not None:
        query = query.where(MonitorRow.name > after)
    return [_monitor(r) for r in s.scalars(query)]


def set_paused(
    s: Session, monitor_id: str, paused: bool, next_run_at: datetime, now: datetime
) -> None:
    s.execute(
        update(MonitorRow)
        .where(MonitorRow.id == monitor_id)
        .values(paused=paused, next_run_at=next_run_at, updated_at=now)
    )


def set_reference(
    s: Session, monitor_id: str, owner: str, model: str, version: int, now: datetime
) -> bool:
    """Point the monitor at another reference, under ``owner``'s lease (False: it is no
    longer ``owner``'s, nothing changed)."""
    row = s.scalar(
        select(MonitorRow)
        .where(MonitorRow.id == monitor_id, MonitorRow.lease_owner == owner)
        .with_for_update()
    )
    if row is None:
        return False
    spec = dict(row.spec)
    spec["reference"] = {**spec["reference"], "model": model, "version": version}
    row.spec = spec  # a new dict: the JSON column sees the change
    row.updated_at = now
    s.flush()
    return True


def remove(s: Session, monitor_id: str) -> None:
    s.execute(delete(MonitorPointRow).where(MonitorPointRow.monitor_id == monitor_id))
    s.execute(delete(MonitorResultRow).where(MonitorResultRow.monitor_id == monitor_id))
    s.execute(delete(MonitorRow).where(MonitorRow.id == monitor_id))


def due(s: Session, now: datetime, limit: int) -> list[str]:
    """Names of unpaused monitors due now whose lease is free or expired, soonest first."""
    query = (
        select(MonitorRow.name)
        .where(
            MonitorRow.paused.is_(False),
            MonitorRow.next_run_at <= now,
            or_(MonitorRow.lease_owner.is_(None), MonitorRow.lease_until < now),
        )
        .order_by(MonitorRow.next_run_at)
        .limit(limit)
    )
    return list(s.scalars(query))


def claim(
    s: Session,
    monitor_id: str,
    owner: str,
    now: datetime,
    until: datetime,
    *,
    scheduled: bool,
) -> bool:
    """Take the monitor's lease (free or expired); a scheduled run also needs it due and
    unpaused. False: another run holds it, or another server ran this tick."""
    conditions = [
        MonitorRow.id == monitor_id,
        or_(MonitorRow.lease_owner.is_(None), MonitorRow.lease_until < now),
    ]
    if scheduled:
        conditions += [MonitorRow.paused.is_(False), MonitorRow.next_run_at <= now]
    done = s.execute(
        update(MonitorRow).where(*conditions).values(lease_owner=owner, lease_until=until)
    )
    return bool(getattr(done, "rowcount", 0))


def finish(
    s: Session,
    monitor_id: str,
    owner: str,
    *,
    cursor: int,
    next_run_at: datetime,
    now: datetime,
    error: str | None,
    label_cursor: int | None = None,
) -> bool:
    """Release ``owner``'s lease, moving the cursors, the next run and the last error;
    False (nothing changed) when the lease is no longer ``owner``'s."""
    values: dict[str, Any] = {
        "lease_owner": None,
        "lease_until": None,
        "cursor": cursor,
        "next_run_at": next_run_at,
        "last_run_at": now,
        "last_error": None if error is None else error[:2000],
    }
    if label_cursor is not None:
        values["label_cursor"] = label_cursor
    done = s.execute(
        update(MonitorRow)
        .where(MonitorRow.id == monitor_id, MonitorRow.lease_owner == owner)
        .values(**values)
    )
    return bool(getattr(done, "rowcount", 0))


# ---------------------------------------------------------------------- results
def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _statistic(value: float | None) -> float | None:
    """A statistic as a float column keeps it: +-inf as +-1e308 (the database's floats end
    there), NaN as None."""
    if value is None or math.isnan(value):
        return None
    return max(-1e308, min(1e308, float(value)))


def insert_result(
    s: Session, monitor_id: str, result: MonitorResult, points: Sequence[SeriesPoint]
) -> None:
    s.add(
        MonitorResultRow(
            id=result.id,
            monitor_id=monitor_id,
            at=result.at,
            first_sample=result.first_sample,
            last_sample=result.last_sample,
            samples=result.samples,
            rows=result.rows,
            drifted=result.drifted,
            share=result.share,
            report=dict(result.report),
            actions=[dict(a) for a in result.actions],
        )
    )
    s.flush()
    for p in points:
        s.add(
            MonitorPointRow(
                result_id=result.id,
                column=p.column,
                monitor_id=monitor_id,
                at=p.at,
                test=p.test,
                statistic=_statistic(p.statistic),
                p_value=_finite(p.p_value),
                threshold=p.threshold,
                drifted=p.drifted,
            )
        )
    s.flush()


def set_actions(s: Session, result_id: str, actions: Sequence[dict[str, Any]]) -> None:
    s.execute(
        update(MonitorResultRow)
        .where(MonitorResultRow.id == result_id)
        .values(actions=list(actions))
    )


def _result(row: MonitorResultRow, monitor: str) -> MonitorResult:
    return MonitorResult(
        id=row.id,
        monitor=monitor,
        at=row.at,
        first_sample=row.first_sample,
        last_sample=row.last_sample,
        samples=row.samples,
        rows=row.rows,
        drifted=row.drifted,
        share=row.share,
        report=row.report,
        actions=tuple(row.actions),
    )


def results(s: Session, monitor_id: str, monitor: str, limit: int) -> list[MonitorResult]:
    """The newest ``limit`` results, newest first."""
    rows = s.scalars(
        select(MonitorResultRow)
        .where(MonitorResultRow.monitor_id == monitor_id)
        .order_by(MonitorResultRow.at.desc(), MonitorResultRow.id.desc())
        .limit(limit)
    )
    return [_result(r, monitor) for r in rows]


def result(s: Session, monitor_id: str, monitor: str, result_id: str) -> MonitorResult | None:
    row = s.get(MonitorResultRow, result_id)
    if row is None or row.monitor_id != monitor_id:
        return None
    return _result(row, monitor)


def series(s: Session, monitor_id: str, column: str | None, limit: int) -> list[SeriesPoint]:
    """The points of the newest ``limit`` results (of ``column`` only, if given), oldest
    first."""
    newest = (
        select(MonitorResultRow.id)
        .where(MonitorResultRow.monitor_id == monitor_id)
        .order_by(MonitorResultRow.at.desc(), MonitorResultRow.id.desc())
        .limit(limit)
    )
    query = select(MonitorPointRow).where(
        MonitorPointRow.monitor_id == monitor_id,
        MonitorPointRow.result_id.in_(list(s.scalars(newest))),
    )
    if column is not None:
        query = query.where(MonitorPointRow.column == column)
    rows = s.scalars(query.order_by(MonitorPointRow.at, MonitorPointRow.column))
    return [
        SeriesPoint(
            column=r.column,
            at=r.at,
            result_id=r.result_id,
            test=r.test,
            statistic=r.statistic,
            p_value=r.p_value,
            threshold=r.threshold,
            drifted=r.drifted,
        )
        for r in rows
    ]
