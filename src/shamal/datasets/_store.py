"""SQL access for datasets. ORM rows never leave this module.

Every function takes the caller's session; the service owns transactions. A version's number
comes from :func:`reserve_version`: one ``UPDATE ... SET next_version = next_version + 1``
under the dataset row's lock, so concurrent writers get distinct, gapless numbers.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from shamal.datasets._entities import (
    DataSet,
    DataVersion,
    DeadLetter,
    Erasure,
    Part,
    VersionStatus,
    WriteMode,
)
from shamal.db.models import (
    DataAliasRow,
    DataDeadLetterRow,
    DataErasureRow,
    DataPartStoreRow,
    DataSetRow,
    DataStreamKeyRow,
    DataVersionRow,
    DataVersionTagRow,
)
from shamal.errors import AlreadyExists, NotFound

#: Which datasets a caller may see: None = all (platform admins), else these team ids (and
#: platform-wide datasets, whose team is None).
Visibility = frozenset[str] | None


@dataclass(frozen=True, slots=True)
class DataSetRef:
    """What the service needs to check access to a stored dataset."""

    id: str
    name: str
    team_id: str | None


def not_found(name: str) -> NotFound:
    return NotFound(f"dataset {name!r} does not exist")


def _aliases(s: Session, dataset_id: str) -> dict[str, int]:
    rows = s.execute(
        select(DataAliasRow.alias, DataAliasRow.version).where(
            DataAliasRow.dataset_id == dataset_id
        )
    )
    return {key: value for key, value in rows}  # noqa: C416 - rows, not pairs, to mypy


def _latest(s: Session, dataset_id: str) -> int | None:
    return s.execute(
        select(func.max(DataVersionRow.version)).where(
            DataVersionRow.dataset_id == dataset_id,
            DataVersionRow.status == VersionStatus.VALID.value,
        )
    ).scalar_one_or_none()


def _dataset(s: Session, row: DataSetRow) -> DataSet:
    return DataSet(
        id=row.id,
        name=row.name,
        team=row.team_name,
        description=row.description,
        created_by=row.created_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
        latest_version=_latest(s, row.id),
        aliases=_aliases(s, row.id),
        regions=None if row.regions is None else tuple(row.regions),
    )


def create(
    s: Session,
    name: str,
    team: tuple[str, str | None],
    description: str,
    actor: str,
    now: datetime,
) -> DataSet:
    if s.execute(select(DataSetRow.id).where(DataSetRow.name == name)).first() is not None:
        raise AlreadyExists(f"dataset {name!r} already exists")
    row = DataSetRow(
        id=uuid.uuid4().hex,
        name=name,
        team_id=team[1],
        team_name=team[0],
        description=description,
        created_by=actor,
        created_at=now,
        updated_at=now,
        next_version=1,
    )
    s.add(row)
    s.flush()
    return _dataset(s, row)


def ref(s: Session, name: str) -> DataSetRef:
    row = s.execute(
        select(DataSetRow.id, DataSetRow.name, DataSetRow.team_id).where(DataSetRow.name == name)
    ).one_or_none()
    if row is None:
        raise not_found(name)
    return DataSetRef(row.id, row.name, row.team_id)


def suite_of(s: Session, dataset: DataSetRef) -> str | None:
    """The dataset's expectation suite (YAML), if it has one."""
    return s.execute(select(DataSetRow.suite).where(DataSetRow.id == dataset.id)).scalar_one()


def set_suite(s: Session, dataset: DataSetRef, suite: str | None, now: datetime) -> None:
    s.execute(
        update(DataSetRow)
        .where(DataSetRow.id == dataset.id)
        .values(suite=suite, updated_at=now)
        .execution_options(synchronize_session=False)
    )


def get(s: Session, dataset_id: str) -> DataSet:
    row = s.get(DataSetRow, dataset_id)
    if row is None:
        raise NotFound("dataset does not exist")
    return _dataset(s, row)


def listing(
    s: Session, visible: Visibility, after: str | None, limit: int, team_ids: Collection[str] = ()
) -> list[DataSet]:
    """Datasets by name, after ``after`` (keyset), at most ``limit``."""
    query = select(DataSetRow).order_by(DataSetRow.name).limit(limit)
    if visible is not None:
        query = query.where(DataSetRow.team_id.in_(visible) | DataSetRow.team_id.is_(None))
    if team_ids:
        query = query.where(DataSetRow.team_id.in_(team_ids))
    if after is not None:
        query = query.where(DataSetRow.name > after)
    return [_dataset(s, row) for row in s.scalars(query)]


