"""SQL access for the model registry. ORM rows never leave this module.

Every function takes the caller's session: the service decides where a
transaction begins and ends (one unit of work per request), this module only
reads and writes rows and hands back frozen entities.

Concurrency: version numbers come from the model row's ``next_version``
counter, advanced by one UPDATE in the creating transaction (the row lock makes
concurrent creators queue; a rollback gives the number back), so they are
unique and gapless. Tags and aliases are written with one upsert statement
(``INSERT ... ON CONFLICT DO UPDATE``), so an alias moves atomically.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

from sqlalchemy import (
    ColumnElement,
    SQLColumnExpression,
    and_,
    delete,
    func,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from shamal.db.models import (
    ModelAliasRow,
    ModelVersionRow,
    ModelVersionTagRow,
    RegisteredModelRow,
    RegisteredModelTagRow,
)
from shamal.errors import AlreadyExists, InvalidParameter, NotFound
from shamal.registry import _search
from shamal.registry._entities import (
    TEAM_TAG,
    ModelAlias,
    ModelRef,
    ModelVersion,
    RegisteredModel,
    Stage,
    VersionStatus,
)
from shamal.registry._rules import PROMPT_TAG
from shamal.tracking import Comparison, OrderBy

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: Ids per IN list: well under SQLite's and PostgreSQL's bound-parameter limits.
_CHUNK = 500

#: Which registered models a caller may see: None = all (platform admins), else
#: the models without a team plus those of the given team ids.
Visibility = frozenset[str] | None


def model_not_found(name: str) -> NotFound:
    """The one message for a missing model and for another team's model (existence hidden),
    in a stock server's words (MLflow's clients and tests match on them)."""
    return NotFound(f"Registered Model with name={name} not found")


def version_not_found(name: str, version: int) -> NotFound:
    return NotFound(f"Model Version (name={name}, version={version}) not found")


def _name_taken(s: Session, name: str, prompt: bool) -> AlreadyExists | None:
    """The refusal of a new model (or prompt, or new name) ``name`` when a model has it, in
    a stock server's words: they tell a prompt from a model."""
    taken = s.scalar(select(RegisteredModelRow.id).where(RegisteredModelRow.name == name))
    if taken is None:
        return None
    flag = s.scalar(
        select(RegisteredModelTagRow.value).where(
            RegisteredModelTagRow.model_id == taken, RegisteredModelTagRow.key == PROMPT_TAG
        )
    )
    old = "prompt" if (flag or "").lower() == "true" else "registered model"
    new = "prompt" if prompt else "registered model"
    if old != new:
        return AlreadyExists(
            f"Tried to create a {new} with name {name!r}, but the name is already taken by a "
            f"{old}. A model and a prompt cannot have the same name."
        )
    return AlreadyExists(
        f"{'Prompt' if prompt else 'Registered Model'} (name={name}) already exists."
    )


def _chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


#: How many tags one registered model, and one version, may hold (their sizes: see
#: ``_rules``). MLflow sets no count; this bounds what one object costs each search page.
MAX_TAGS_PER_MODEL = 1_000
MAX_TAGS_PER_VERSION = 1_000


def _refuse_over(count: int, limit: int, owner: str) -> None:
    """Raise InvalidParameter (the transaction then rolls back) past ``limit`` tags."""
    if count > limit:
        raise InvalidParameter(
            f"A {owner} may have at most {limit} tags; this request would make it {count}."
        )


def _count_tags(s: Session, table: Any, where: ColumnElement[bool], limit: int, owner: str) -> None:
    _refuse_over(s.scalar(select(func.count()).select_from(table).where(where)) or 0, limit, owner)


def _team_tagged(model_id: SQLColumnExpression[str]) -> ColumnElement[bool]:
    """Whether the model was created for a team (the tag stays when the team is deleted)."""
    return (
        select(RegisteredModelTagRow.key)
        .where(RegisteredModelTagRow.model_id == model_id, RegisteredModelTagRow.key == TEAM_TAG)
        .exists()
    )


def _visible(visible: Visibility) -> ColumnElement[bool]:
    if visible is None:
        return true()
    open_to_all = and_(RegisteredModelRow.team_id.is_(None), ~_team_tagged(RegisteredModelRow.id))
    return or_(open_to_all, RegisteredModelRow.team_id.in_(visible))


