"""SQL access for pipelines. ORM rows never leave this module.

Every function takes the caller's session; the service owns transactions. A step's state
moves only through :func:`move_step`, a compare-and-set on its current state, and a run is
advanced by whoever holds its lease (:func:`claim_run`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from shamal.db.models import (
    PipelineCacheRow,
    PipelineRow,
    PipelineRunRow,
    PipelineScheduleRow,
    PipelineStepRow,
    PipelineVersionRow,
)
from shamal.errors import NotFound
from shamal.pipelines._entities import PipelineInfo, PipelineRun, StepRun

_HEX = frozenset("0123456789abcdef")

#: Teams a caller may see: None = all (platform admins), else these team names.
Visibility = frozenset[str] | None


def _info(row: PipelineRow, version: PipelineVersionRow) -> PipelineInfo:
    return PipelineInfo(
        name=row.name,
        team=row.team_name,
        version=version.version,
        owner=row.owner,
        spec=version.spec,
        digest=version.digest,
        snapshot=version.snapshot,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def register(
    s: Session,
    *,
    spec: dict[str, Any],
    digest: str,
    snapshot: str | None,
    team: tuple[str | None, str],
    user: str,
    now: datetime,
) -> tuple[PipelineInfo, bool]:
    """Store a pipeline's definition as its next version, unless the newest version is
    the same (definition and code); returns it and whether it is new."""
    name = spec["name"]
    row = s.get(PipelineRow, name, with_for_update=True)
    if row is not None:
        newest = s.get(PipelineVersionRow, (name, row.version))
        assert newest is not None
        if newest.digest == digest and newest.snapshot == snapshot:
            return _info(row, newest), False
        row.version += 1
        row.owner, row.updated_at = user, now
        row.team_id, row.team_name = team
    else:
        row = PipelineRow(
            name=name,
            team_id=team[0],
            team_name=team[1],
            version=1,
            owner=user,
            created_at=now,
            updated_at=now,
        )
        s.add(row)
    version = PipelineVersionRow(
        name=name,
        version=row.version,
        spec=spec,
        digest=digest,
        snapshot=snapshot,
        created_by=user,
        created_at=now,
    )
    s.add(version)
    s.flush()
    return _info(row, version), True


def get_pipeline(s: Session, name: str, version: int | None = None) -> PipelineInfo:
    row = s.get(PipelineRow, name)
    if row is None:
        raise NotFound(f"pipeline {name!r} does not exist")
    found = s.get(PipelineVersionRow, (name, version or row.version))
    if found is None:
        raise NotFound(f"pipeline {name!r} has no version {version}")
    return _info(row, found)


def list_pipelines(s: Session, visible: Visibility) -> list[PipelineInfo]:
    query = select(PipelineRow, PipelineVersionRow).join(
        PipelineVersionRow,
        (PipelineVersionRow.name == PipelineRow.name)
        & (PipelineVersionRow.version == PipelineRow.version),
    )
    if visible is not None:
        query = query.where(PipelineRow.team_name.in_(visible))
    return [_info(r, v) for r, v in s.execute(query.order_by(PipelineRow.name))]


def triggered_pipelines(s: Session) -> list[PipelineInfo]:
    """Every pipeline whose newest version has triggers."""
    return [p for p in list_pipelines(s, None) if p.spec.get("triggers")]


def _step(row: PipelineStepRow) -> StepRun:
    return StepRun(
        key=row.key,
        name=row.name,
        index=row.index,
        state=row.state,
        args=row.args,
        job_id=row.job_id,
        cache_key=row.cache_key,
        cache_parts=row.cache_parts,
        cached_from=row.cached_from,
        cache_note=row.cache_note,
        output=row.output,
        reason=row.reason,
        fan_out=row.fan_out,
        mlflow_run_id=row.mlflow_run_id,
        ready_at=row.ready_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _run(row: PipelineRunRow, steps: Sequence[StepRun] = ()) -> PipelineRun:
    return PipelineRun(
        id=row.id,
        pipeline=row.pipeline,
        version=row.version,
        params=row.params,
        state=row.state,
        trigger=row.trigger,
        user=row.user,
        team=row.team_name,
        retry_of=row.retry_of,
        experiment_id=row.experiment_id,
        mlflow_run_id=row.mlflow_run_id,
        reason=row.reason,
        created_at=row.created_at,
        finished_at=row.finished_at,
        steps=tuple(steps),
    )


def insert_run(s: Session, run: PipelineRun, trigger_key: str | None) -> None:
    s.add(
        PipelineRunRow(
            id=run.id,
            pipeline=run.pipeline,
            version=run.version,
            params=dict(run.params),
            state=run.state,
            trigger=run.trigger,
            trigger_key=trigger_key,
            user=run.user,
            team_name=run.team,
            retry_of=run.retry_of,
            reason="",
            created_at=run.created_at,
            experiment_id=run.experiment_id,
            mlflow_run_id=run.mlflow_run_id,
        )
    )
    s.flush()


def get_run(s: Session, run_id: str, *, with_steps: bool = True) -> PipelineRun:
    row = s.get(PipelineRunRow, run_id)
    if row is None:
        raise NotFound(f"pipeline run {run_id[:40]!r} does not exist")
    return _run(row, steps(s, run_id) if with_steps else ())


def list_runs(
    s: Session,
    visible: Visibility,
    *,
    pipeline: str | None,
    states: Collection[str],
    limit: int,
) -> list[PipelineRun]:
    query = select(PipelineRunRow)
    if visible is not None:
        query = query.where(PipelineRunRow.team_name.in_(visible))
    if pipeline is not None:
        query = query.where(PipelineRunRow.pipeline == pipeline)
    if states:
        query = query.where(PipelineRunRow.state.in_(states))
    query = query.order_by(PipelineRunRow.created_at.desc(), PipelineRunRow.id).limit(limit)
    return [_run(r) for r in s.scalars(query)]


def active_run_ids(s: Session) -> list[str]:
    query = select(PipelineRunRow.id).where(PipelineRunRow.state == "running")
    return list(s.scalars(query.order_by(PipelineRunRow.created_at)))


def claim_run(
    s: Session,
    run_id: str,
    owner: str,
    now: datetime,
    lease: timedelta,
    *,
    dead_owner: str | None = None,
) -> bool:
    """Take (or renew) the lease to advance ``run_id``; False when another holds it.
    ``dead_owner``: a holder known to be dead, whose lease is taken before it expires."""
    done = s.execute(
        update(PipelineRunRow)
        .where(PipelineRunRow.id == run_id, PipelineRunRow.state == "running")
        .where(
            or_(
                PipelineRunRow.lease_owner.is_(None),
                PipelineRunRow.lease_owner == owner,
                PipelineRunRow.lease_until < now,
                PipelineRunRow.lease_owner == (dead_owner or owner),
            )
        )
        .values(lease_owner=owner, lease_until=now + lease)
    )
    return bool(getattr(done, "rowcount", 0))


def lease_owner(s: Session, run_id: str) -> str | None:
    """Who holds the lease on ``run_id`` (None: nobody)."""
    query = select(PipelineRunRow.lease_owner).where(PipelineRunRow.id == run_id)
    return s.scalars(query).first()


def release_run(s: Session, run_id: str, owner: str) -> bool:
    """Give up ``owner``'s lease on ``run_id`` (at the end of a pass): any process may take
    the run on at once, as a server started again after a crash does."""
    done = s.execute(
        update(PipelineRunRow)
        .where(PipelineRunRow.id == run_id, PipelineRunRow.lease_owner == owner)
        .values(lease_owner=None)
    )
    return bool(getattr(done, "rowcount", 0))


def finish_run(s: Session, run_id: str, state: str, reason: str, now: datetime) -> bool:
    done = s.execute(
        update(PipelineRunRow)
        .where(PipelineRunRow.id == run_id, PipelineRunRow.state == "running")
        .values(state=state, reason=reason[:2000], finished_at=now, lease_owner=None)
    )
    return bool(getattr(done, "rowcount", 0))


def run_of_trigger(s: Session, pipeline: str, trigger_key: str) -> str | None:
    query = select(PipelineRunRow.id).where(
        PipelineRunRow.pipeline == pipeline, PipelineRunRow.trigger_key == trigger_key
    )
    return s.scalars(query).first()


def running_scheduled(s: Session, pipeline: str) -> str | None:
    """The id of a run of ``pipeline`` that a schedule started and that still runs."""
    query = select(PipelineRunRow.id).where(
        PipelineRunRow.pipeline == pipeline,
        PipelineRunRow.state == "running",
        PipelineRunRow.trigger_key.like("schedule:%"),
    )
    return s.scalars(query.limit(1)).first()


def pipelines_of_job(s: Session, job_prefix: str) -> set[str]:
    """The pipelines one of whose runs has a step whose job id starts with ``job_prefix``
    (lower-case hex digits, as a job token's name carries them; anything else matches none).

    The range on ``job_id`` lets its index answer (every job id is hex, and ``g`` sorts
    after each hex digit in any collation); the prefix test keeps the answer exact.
    """
    if not job_prefix or any(c not in _HEX for c in job_prefix):
        return set()
    query = (
        select(PipelineRunRow.pipeline)
        .join(PipelineStepRow, PipelineStepRow.run_id == PipelineRunRow.id)
        .where(
            PipelineStepRow.job_id >= job_prefix,
            PipelineStepRow.job_id < job_prefix + "g",
            PipelineStepRow.job_id.startswith(job_prefix, autoescape=True),
        )
        .distinct()
    )
    return set(s.scalars(query))


#: A step record's columns, by the name :class:`StepRun` gives each.
_STEP_COLUMNS = tuple(getattr(PipelineStepRow, field.name) for field in dataclasses.fields(StepRun))


def steps(s: Session, run_id: str) -> list[StepRun]:
    """A run's step records, in the order they became ready. Read as plain rows, not ORM
    objects: the pipeline loop reads a run's records on every pass, and a fan-out's run
    holds hundreds of them (the ORM's identity map and change tracking cost more than
    the read)."""
    query = select(*_STEP_COLUMNS).where(PipelineStepRow.run_id == run_id)
    query = query.order_by(PipelineStepRow.ready_at, PipelineStepRow.name, PipelineStepRow.index)
    return [StepRun(*row) for row in s.execute(query)]


def get_step(s: Session, run_id: str, key: str) -> StepRun:
    row = s.get(PipelineStepRow, (run_id, key))
    if row is None:
        raise NotFound(f"the run has no step {key[:80]!r}")
    return _step(row)


def insert_step(
    s: Session,
    run_id: str,
    key: str,
    *,
    name: str,
    index: int | None,
    state: str,
    args: dict[str, Any],
    now: datetime,
    **values: Any,
) -> bool:
    """Add a step's record unless it is there already (a decision carried out twice)."""
    if s.get(PipelineStepRow, (run_id, key)) is not None:
        return False
    s.add(
        PipelineStepRow(
            run_id=run_id,
            key=key,
            name=name,
            index=index,
            state=state,
            args=args,
            cache_note=values.pop("cache_note", ""),
            reason=values.pop("reason", ""),
            ready_at=now,
            **values,
        )
    )
    s.flush()
    return True


def move_step(
    s: Session, run_id: str, key: str, from_states: Collection[str], **values: Any
) -> bool:
    """Compare-and-set: change the step only if it is in one of ``from_states``."""
    done = s.execute(
        update(PipelineStepRow)
        .where(
            PipelineStepRow.run_id == run_id,
            PipelineStepRow.key == key,
            PipelineStepRow.state.in_(list(from_states)),
        )
        .values(**values)
    )
    return bool(getattr(done, "rowcount", 0))


def cached(s: Session, key: str) -> tuple[Any, str] | None:
    row = s.get(PipelineCacheRow, key)
    return None if row is None else (row.output, row.source)


def last_cache_parts(s: Session, pipeline: str, step: str) -> dict[str, Any] | None:
    query = (
        select(PipelineCacheRow.parts)
        .where(PipelineCacheRow.pipeline == pipeline, PipelineCacheRow.step == step)
        .order_by(PipelineCacheRow.created_at.desc())
        .limit(1)
    )
    return s.scalars(query).first()


def keep(
    s: Session,
    key: str,
    *,
    pipeline: str,
    step: str,
    parts: dict[str, Any],
    output: Any,
    source: str,
    now: datetime,
) -> None:
    if s.get(PipelineCacheRow, key) is None:
        s.add(
            PipelineCacheRow(
                key=key,
                pipeline=pipeline,
                step=step,
                parts=parts,
                output=output,
                source=source,
                created_at=now,
            )
        )
        s.flush()


def last_tick(s: Session, pipeline: str, trigger: int) -> tuple[str, datetime] | None:
    row = s.get(PipelineScheduleRow, (pipeline, trigger))
    return None if row is None else (row.expression, row.last_tick)


def move_tick(
    s: Session,
    pipeline: str,
    trigger: int,
    expression: str,
    previous: datetime | None,
    tick: datetime,
) -> bool:
    """Compare-and-set a schedule's last tick: the one server that moves it fires it."""
    if previous is None:
        if s.get(PipelineScheduleRow, (pipeline, trigger)) is not None:
            return False
        s.add(
            PipelineScheduleRow(
                pipeline=pipeline, trigger=trigger, expression=expression, last_tick=tick
            )
        )
        s.flush()
        return True
    done = s.execute(
        update(PipelineScheduleRow)
        .where(
            PipelineScheduleRow.pipeline == pipeline,
            PipelineScheduleRow.trigger == trigger,
            PipelineScheduleRow.last_tick == previous,
        )
        .values(last_tick=tick, expression=expression)
    )
    return bool(getattr(done, "rowcount", 0))
