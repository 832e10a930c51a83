"""SQL access for deployments. ORM rows never leave this module.

Every function takes the caller's session; the service owns transactions. A deployment's
spec and state change only through :func:`update`, a compare-and-set on ``revision``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Select, and_, delete, select
from sqlalchemy import update as sql_update
from sqlalchemy.orm import Session

from shamal.db.models import (
    DeploymentEventRow,
    DeploymentLabelRow,
    DeploymentRow,
    DeploymentSampleRow,
    DeploymentStatsMinuteRow,
    DeploymentStatsRow,
)
from shamal.deployments._entities import (
    Deployment,
    DeploymentEvent,
    Label,
    RolloutPhase,
    RolloutPlan,
    RolloutState,
    Route,
    RouteRole,
    Sample,
    SampledRequest,
    Slo,
    TrafficSplit,
    VersionStats,
)
from shamal.errors import NotFound

logger = logging.getLogger(__name__)

#: Which deployments a caller may see: None = all (platform admins), else these team ids.
Visibility = frozenset[str] | None


@dataclass(frozen=True, slots=True)
class DeploymentRef:
    """What the service needs to check access to a stored deployment."""

    id: str
    team_id: str | None


def not_found(name: str) -> NotFound:
    return NotFound(f"deployment {name!r} does not exist")


def _routes_out(split: TrafficSplit) -> list[dict[str, Any]]:
    return [
        {
            "model": r.model_name,
            "version": r.version,
            "weight": r.weight,
            "role": r.role.value,
            "uri": r.uri,
        }
        for r in split.routes
    ]


def _split(routes: Sequence[Mapping[str, Any]]) -> TrafficSplit:
    return TrafficSplit(
        tuple(
            Route(
                model_name=str(r["model"]),
                version=int(r["version"]),
                weight=int(r["weight"]),
                role=RouteRole(r["role"]),
                uri=str(r.get("uri", "")),
            )
            for r in routes
        )
    )


def _deployment(row: DeploymentRow) -> Deployment:
    return Deployment(
        name=row.name,
        team=row.team_name,
        split=_split(row.routes),
        slo=Slo(row.slo_max_error_rate, row.slo_max_p99_ms, row.slo_min_requests),
        plan=RolloutPlan(tuple(int(s) for s in row.steps), row.interval_s),
        state=RolloutState(
            RolloutPhase(row.phase), row.canary_weight, row.step_index, row.phase_since
        ),
        revision=row.revision,
        sticky_header=row.sticky_header,
        sample_rate=row.sample_rate,
        feature_service=row.feature_service,
        created_by=row.created_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _spec_columns(d: Deployment) -> dict[str, Any]:
    return {
        "revision": d.revision,
        "routes": _routes_out(d.split),
        "slo_max_error_rate": d.slo.max_error_rate,
        "slo_max_p99_ms": d.slo.max_p99_ms,
        "slo_min_requests": d.slo.min_requests,
        "steps": list(d.plan.steps),
        "interval_s": d.plan.interval_s,
        "sticky_header": d.sticky_header,
        "sample_rate": d.sample_rate,
        "feature_service": d.feature_service,
        "phase": d.state.phase.value,
        "canary_weight": d.state.canary_weight,
        "step_index": d.state.step_index,
        "phase_since": d.state.since,
        "updated_at": d.updated_at,
    }


def find(s: Session, name: str, *, lock: bool = False) -> tuple[DeploymentRef, Deployment] | None:
    """The deployment named ``name`` (``lock``: hold its row until the transaction ends)."""
    query = select(DeploymentRow).where(DeploymentRow.name == name)
    if lock:
        query = query.with_for_update()
    row = s.scalars(query).one_or_none()
    if row is None:
        return None
    return DeploymentRef(row.id, row.team_id), _deployment(row)


def insert(s: Session, deployment_id: str, team_id: str | None, d: Deployment) -> None:
    s.add(
        DeploymentRow(
            id=deployment_id,
            name=d.name,
            team_id=team_id,
            team_name=d.team,
            created_by=d.created_by,
            created_at=d.created_at,
            **_spec_columns(d),
        )
    )
    s.flush()


def update(s: Session, deployment_id: str, expected_revision: int, d: Deployment) -> bool:
    """Store ``d`` if the stored revision is still ``expected_revision``; False if it moved."""
    result = s.execute(
        sql_update(DeploymentRow)
        .where(DeploymentRow.id == deployment_id, DeploymentRow.revision == expected_revision)
        .values(**_spec_columns(d))
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def remove(s: Session, deployment_id: str) -> None:
    for table in (DeploymentEventRow, DeploymentSampleRow, DeploymentStatsRow):
        s.execute(delete(table).where(table.deployment_id == deployment_id))
    s.execute(delete(DeploymentRow).where(DeploymentRow.id == deployment_id))


def list_deployments(
    s: Session, visible: Visibility, limit: int, after: str | None = None
) -> list[Deployment]:
    """By name; ``after``: only the names after it (a keyset page)."""
    query = select(DeploymentRow).order_by(DeploymentRow.name).limit(limit)
    if after is not None:
        query = query.where(DeploymentRow.name > after)
    if visible is not None:
        query = query.where(DeploymentRow.team_id.in_(visible))
    return [_deployment(row) for row in s.scalars(query)]


def serving(
    s: Session, visible: Visibility, model_name: str, version: int, limit: int
) -> list[Deployment]:
    """Deployments ``visible`` allows whose routes (primary, canary or shadow) serve
    ``version`` of ``model_name``, by name, at most ``limit``. The routes are JSON, read here
    rather than matched in SQL: deployments are few."""
    query = select(DeploymentRow).order_by(DeploymentRow.name)
    if visible is not None:
        query = query.where(DeploymentRow.team_id.in_(visible))
    found: list[Deployment] = []
    for row in s.scalars(query):
        served = {(r.get("model"), r.get("version")) for r in row.routes}
        if (model_name, version) in served:
            found.append(_deployment(row))
            if len(found) == limit:
                break
    return found


def feature_services(s: Session) -> frozenset[str]:
    """The feature services deployments name."""
    rows = s.execute(
        select(DeploymentRow.feature_service).where(DeploymentRow.feature_service.is_not(None))
    ).scalars()
    return frozenset(name for name in rows if name)


def progressing(s: Session) -> list[str]:
    """Names of the deployments whose canary is progressing."""
    query = select(DeploymentRow.name).where(DeploymentRow.phase == RolloutPhase.PROGRESSING.value)
    return list(s.scalars(query.order_by(DeploymentRow.name)))


# ---------------------------------------------------------------------- events
def add_event(
    s: Session,
    deployment_id: str,
    *,
    at: datetime,
    revision: int,
    kind: str,
    actor: str,
    reason: str,
    detail: Mapping[str, Any],
) -> None:
    s.add(
        DeploymentEventRow(
            deployment_id=deployment_id,
            at=at,
            revision=revision,
            kind=kind,
            actor=actor[:256],
            reason=reason,
            detail=dict(detail),
        )
    )


def breached_versions(s: Session, deployment_id: str, revision: int) -> set[str]:
    """The versions already recorded as breaking the SLO under ``revision``."""
    details = s.scalars(
        select(DeploymentEventRow.detail).where(
            DeploymentEventRow.deployment_id == deployment_id,
            DeploymentEventRow.revision == revision,
            DeploymentEventRow.kind == "slo_breach",
        )
    )
    return {str(detail.get("version")) for detail in details}


def events(s: Session, deployment_id: str, limit: int) -> list[DeploymentEvent]:
    """The newest ``limit`` events, oldest first."""
    rows = s.scalars(
        select(DeploymentEventRow)
        .where(DeploymentEventRow.deployment_id == deployment_id)
        .order_by(DeploymentEventRow.id.desc())
        .limit(limit)
    ).all()
    return [
        DeploymentEvent(
            id=r.id,
            at=r.at,
            revision=r.revision,
            kind=r.kind,
            actor=r.actor,
            reason=r.reason,
            detail=dict(r.detail),
        )
        for r in reversed(rows)
    ]


# ---------------------------------------------------------------------- statistics
def _accumulate(
    s: Session,
    model: type[DeploymentStatsRow] | type[DeploymentStatsMinuteRow],
    key: Mapping[str, Any],
    stats: VersionStats,
) -> None:
    """Add ``stats`` to the row of ``model`` at ``key`` (made when missing): read-modify-write,
    so the caller holds the deployment's row lock."""
    row = cast(
        "DeploymentStatsRow | DeploymentStatsMinuteRow | None", s.get(model, tuple(key.values()))
    )
    if row is None:
        s.add(
            model(
                **key,
                requests=stats.requests,
                errors=stats.errors,
                latency_counts=list(stats.latency_counts),
            )
        )
    else:
        width = max(len(row.latency_counts), len(stats.latency_counts))
        old = list(row.latency_counts) + [0] * (width - len(row.latency_counts))
        new = list(stats.latency_counts) + [0] * (width - len(stats.latency_counts))
        row.requests += stats.requests
        row.errors += stats.errors
        row.latency_counts = [a + b for a, b in zip(old, new, strict=True)]
    s.flush()