def _is_prompt(model_id: SQLColumnExpression[str]) -> ColumnElement[bool]:
    """Whether the model ``model_id`` is an MLflow prompt (tagged ``is_prompt`` = ``true``)."""
    return (
        select(RegisteredModelTagRow.key)
        .where(
            RegisteredModelTagRow.model_id == model_id,
            RegisteredModelTagRow.key == PROMPT_TAG,
            RegisteredModelTagRow.value == "true",
        )
        .exists()
    )


def _upsert(s: Session, table: Any, values: Mapping[str, Any], keys: Sequence[str]) -> None:
    """INSERT, or UPDATE the non-key columns of the row with the same ``keys``, in one statement."""
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        pg_stmt = postgresql.insert(table).values(**values)
        changed = {c: pg_stmt.excluded[c] for c in values if c not in keys}
        s.execute(pg_stmt.on_conflict_do_update(index_elements=list(keys), set_=changed))
    elif dialect == "sqlite":
        lite_stmt = sqlite.insert(table).values(**values)
        changed = {c: lite_stmt.excluded[c] for c in values if c not in keys}
        s.execute(lite_stmt.on_conflict_do_update(index_elements=list(keys), set_=changed))
    else:  # pragma: no cover - the engine factory accepts only these two
        raise NotImplementedError(dialect)


def read_snapshot(s: Session) -> None:
    """Make the rest of a read-only transaction see one snapshot (call it first).

    A model is read in a few statements (row, tags, aliases, latest versions).
    PostgreSQL's READ COMMITTED would give each statement its own snapshot, so a
    concurrent alias move could show between two of them; REPEATABLE READ READ
    ONLY gives the whole read one snapshot and never fails for read-only work.
    A SQLite read transaction sees one snapshot already (WAL).
    """
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))


# ---------------------------------------------------------------------- models
def find_model(s: Session, name: str, *, lock: bool = False) -> ModelRef:
    """The model's identity and owner; ``lock`` takes its row lock (FOR UPDATE).

    Raises:
        NotFound: no model of that name.
    """
    query = select(
        RegisteredModelRow.id,
        RegisteredModelRow.team_id,
        _team_tagged(RegisteredModelRow.id).label("team_tagged"),
    ).where(RegisteredModelRow.name == name)
    row = s.execute(query.with_for_update(of=RegisteredModelRow) if lock else query).one_or_none()
    if row is None:
        raise model_not_found(name)
    orphaned = row.team_id is None and bool(row.team_tagged)
    return ModelRef(id=row.id, name=name, team_id=row.team_id, orphaned=orphaned)


def insert_model(
    s: Session,
    *,
    name: str,
    description: str,
    user_id: str,
    team_id: str | None,
    tags: Mapping[str, str],
    now: int,
) -> ModelRef:
    """Create a model with its tags.

    Raises:
        AlreadyExists: the name is taken (a concurrent create loses on the unique constraint).
    """
    taken = _name_taken(s, name, tags.get(PROMPT_TAG, "").lower() == "true")
    if taken is not None:
        raise taken
    model_id = uuid.uuid4().hex
    s.add(
        RegisteredModelRow(
            id=model_id,
            name=name,
            description=description,
            creation_timestamp=now,
            last_updated_timestamp=now,
            user_id=user_id,
            next_version=1,
            team_id=team_id,
        )
    )
    s.flush()
    _refuse_over(len(tags), MAX_TAGS_PER_MODEL, "registered model")
    for key, value in tags.items():
        s.add(RegisteredModelTagRow(model_id=model_id, key=key, value=value))
    s.flush()
    return ModelRef(id=model_id, name=name, team_id=team_id)