def reserve_version(s: Session, dataset_id: str, now: datetime) -> int:
    """The next version number of the dataset, taken for good (gapless: a failed write rolls
    the whole transaction back, number included)."""
    stmt = (
        update(DataSetRow)
        .where(DataSetRow.id == dataset_id)
        .values(next_version=DataSetRow.next_version + 1, updated_at=now)
        .execution_options(synchronize_session=False)
        .returning(DataSetRow.next_version)
    )
    after = s.execute(stmt).scalar_one_or_none()
    if after is None:
        raise NotFound("dataset does not exist")
    return int(after) - 1


def _version(row: DataVersionRow, dataset: str, tags: Mapping[str, str]) -> DataVersion:
    return DataVersion(
        id=row.id,
        dataset=dataset,
        version=row.version,
        digest=row.digest,
        status=VersionStatus(row.status),
        row_count=row.row_count,
        size_bytes=row.size_bytes,
        schema=tuple(row.schema),
        parts=tuple(Part(**part) for part in row.parts),
        source=dict(row.source),
        mode=WriteMode(row.mode),
        profile=dict(row.profile),
        validation=dict(row.validation) if row.validation is not None else None,
        transformations=tuple(row.transformations),
        created_by=row.created_by,
        created_at=row.created_at,
        tags=dict(tags),
    )


def _tags(s: Session, version_id: str) -> dict[str, str]:
    rows = s.execute(
        select(DataVersionTagRow.key, DataVersionTagRow.value).where(
            DataVersionTagRow.version_id == version_id
        )
    )
    return {key: value for key, value in rows}  # noqa: C416 - rows, not pairs, to mypy


def insert_version(s: Session, dataset: DataSetRef, values: Mapping[str, Any]) -> DataVersion:
    row = DataVersionRow(id=uuid.uuid4().hex, dataset_id=dataset.id, **values)
    s.add(row)
    s.flush()
    return _version(row, dataset.name, {})


def version(s: Session, dataset: DataSetRef, number: int) -> DataVersion:
    row = s.execute(
        select(DataVersionRow).where(
            DataVersionRow.dataset_id == dataset.id, DataVersionRow.version == number
        )
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"dataset {dataset.name!r} has no version {number}")
    return _version(row, dataset.name, _tags(s, row.id))


def latest_valid(s: Session, dataset: DataSetRef) -> DataVersion | None:
    number = _latest(s, dataset.id)
    return None if number is None else version(s, dataset, number)


def versions(s: Session, dataset: DataSetRef, before: int | None, limit: int) -> list[DataVersion]:
    """Versions newest first, below ``before`` (keyset), at most ``limit``."""
    query = (
        select(DataVersionRow)
        .where(DataVersionRow.dataset_id == dataset.id)
        .order_by(DataVersionRow.version.desc())
        .limit(limit)
    )
    if before is not None:
        query = query.where(DataVersionRow.version < before)
    return [_version(row, dataset.name, _tags(s, row.id)) for row in s.scalars(query)]


def alias_version(s: Session, dataset: DataSetRef, alias: str) -> int:
    number = s.execute(
        select(DataAliasRow.version).where(
            DataAliasRow.dataset_id == dataset.id, DataAliasRow.alias == alias
        )
    ).scalar_one_or_none()
    if number is None:
        raise NotFound(f"dataset {dataset.name!r} has no alias {alias!r}")
    return int(number)


def set_alias(s: Session, dataset: DataSetRef, alias: str, number: int, now: datetime) -> None:
    row = s.get(DataAliasRow, (dataset.id, alias))
    if row is None:
        s.add(DataAliasRow(dataset_id=dataset.id, alias=alias, version=number, updated_at=now))
    else:
        row.version = number
        row.updated_at = now
    s.flush()


def delete_alias(s: Session, dataset: DataSetRef, alias: str) -> None:
    done = s.execute(
        delete(DataAliasRow).where(
            DataAliasRow.dataset_id == dataset.id, DataAliasRow.alias == alias
        )
    )
    if not done.rowcount:  # type: ignore[attr-defined]
        raise NotFound(f"dataset {dataset.name!r} has no alias {alias!r}")


