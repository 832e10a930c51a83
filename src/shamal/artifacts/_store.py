"""SQL access for the artifact path index. ORM rows never leave this module."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from shamal.artifacts._entities import ArtifactFile
from shamal.db.models import ArtifactFileRow
from shamal.errors import NotFound

#: Greater than every character a path may hold (the last code point; U+FFFF is not: an
#: emoji is above it): the end of the range of "<folder>/...". Paths compare as code
#: points (the column's collation is "C" on PostgreSQL, BINARY on SQLite).
_AFTER_ALL = "\U0010ffff"


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


def list_files(
    s: Session, namespace: str, prefix: str, limit: int, after: str | None = None
) -> list[ArtifactFile]:
    """By path; ``after``: only the paths after it (a keyset page)."""
    query = select(ArtifactFileRow).where(ArtifactFileRow.namespace == namespace)
    if after is not None:
        query = query.where(ArtifactFileRow.path > after)
    if prefix:
        # A range scan on the primary key instead of LIKE: no wildcard escaping to get wrong.
        query = query.where(
            ArtifactFileRow.path >= prefix, ArtifactFileRow.path < prefix + _AFTER_ALL
        )
    return [_file(r) for r in s.scalars(query.order_by(ArtifactFileRow.path).limit(limit))]


#: Rows read by the first query of :func:`folder_files`, and at least by every query: a
#: subfolder it jumps over costs at most this many rows (more right after small ones).
_FOLDER_PEEK = 32
#: Rows read at most per query.
_FOLDER_BATCH = 1024


def folder_files(s: Session, namespace: str, folder: str, limit: int) -> list[ArtifactFile]:
    """What shows the immediate children of ``folder`` ("" for the top): the file
    ``folder`` itself if there is one, every file directly in it, and the first file of
    each of its subfolders, in path order; at most ``limit`` of them.

    Rows are read in batches; a batch that ends inside a subfolder goes on after the whole
    of it. Batches grow (up to ``_FOLDER_BATCH``) while they span many children and shrink
    (down to ``_FOLDER_PEEK``) when the subfolder they end in filled most of them. So a
    subfolder of a million files costs one short query, and a folder of thousands of
    subfolders of a few files each a few long ones, not a query each.
    """
    prefix = f"{folder}/" if folder else ""
    if folder:
        row = s.get(ArtifactFileRow, (namespace, folder))
        if row is not None:
            return [_file(row)]
    found: list[ArtifactFile] = []
    cursor, inclusive, batch = prefix, True, _FOLDER_PEEK
    shown_head: str | None = None  # the subfolder whose first file was shown last
    while len(found) < limit:
        rows = _folder_rows(s, namespace, prefix, cursor, inclusive, batch)
        # The subfolder the batch has reached (None: a file directly in the folder) and
        # how many of the batch's last rows lie in it.
        last_head: str | None = None
        run = 0
        for row in rows:
            head, sep, _ = row.path[len(prefix) :].partition("/")
            run = run + 1 if sep and head == last_head else int(bool(sep))
            last_head = head if sep else None
            if sep and head == shown_head:
                continue  # a further file of a subfolder already shown
            found.append(_file(row))
            if len(found) >= limit:
                return found
            shown_head = last_head
        if len(rows) < batch:
            return found  # the folder's range is read to its end
        # Inside a subfolder: go on after the whole of it; else after the last file read.
        cursor = rows[-1].path if last_head is None else f"{prefix}{last_head}/{_AFTER_ALL}"
        inclusive = False
        batch = _next_batch(batch, run, len(rows))
    return found


def _folder_rows(
    s: Session, namespace: str, prefix: str, cursor: str, inclusive: bool, batch: int
) -> list[ArtifactFileRow]:
    """At most ``batch`` rows under ``prefix`` from ``cursor`` on (itself included when
    ``inclusive``), in path order."""
    query = select(ArtifactFileRow).where(
        ArtifactFileRow.namespace == namespace,
        ArtifactFileRow.path >= cursor if inclusive else ArtifactFileRow.path > cursor,
        ArtifactFileRow.path < prefix + _AFTER_ALL,
    )
    return list(s.scalars(query.order_by(ArtifactFileRow.path).limit(batch)))


def _next_batch(batch: int, run: int, read: int) -> int:
    """The size of the next batch after one of ``read`` rows whose last ``run`` lay in
    one subfolder: smaller when that subfolder filled most of it, else larger."""
    if 2 * run > read:
        return max(batch // 4, _FOLDER_PEEK)
    return min(batch * 4, _FOLDER_BATCH)


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
    below = (ArtifactFileRow.path >= path + "/") & (ArtifactFileRow.path < path + "/" + _AFTER_ALL)
    result = s.execute(
        delete(ArtifactFileRow).where(
            ArtifactFileRow.namespace == namespace, (ArtifactFileRow.path == path) | below
        )
    )
    return int(getattr(result, "rowcount", 0) or 0)