def rename_model(s: Session, ref: ModelRef, new_name: str, now: int) -> ModelRef:
    """Rename; versions, tags and aliases stay with the model (they hang off its id).

    The model and every version of it are updated ``now``, as on a stock server (where
    each version carries the model's name): a search's default order, versions changed
    last first, sees a rename as a change of each.

    Raises:
        AlreadyExists: another model has ``new_name``.
    """
    if new_name != ref.name and s.scalar(
        select(RegisteredModelRow.id).where(RegisteredModelRow.name == new_name)
    ):
        raise AlreadyExists(f"Registered Model (name={new_name}) already exists.")
    s.execute(
        update(RegisteredModelRow)
        .where(RegisteredModelRow.id == ref.id)
        .values(name=new_name, last_updated_timestamp=now)
    )
    s.execute(
        update(ModelVersionRow)
        .where(ModelVersionRow.model_id == ref.id)
        .values(last_updated_timestamp=now)
        .execution_options(synchronize_session=False)
    )
    return ModelRef(id=ref.id, name=new_name, team_id=ref.team_id, orphaned=ref.orphaned)


def update_model(s: Session, ref: ModelRef, now: int, description: str | None = None) -> None:
    """Set the description (when given) and the last-updated time."""
    values: dict[str, Any] = {"last_updated_timestamp": now}
    if description is not None:
        values["description"] = description
    s.execute(update(RegisteredModelRow).where(RegisteredModelRow.id == ref.id).values(**values))


def delete_model(s: Session, ref: ModelRef) -> None:
    """Delete the model and everything that hangs off it (aliases, versions, tags)."""
    s.execute(delete(ModelAliasRow).where(ModelAliasRow.model_id == ref.id))
    s.execute(delete(ModelVersionTagRow).where(ModelVersionTagRow.model_id == ref.id))
    s.execute(delete(ModelVersionRow).where(ModelVersionRow.model_id == ref.id))
    s.execute(delete(RegisteredModelTagRow).where(RegisteredModelTagRow.model_id == ref.id))
    s.execute(delete(RegisteredModelRow).where(RegisteredModelRow.id == ref.id))


def set_model_tag(s: Session, ref: ModelRef, key: str, value: str) -> None:
    """Set a tag; one past ``MAX_TAGS_PER_MODEL`` is refused. Writers take the model's row
    first (FOR NO KEY UPDATE on PostgreSQL), so two at the limit count one after the other."""
    s.execute(
        select(RegisteredModelRow.id)
        .where(RegisteredModelRow.id == ref.id)
        .with_for_update(key_share=True)
    )
    _upsert(
        s,
        RegisteredModelTagRow,
        {"model_id": ref.id, "key": key, "value": value},
        ("model_id", "key"),
    )
    _count_tags(
        s,
        RegisteredModelTagRow,
        RegisteredModelTagRow.model_id == ref.id,
        MAX_TAGS_PER_MODEL,
        "registered model",
    )


def delete_model_tag(s: Session, ref: ModelRef, key: str) -> None:
    """Remove a tag; removing one that is not there is not an error (as in MLflow)."""
    s.execute(
        delete(RegisteredModelTagRow).where(
            RegisteredModelTagRow.model_id == ref.id, RegisteredModelTagRow.key == key
        )
    )


def load_model(s: Session, ref: ModelRef) -> RegisteredModel:
    row = s.get(RegisteredModelRow, ref.id, populate_existing=True)
    if row is None:
        raise model_not_found(ref.name)
    return _models(s, [row])[0]


def _models(s: Session, rows: Sequence[RegisteredModelRow]) -> list[RegisteredModel]:
    """Entities for ``rows``, with tags, aliases and latest versions loaded in a few queries."""
    ids = [r.id for r in rows]
    names = {r.id: r.name for r in rows}
    tags: dict[str, dict[str, str]] = defaultdict(dict)
    aliases: dict[str, list[ModelAlias]] = defaultdict(list)
    for chunk in _chunks(ids):
        for tag in s.scalars(
            select(RegisteredModelTagRow)
            .where(RegisteredModelTagRow.model_id.in_(chunk))
            .order_by(RegisteredModelTagRow.key)
        ):
            tags[tag.model_id][tag.key] = tag.value
        for alias in s.scalars(
            select(ModelAliasRow)
            .where(ModelAliasRow.model_id.in_(chunk))
            .order_by(ModelAliasRow.alias)
        ):
            aliases[alias.model_id].append(ModelAlias(alias.alias, alias.version))
    latest: dict[str, list[ModelVersion]] = defaultdict(list)
    ids_by_name = {name: model_id for model_id, name in names.items()}
    for version in _latest_versions(s, ids, names, stages=None):
        latest[ids_by_name[version.name]].append(version)
    return [
        RegisteredModel(
            name=r.name,
            creation_timestamp=r.creation_timestamp,
            last_updated_timestamp=r.last_updated_timestamp,
            user_id=r.user_id,
            description=r.description,
            team_id=r.team_id,
            tags=dict(tags[r.id]),
            aliases=tuple(aliases[r.id]),
            latest_versions=tuple(latest[r.id]),
        )
        for r in rows
    ]