def set_tag(s: Session, version_id: str, key: str, value: str) -> None:
    row = s.get(DataVersionTagRow, (version_id, key))
    if row is None:
        s.add(DataVersionTagRow(version_id=version_id, key=key, value=value))
    else:
        row.value = value
    s.flush()


# ---------------------------------------------------------------------- residency
#: Where a part with no recorded store is: the artifact store (parts written before stores
#: were recorded, or by a writer that names none).
DEFAULT_STORE = "default"


def regions_of(s: Session, dataset: DataSetRef) -> tuple[str, ...] | None:
    """The regions the dataset's policy allows (None: anywhere)."""
    found = s.execute(select(DataSetRow.regions).where(DataSetRow.id == dataset.id)).scalar_one()
    return None if found is None else tuple(found)


def set_regions(
    s: Session, dataset: DataSetRef, regions: Collection[str] | None, now: datetime
) -> None:
    s.execute(
        update(DataSetRow)
        .where(DataSetRow.id == dataset.id)
        .values(regions=None if regions is None else sorted(regions), updated_at=now)
        .execution_options(synchronize_session=False)
    )


def part_stores(s: Session, dataset_id: str, digests: Collection[str]) -> dict[str, list[str]]:
    """The stores holding each of ``digests`` (by name; ``default`` where none is recorded)."""
    held: dict[str, list[str]] = {digest: [] for digest in digests}
    rows = s.execute(
        select(DataPartStoreRow.digest, DataPartStoreRow.store)
        .where(DataPartStoreRow.dataset_id == dataset_id, DataPartStoreRow.digest.in_(held))
        .order_by(DataPartStoreRow.store)
    )
    for digest, store in rows:
        held[digest].append(store)
    return {digest: stores or [DEFAULT_STORE] for digest, stores in held.items()}


def dataset_stores(s: Session, dataset_id: str) -> dict[str, int]:
    """How many distinct parts of the dataset's versions each store holds."""
    digests = {
        part["digest"]
        for parts in s.scalars(
            select(DataVersionRow.parts).where(DataVersionRow.dataset_id == dataset_id)
        )
        for part in parts
    }
    counts: dict[str, int] = {}
    for stores in part_stores(s, dataset_id, digests).values():
        for store in stores:
            counts[store] = counts.get(store, 0) + 1
    return counts


def add_part_store(s: Session, dataset_id: str, digest: str, store: str, now: datetime) -> None:
    """Record that ``store`` holds the part ``digest`` (nothing when it is recorded)."""
    if s.get(DataPartStoreRow, (dataset_id, digest, store)) is None:
        s.add(DataPartStoreRow(dataset_id=dataset_id, digest=digest, store=store, created_at=now))
        s.flush()


def remove_part_stores(s: Session, dataset_id: str, digest: str) -> None:
    """Forget where the part ``digest`` was held (its bytes were purged everywhere)."""
    s.execute(
        delete(DataPartStoreRow).where(
            DataPartStoreRow.dataset_id == dataset_id, DataPartStoreRow.digest == digest
        )
    )


# ---------------------------------------------------------------------- streams
#: Keys looked up per query (well under every backend's bound-parameter limit).
_KEY_CHUNK = 500


def committed_keys(s: Session, dataset_id: str, stream: str, keys: Iterable[str]) -> set[str]:
    """Which of ``keys`` a committed version (or dead letter) of the stream already holds."""
    wanted = list(dict.fromkeys(keys))
    found: set[str] = set()
    for start in range(0, len(wanted), _KEY_CHUNK):
        chunk = wanted[start : start + _KEY_CHUNK]
        found.update(
            s.scalars(
                select(DataStreamKeyRow.key).where(
                    DataStreamKeyRow.dataset_id == dataset_id,
                    DataStreamKeyRow.stream == stream,
                    DataStreamKeyRow.key.in_(chunk),
                )
            )
        )
    return found


def key_version(s: Session, dataset_id: str, stream: str, key: str) -> tuple[bool, int | None]:
    """(whether ``key`` is committed, the version that holds it: None if it was parked)."""
    row = s.get(DataStreamKeyRow, (dataset_id, stream, key))
    return (False, None) if row is None else (True, row.version)