def add_stats(
    s: Session, deployment_id: str, revision: int, version: str, stats: VersionStats
) -> None:
    """Add one report's statistics for a version to its window."""
    key = {"deployment_id": deployment_id, "revision": revision, "version": version}
    _accumulate(s, DeploymentStatsRow, key, stats)


def add_minute_stats(
    s: Session, deployment_id: str, minute: datetime, version: str, stats: VersionStats
) -> None:
    """Add one report's statistics to the version's row of ``minute``."""
    key = {"deployment_id": deployment_id, "minute": minute, "version": version}
    _accumulate(s, DeploymentStatsMinuteRow, key, stats)


def drop_minute_stats_before(s: Session, deployment_id: str, cutoff: datetime) -> None:
    s.execute(
        delete(DeploymentStatsMinuteRow).where(
            DeploymentStatsMinuteRow.deployment_id == deployment_id,
            DeploymentStatsMinuteRow.minute < cutoff,
        )
    )


def minute_stats(
    s: Session, deployment_id: str, since: datetime
) -> list[tuple[datetime, str, VersionStats]]:
    """(minute, version, its calls) since ``since``, oldest first."""
    rows = s.scalars(
        select(DeploymentStatsMinuteRow)
        .where(
            DeploymentStatsMinuteRow.deployment_id == deployment_id,
            DeploymentStatsMinuteRow.minute >= since,
        )
        .order_by(DeploymentStatsMinuteRow.minute, DeploymentStatsMinuteRow.version)
    )
    return [
        (r.minute, r.version, VersionStats(r.requests, r.errors, tuple(r.latency_counts)))
        for r in rows
    ]