def search_models(
    s: Session,
    filters: list[Comparison],
    order_by: list[OrderBy],
    visible: Visibility,
    offset: int,
    limit: int,
    *,
    prompts: bool = False,
) -> tuple[list[RegisteredModel], bool]:
    """One page of the models the caller may see that match ``filters``, in ``order_by``.

    ``prompts``: only prompts (models tagged as such), else only the other models.

    Returns:
        The models, and whether more follow.
    """
    is_prompt = _is_prompt(RegisteredModelRow.id)
    query = _search.registered_models_query(filters, order_by).where(
        _visible(visible), is_prompt if prompts else ~is_prompt
    )
    rows = list(s.scalars(query.offset(offset).limit(limit + 1)))
    return _models(s, rows[:limit]), len(rows) > limit


def list_models(
    s: Session, visible: Visibility, search: str, offset: int, limit: int, after: str | None = None
) -> list[RegisteredModel]:
    """Models whose name contains ``search`` (case-insensitive, no wildcards), by name;
    ``after``: only the names after it (a keyset page)."""
    query = select(RegisteredModelRow).where(_visible(visible))
    if after is not None:
        query = query.where(RegisteredModelRow.name > after)
    if search:
        query = query.where(RegisteredModelRow.name.icontains(search, autoescape=True))
    query = query.order_by(RegisteredModelRow.name).offset(offset).limit(limit)
    return _models(s, list(s.scalars(query)))


# ---------------------------------------------------------------------- versions
def allocate_version(s: Session, ref: ModelRef, now: int) -> int:
    """The next version number of the model, taken in the caller's transaction.

    One ``UPDATE ... SET next_version = next_version + 1 ... RETURNING``: the
    row lock serializes concurrent creators, a rollback returns the number.

    Raises:
        NotFound: the model was deleted meanwhile.
    """
    stmt = (
        update(RegisteredModelRow)
        .where(RegisteredModelRow.id == ref.id)
        .values(next_version=RegisteredModelRow.next_version + 1, last_updated_timestamp=now)
        .execution_options(synchronize_session=False)
    )
    if s.get_bind().dialect.update_returning:
        after = s.execute(stmt.returning(RegisteredModelRow.next_version)).scalar_one_or_none()
    else:  # pragma: no cover - both supported backends have RETURNING
        before = s.scalar(
            select(RegisteredModelRow.next_version)
            .where(RegisteredModelRow.id == ref.id)
            .with_for_update()
        )
        s.execute(stmt)
        after = None if before is None else before + 1
    if after is None:
        raise model_not_found(ref.name)
    return int(after) - 1


def insert_version(s: Session, ref: ModelRef, version: ModelVersion) -> None:
    """Store a new version (its number from :func:`allocate_version`) with its tags."""
    s.add(
        ModelVersionRow(
            model_id=ref.id,
            version=version.version,
            creation_timestamp=version.creation_timestamp,
            last_updated_timestamp=version.last_updated_timestamp,
            user_id=version.user_id,
            current_stage=version.current_stage.value,
            description=version.description,
            source=version.source,
            storage_location=version.storage_location,
            run_id=version.run_id,
            run_verified=version.run_verified,
            run_link=version.run_link,
            status=version.status.value,
            status_message=version.status_message,
            logged_model_id=version.model_id,
            formats=",".join(version.formats),
            signature=None if version.signature is None else json.dumps(version.signature),
        )
    )
    s.flush()
    _refuse_over(len(version.tags), MAX_TAGS_PER_VERSION, "model version")
    for key, value in version.tags.items():
        s.add(ModelVersionTagRow(model_id=ref.id, version=version.version, key=key, value=value))
    s.flush()