def record_keys(
    s: Session,
    dataset_id: str,
    stream: str,
    keys: Iterable[str],
    version: int | None,
    now: datetime,
) -> None:
    """Mark ``keys`` committed with ``version`` (None: parked), in the caller's transaction;
    a key committed meanwhile by another writer is a unique violation (the whole write rolls
    back)."""
    s.add_all(
        DataStreamKeyRow(
            dataset_id=dataset_id, stream=stream, key=key, version=version, created_at=now
        )
        for key in keys
    )
    s.flush()


def park(
    s: Session, dataset_id: str, stream: str, letters: Iterable[DeadLetter], now: datetime
) -> None:
    """Keep ``letters`` as dead letters, and their keys as committed (redeliveries skip)."""
    letters = list(letters)
    s.add_all(
        DataDeadLetterRow(
            id=uuid.uuid4().hex,
            dataset_id=dataset_id,
            stream=stream,
            key=letter.key,
            reason=letter.reason[:500],
            digest=letter.digest,
            size=letter.size,
            created_at=now,
        )
        for letter in letters
    )
    record_keys(s, dataset_id, stream, (letter.key for letter in letters), None, now)


def dead_letters(s: Session, dataset: DataSetRef, limit: int) -> list[DeadLetter]:
    """The dataset's parked records, newest first, at most ``limit``."""
    rows = s.scalars(
        select(DataDeadLetterRow)
        .where(DataDeadLetterRow.dataset_id == dataset.id)
        .order_by(DataDeadLetterRow.created_at.desc(), DataDeadLetterRow.id)
        .limit(limit)
    )
    return [
        DeadLetter(row.key, row.reason, row.digest, row.size, row.stream, row.created_at)
        for row in rows
    ]


# ---------------------------------------------------------------------- privacy


def privacy_of(s: Session, dataset: DataSetRef) -> dict[str, Any] | None:
    """The dataset's privacy policy (its JSON form), if it has one."""
    found = s.execute(select(DataSetRow.privacy).where(DataSetRow.id == dataset.id)).scalar_one()
    return None if found is None else dict(found)


def set_privacy(
    s: Session, dataset: DataSetRef, policy: Mapping[str, Any] | None, now: datetime
) -> None:
    s.execute(
        update(DataSetRow)
        .where(DataSetRow.id == dataset.id)
        .values(privacy=None if policy is None else dict(policy), updated_at=now)
        .execution_options(synchronize_session=False)
    )


def lock_dataset(s: Session, dataset: DataSetRef, now: datetime) -> None:
    """Take the dataset row's lock (as :func:`reserve_version` does): writers of versions
    wait until the transaction ends."""
    s.execute(
        update(DataSetRow)
        .where(DataSetRow.id == dataset.id)
        .values(updated_at=now)
        .execution_options(synchronize_session=False)
    )


def every_version(s: Session, dataset: DataSetRef) -> list[DataVersion]:
    """Every version, quarantined ones too, oldest first."""
    query = (
        select(DataVersionRow)
        .where(DataVersionRow.dataset_id == dataset.id)
        .order_by(DataVersionRow.version)
    )
    return [_version(row, dataset.name, {}) for row in s.scalars(query)]


def rewrite_version(s: Session, version_id: str, values: Mapping[str, Any]) -> None:
    """Replace a version's parts and what follows from them (after an erasure)."""
    s.execute(
        update(DataVersionRow)
        .where(DataVersionRow.id == version_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def _erasure(row: DataErasureRow, dataset: str) -> Erasure:
    return Erasure(
        id=row.id,
        dataset=dataset,
        column=row.column,
        subject_hash=row.subject_hash,
        rows_removed=row.rows_removed,
        versions=tuple(row.versions),
        created_by=row.created_by,
        created_at=row.created_at,
    )


def insert_erasure(s: Session, dataset: DataSetRef, values: Mapping[str, Any]) -> Erasure:
    row = DataErasureRow(id=uuid.uuid4().hex, dataset_id=dataset.id, **values)
    s.add(row)
    s.flush()
    return _erasure(row, dataset.name)


def erasures(s: Session, dataset: DataSetRef) -> list[Erasure]:
    query = (
        select(DataErasureRow)
        .where(DataErasureRow.dataset_id == dataset.id)
        .order_by(DataErasureRow.created_at, DataErasureRow.id)
    )
    return [_erasure(row, dataset.name) for row in s.scalars(query)]