def window_stats(s: Session, deployment_id: str, revision: int) -> dict[str, VersionStats]:
    rows = s.scalars(
        select(DeploymentStatsRow).where(
            DeploymentStatsRow.deployment_id == deployment_id,
            DeploymentStatsRow.revision == revision,
        )
    )
    return {
        r.version: VersionStats(r.requests, r.errors, tuple(int(c) for c in r.latency_counts))
        for r in rows
    }


def drop_stats_before(s: Session, deployment_id: str, revision: int) -> None:
    s.execute(
        delete(DeploymentStatsRow).where(
            DeploymentStatsRow.deployment_id == deployment_id,
            DeploymentStatsRow.revision < revision,
        )
    )


# ---------------------------------------------------------------------- samples
def add_samples(
    s: Session,
    deployment_id: str,
    at: datetime,
    samples: Collection[SampledRequest],
    keep: int,
) -> None:
    """Store samples; keep the deployment's newest ``keep``."""
    for sample in samples:
        s.add(
            DeploymentSampleRow(
                deployment_id=deployment_id,
                at=at,
                revision=sample.revision,
                version=sample.version,
                shadow=sample.shadow,
                inputs=dict(sample.inputs),
                outputs=dict(sample.outputs),
                request_id=sample.request_id,
            )
        )
    s.flush()
    _keep_newest(s, DeploymentSampleRow, deployment_id, keep)