#: Row locks on a version: "share" (FOR KEY SHARE: the version must stay while we add a
#: row that points at it) or "update" (FOR UPDATE: we change or delete it). SQLite
#: serializes writers with BEGIN IMMEDIATE and ignores both.
VersionLock = Literal["none", "share", "update"]


def _version_row(
    s: Session, ref: ModelRef, version: int, *, lock: VersionLock = "none"
) -> ModelVersionRow:
    query = select(ModelVersionRow).where(
        ModelVersionRow.model_id == ref.id, ModelVersionRow.version == version
    )
    if lock != "none":
        query = query.with_for_update(key_share=lock == "share")
    row = s.scalar(query.execution_options(populate_existing=True))
    if row is None:
        raise version_not_found(ref.name, version)
    return row


def get_version(s: Session, ref: ModelRef, version: int) -> ModelVersion:
    """The version with its tags and aliases.

    Raises:
        NotFound: no such version.
    """
    return _versions(s, [_version_row(s, ref, version)], {ref.id: ref.name})[0]


def update_version(
    s: Session,
    ref: ModelRef,
    version: int,
    now: int,
    *,
    description: str | None = None,
    stage: Stage | None = None,
) -> None:
    """Set the description and/or the stage of an existing version.

    Raises:
        NotFound: no such version.
    """
    row = _version_row(s, ref, version, lock="update")
    if description is not None:
        row.description = description
    if stage is not None:
        row.current_stage = stage.value
    row.last_updated_timestamp = now
    s.flush()


def archive_stage(s: Session, ref: ModelRef, stage: Stage, keep: int, now: int) -> list[int]:
    """Move every other version in ``stage`` to Archived; returns their numbers."""
    others = list(
        s.scalars(
            select(ModelVersionRow.version).where(
                ModelVersionRow.model_id == ref.id,
                ModelVersionRow.current_stage == stage.value,
                ModelVersionRow.version != keep,
            )
        )
    )
    if others:
        s.execute(
            update(ModelVersionRow)
            .where(ModelVersionRow.model_id == ref.id, ModelVersionRow.version.in_(others))
            .values(current_stage=Stage.ARCHIVED.value, last_updated_timestamp=now)
            .execution_options(synchronize_session=False)
        )
    return sorted(others)


def delete_version(s: Session, ref: ModelRef, version: int) -> None:
    """Delete a version with its tags and the aliases that pointed at it.

    Raises:
        NotFound: no such version.
    """
    _version_row(s, ref, version, lock="update")
    for table in (ModelAliasRow, ModelVersionTagRow, ModelVersionRow):
        s.execute(delete(table).where(table.model_id == ref.id, table.version == version))


def set_version_tag(s: Session, ref: ModelRef, version: int, key: str, value: str) -> None:
    """Set a tag; one past ``MAX_TAGS_PER_VERSION`` is refused. Writers take the version's
    row first (FOR NO KEY UPDATE on PostgreSQL), so two at the limit count one after the
    other."""
    # "share" renders FOR NO KEY UPDATE on PostgreSQL: tag writers take turns on it.
    _version_row(s, ref, version, lock="share")
    _upsert(
        s,
        ModelVersionTagRow,
        {"model_id": ref.id, "version": version, "key": key, "value": value},
        ("model_id", "version", "key"),
    )
    _count_tags(
        s,
        ModelVersionTagRow,
        (ModelVersionTagRow.model_id == ref.id) & (ModelVersionTagRow.version == version),
        MAX_TAGS_PER_VERSION,
        "model version",
    )


def delete_version_tag(s: Session, ref: ModelRef, version: int, key: str) -> None:
    """Remove a version's tag; an absent tag is not an error, an absent version is."""
    _version_row(s, ref, version)
    s.execute(
        delete(ModelVersionTagRow).where(
            ModelVersionTagRow.model_id == ref.id,
            ModelVersionTagRow.version == version,
            ModelVersionTagRow.key == key,
        )
    )


