"""SQL access for the artifact path index. ORM rows never leave this module."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from shamal.artifacts._entities import ArtifactFile
from shamal.db.models import ArtifactFileRow
from shamal.errors import NotFound


def _file(row: ArtifactFileRow) -> ArtifactFile:
    return ArtifactFile(
        namespace=row.namespace,
        path=row.path,
        digest=row.digest,
        size=row.size,
        created_at=row.created_at,
        created_by=row.created_by,
    )


def upsert_file(
    s: Session, namespace: str, path: str, digest: str, size: int, now: datetime, by: str
) -> ArtifactFile:
    row = s.get(ArtifactFileRow, (namespace, path), with_for_update=True)
    if row is None:
        row = ArtifactFileRow(namespace=namespace, path=path)
        s.add(row)
    row.digest, row.size, row.created_at, row.created_by = digest, size, now, by
    s.flush()
    return _file(row)


def get_file(s: Session, namespace: str, path: str) -> ArtifactFile:
    row = s.get(ArtifactFileRow, (namespace, path))
    if row is None:
        raise NotFound(f"artifact {path!r} does not exist")
    return _file(row)


def list_files(s: Session, namespace: str, prefix: str, limit: int) -> list[ArtifactFile]:
    query = select(ArtifactFileRow).where(ArtifactFileRow.namespace == namespace)
    if prefix:
        # A range scan on the primary key instead of LIKE: no wildcard escaping to get wrong.
        query = query.where(
            ArtifactFileRow.path >= prefix, ArtifactFileRow.path < prefix + "\uffff"
        )
    return [_file(r) for r in s.scalars(query.order_by(ArtifactFileRow.path).limit(limit))]


def delete_file(s: Session, namespace: str, path: str) -> ArtifactFile:
    found = get_file(s, namespace, path)
    s.execute(
        delete(ArtifactFileRow).where(
            ArtifactFileRow.namespace == namespace, ArtifactFileRow.path == path
        )
    )
    return found


def digest_in_use(s: Session, digest: str) -> bool:
    return (
        s.scalar(select(ArtifactFileRow.path).where(ArtifactFileRow.digest == digest).limit(1))
        is not None
    )


def delete_tree(s: Session, namespace: str, path: str) -> int:
    """Delete ``path`` and everything below ``path/``; returns the number of files."""
    result = s.execute(
        delete(ArtifactFileRow).where(
            ArtifactFileRow.namespace == namespace,
            (ArtifactFileRow.path == path)
            | ((ArtifactFileRow.path >= path + "/") & (ArtifactFileRow.path < path + "/\uffff")),
        )
    )
    return int(getattr(result, "rowcount", 0) or 0)