def _keep_newest(
    s: Session,
    table: type[DeploymentSampleRow] | type[DeploymentLabelRow],
    deployment_id: str,
    keep: int,
) -> None:
    """Delete the deployment's rows of ``table`` older than its newest ``keep``."""
    oldest_kept = s.scalar(
        select(table.id)
        .where(table.deployment_id == deployment_id)
        .order_by(table.id.desc())
        .offset(keep - 1)
        .limit(1)
    )
    if oldest_kept is not None:
        s.execute(delete(table).where(table.deployment_id == deployment_id, table.id < oldest_kept))


def _sample_query(
    deployment_id: str,
) -> Select[DeploymentSampleRow, DeploymentLabelRow]:
    """The deployment's samples, each with the label posted for its request (if any)."""
    return (
        select(DeploymentSampleRow, DeploymentLabelRow)
        .outerjoin(
            DeploymentLabelRow,
            and_(
                DeploymentLabelRow.deployment_id == DeploymentSampleRow.deployment_id,
                DeploymentLabelRow.request_id == DeploymentSampleRow.request_id,
            ),
        )
        .where(DeploymentSampleRow.deployment_id == deployment_id)
    )


def _sample(r: DeploymentSampleRow, label: DeploymentLabelRow | None) -> Sample:
    return Sample(
        id=r.id,
        at=r.at,
        revision=r.revision,
        version=r.version,
        shadow=r.shadow,
        inputs=dict(r.inputs),
        outputs=dict(r.outputs),
        request_id=r.request_id,
        label=None if label is None else label.value,
        labelled_at=None if label is None else label.at,
    )


def samples(s: Session, deployment_id: str, limit: int, before: int | None = None) -> list[Sample]:
    """The newest ``limit`` samples, newest first; ``before``: only those older than the
    sample of that id (a keyset page)."""
    query = _sample_query(deployment_id).order_by(DeploymentSampleRow.id.desc()).limit(limit)
    if before is not None:
        query = query.where(DeploymentSampleRow.id < before)
    return [_sample(r, label) for r, label in s.execute(query)]


def samples_after(s: Session, deployment_id: str, after: int, limit: int) -> list[Sample]:
    """The oldest ``limit`` samples newer than the sample of id ``after``, oldest first."""
    query = (
        _sample_query(deployment_id)
        .where(DeploymentSampleRow.id > after)
        .order_by(DeploymentSampleRow.id)
        .limit(limit)
    )
    return [_sample(r, label) for r, label in s.execute(query)]


def labelled_after(
    s: Session, deployment_id: str, after: int, limit: int
) -> list[tuple[int, Sample]]:
    """The samples whose label was posted (or posted again) after the label of id ``after``,
    in the order the labels came, each with its label's id (a later post of a label gets a
    new id, so a corrected label is read again)."""
    query = (
        select(DeploymentSampleRow, DeploymentLabelRow)
        .join(
            DeploymentLabelRow,
            and_(
                DeploymentLabelRow.deployment_id == DeploymentSampleRow.deployment_id,
                DeploymentLabelRow.request_id == DeploymentSampleRow.request_id,
            ),
        )
        .where(DeploymentSampleRow.deployment_id == deployment_id, DeploymentLabelRow.id > after)
        .order_by(DeploymentLabelRow.id)
        .limit(limit)
    )
    return [(label.id, _sample(r, label)) for r, label in s.execute(query)]


def add_labels(
    s: Session, deployment_id: str, at: datetime, labels: Sequence[Label], keep: int
) -> tuple[str, ...]:
    """Store labels (one posted again replaces the first); keep the deployment's newest
    ``keep``. Returns the request ids no kept sample has."""
    ids = [label.request_id for label in labels]
    s.execute(
        delete(DeploymentLabelRow).where(
            DeploymentLabelRow.deployment_id == deployment_id,
            DeploymentLabelRow.request_id.in_(ids),
        )
    )
    for label in labels:
        s.add(
            DeploymentLabelRow(
                deployment_id=deployment_id, request_id=label.request_id, value=label.value, at=at
            )
        )
    s.flush()
    _keep_newest(s, DeploymentLabelRow, deployment_id, keep)
    sampled = set(
        s.scalars(
            select(DeploymentSampleRow.request_id).where(
                DeploymentSampleRow.deployment_id == deployment_id,
                DeploymentSampleRow.request_id.in_(ids),
            )
        )
    )
    return tuple(request_id for request_id in ids if request_id not in sampled)