def latest_versions(
    s: Session, ref: ModelRef, stages: Collection[Stage] | None
) -> list[ModelVersion]:
    """The newest READY version in each of ``stages`` (None: every stage).

    Listed in a stock server's order: the stages ordered by the oldest version in each.
    """
    return _latest_versions(s, [ref.id], {ref.id: ref.name}, stages)


def _latest_versions(
    s: Session, ids: Sequence[str], names: Mapping[str, str], stages: Collection[Stage] | None
) -> list[ModelVersion]:
    rows: list[ModelVersionRow] = []
    firsts: dict[tuple[str, str], int] = {}
    for chunk in _chunks(ids):
        newest = (
            select(
                ModelVersionRow.model_id,
                ModelVersionRow.current_stage,
                func.max(ModelVersionRow.version).label("version"),
                func.min(ModelVersionRow.version).label("first"),
            )
            .where(
                ModelVersionRow.model_id.in_(chunk),
                ModelVersionRow.status == VersionStatus.READY.value,
            )
            .group_by(ModelVersionRow.model_id, ModelVersionRow.current_stage)
        )
        if stages is not None:
            newest = newest.where(ModelVersionRow.current_stage.in_([st.value for st in stages]))
        sub = newest.subquery()
        for row, first in s.execute(
            select(ModelVersionRow, sub.c.first).join(
                sub,
                and_(
                    ModelVersionRow.model_id == sub.c.model_id,
                    ModelVersionRow.version == sub.c.version,
                ),
            )
        ):
            rows.append(row)
            firsts[(row.model_id, row.current_stage)] = first
    # A stock server lists each stage when it first meets it walking the versions up.
    rows.sort(key=lambda r: (r.model_id, firsts[(r.model_id, r.current_stage)]))
    return _versions(s, rows, names)


def _versions(
    s: Session, rows: Sequence[ModelVersionRow], names: Mapping[str, str]
) -> list[ModelVersion]:
    """Entities for ``rows`` with their tags and aliases (a few queries for any number of rows)."""
    model_ids = sorted({r.model_id for r in rows})
    wanted = {(r.model_id, r.version) for r in rows}
    tags: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    aliases: dict[tuple[str, int], list[str]] = defaultdict(list)
    for chunk in _chunks(model_ids):
        for tag in s.scalars(
            select(ModelVersionTagRow)
            .where(ModelVersionTagRow.model_id.in_(chunk))
            .order_by(ModelVersionTagRow.key)
        ):
            if (tag.model_id, tag.version) in wanted:
                tags[(tag.model_id, tag.version)][tag.key] = tag.value
        for alias in s.scalars(
            select(ModelAliasRow)
            .where(ModelAliasRow.model_id.in_(chunk))
            .order_by(ModelAliasRow.alias)
        ):
            aliases[(alias.model_id, alias.version)].append(alias.alias)
    return [_version(r, names[r.model_id], tags[(r.model_id, r.version)], aliases) for r in rows]


def _version(
    row: ModelVersionRow,
    name: str,
    tags: Mapping[str, str],
    aliases: Mapping[tuple[str, int], list[str]],
) -> ModelVersion:
    return ModelVersion(
        name=name,
        version=row.version,
        creation_timestamp=row.creation_timestamp,
        last_updated_timestamp=row.last_updated_timestamp,
        user_id=row.user_id,
        current_stage=Stage(row.current_stage),
        description=row.description,
        source=row.source,
        storage_location=row.storage_location,
        run_id=row.run_id,
        run_verified=row.run_verified,
        run_link=row.run_link,
        status=VersionStatus(row.status),
        status_message=row.status_message,
        model_id=row.logged_model_id,
        tags=dict(tags),
        aliases=tuple(aliases.get((row.model_id, row.version), ())),
        formats=tuple(row.formats.split(",")) if row.formats else (),
        signature=None if row.signature is None else json.loads(row.signature),
    )


def list_versions(
    s: Session, ref: ModelRef, *, limit: int | None = None, before: int | None = None
) -> list[ModelVersion]:
    """The model's versions, newest first: all of them, or ``limit`` of those older than
    version ``before``."""
    query = select(ModelVersionRow).where(ModelVersionRow.model_id == ref.id)
    if before is not None:
        query = query.where(ModelVersionRow.version < before)
    query = query.order_by(ModelVersionRow.version.desc())
    if limit is not None:
        query = query.limit(limit)
    return _versions(s, list(s.scalars(query)), {ref.id: ref.name})


def search_versions(
    s: Session,
    filters: list[Comparison],
    order_by: list[OrderBy],
    visible: Visibility,
    offset: int,
    limit: int,
    *,
    prompts: bool = False,
) -> tuple[list[ModelVersion], bool]:
    """One page of the versions of models the caller may see that match ``filters``.

    ``prompts``: only versions of prompts, else only versions of the other models.

    Returns:
        The versions, and whether more follow.
    """
    is_prompt = _is_prompt(ModelVersionRow.model_id)
    query = _search.model_versions_query(filters, order_by).where(
        is_prompt if prompts else ~is_prompt
    )
    if visible is not None:
        # correlate(None): the search query may join registered_models itself.
        models = select(RegisteredModelRow.id).where(_visible(visible)).correlate(None)
        query = query.where(ModelVersionRow.model_id.in_(models))
    rows = list(s.scalars(query.offset(offset).limit(limit + 1)))
    page = rows[:limit]
    names = _names(s, {r.model_id for r in page})
    return _versions(s, page, names), len(rows) > limit


def versions_from(
    s: Session,
    run_ids: Sequence[str],
    model_ids: Sequence[str],
    visible: Visibility,
    limit: int,
) -> list[ModelVersion]:
    """Versions (of models ``visible`` allows) made from one of ``run_ids`` (links checked
    when the version was made: an unverified ``run_id`` is a claim, not lineage) or of the
    logged models ``model_ids``, newest first, at most ``limit``."""
    if not run_ids and not model_ids:
        return []
    query = (
        select(ModelVersionRow)
        .join(RegisteredModelRow, RegisteredModelRow.id == ModelVersionRow.model_id)
        .where(
            or_(
                and_(ModelVersionRow.run_id.in_(list(run_ids)), ModelVersionRow.run_verified),
                ModelVersionRow.logged_model_id.in_(list(model_ids)),
            ),
            _visible(visible),
        )
        .order_by(ModelVersionRow.creation_timestamp.desc(), RegisteredModelRow.name)
        .limit(limit)
    )
    rows = list(s.scalars(query))
    return _versions(s, rows, _names(s, {r.model_id for r in rows}))


def _names(s: Session, ids: Iterable[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for chunk in _chunks(sorted(ids)):
        rows = s.execute(
            select(RegisteredModelRow.id, RegisteredModelRow.name).where(
                RegisteredModelRow.id.in_(chunk)
            )
        )
        names.update((model_id, name) for model_id, name in rows)
    return names


# ---------------------------------------------------------------------- aliases
def _alias_target(s: Session, ref: ModelRef, alias: str) -> int | None:
    return s.scalar(
        select(ModelAliasRow.version).where(
            ModelAliasRow.model_id == ref.id, ModelAliasRow.alias == alias
        )
    )


def set_alias(s: Session, ref: ModelRef, alias: str, version: int) -> int | None:
    """Point ``alias`` at ``version`` (creating or moving it) in one upsert.

    Returns:
        The version the alias pointed at before, or None.

    Raises:
        NotFound: no such version.
    """
    _version_row(s, ref, version, lock="share")
    before = _alias_target(s, ref, alias)
    values = {"model_id": ref.id, "alias": alias, "version": version}
    _upsert(s, ModelAliasRow, values, ("model_id", "alias"))
    return before


def delete_alias(s: Session, ref: ModelRef, alias: str) -> int | None:
    """Remove an alias; returns the version it pointed at (None: there was no such alias)."""
    before = _alias_target(s, ref, alias)
    s.execute(
        delete(ModelAliasRow).where(ModelAliasRow.model_id == ref.id, ModelAliasRow.alias == alias)
    )
    return before


def alias_version(s: Session, ref: ModelRef, alias: str) -> int:
    """The version ``alias`` points at.

    Raises:
        NotFound: the model has no such alias.
    """
    version = _alias_target(s, ref, alias)
    if version is None:
        raise NotFound(f"Registered model alias {alias} not found.")
    return version
