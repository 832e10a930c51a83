"""Rules of the artifact store: team-scoped files over content-addressed blobs."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence

from sqlalchemy.orm import Session

from shamal.artifacts import _store
from shamal.artifacts._blobs import BlobStore
from shamal.artifacts._entities import ArtifactFile, StoreInfo
from shamal.artifacts._paths import safe_relpath
from shamal.clock import Clock, utc_now
from shamal.db import Database
from shamal.errors import NotFound
from shamal.security import AuditContext, AuditLog, Principal, Role, SecurityService

logger = logging.getLogger(__name__)

MAX_LIST = 10_000
#: The name of the artifact store itself among the stores blobs may be kept in.
DEFAULT_STORE = "default"


def team_namespace(team_id: str) -> str:
    """Namespaces use the team's id: a team re-created under an old name sees nothing old."""
    return f"team/{team_id}"


class ArtifactService:
    """Files of a team's artifact tree: put (members), read and list (viewers), delete
    (maintainers).

    The blob is written first, then the index row and its audit entry commit
    together: a crash in between leaves at most an unreferenced blob, never an
    index entry without its bytes.

    Besides the artifact store (``default``), named data stores (``data_stores``: name ->
    blob store and region) may hold the blobs of domains that choose where their bytes go
    (datasets, under a residency policy): :meth:`store_file`, :meth:`read_file` and
    :meth:`copy_file` name the store; the index is shared, as addresses are content's.
    """

    def __init__(
        self,
        db: Database,
        blobs: BlobStore,
        audit: AuditLog,
        security: SecurityService,
        clock: Clock = utc_now,
        *,
        region: str | None = None,
        data_stores: Mapping[str, tuple[BlobStore, str | None]] | None = None,
    ) -> None:
        """``region``: the artifact store's own region label (None: unlabelled)."""
        self._db = db
        self._blobs = blobs
        self._audit = audit
        self._security = security
        self._clock = clock
        self._stores: dict[str, tuple[BlobStore, str | None]] = {DEFAULT_STORE: (blobs, region)}
        for name, entry in sorted((data_stores or {}).items()):
            if name != DEFAULT_STORE:
                self._stores[name] = entry

    # ------------------------------------------------------------------ stores
    def stores(self) -> list[StoreInfo]:
        """The stores blobs may be kept in: ``default`` first, then the data stores by name."""
        return [StoreInfo(name, region) for name, (_, region) in self._stores.items()]

    def _store(self, store: str | None) -> BlobStore:
        if store is None:
            return self._blobs
        found = self._stores.get(store)
        if found is None:
            names = ", ".join(self._stores)
            raise NotFound(f"no store {store!r}; the stores are: {names}")
        return found[0]

    def _namespace(self, principal: Principal, team: str, needed: Role) -> str:
        return team_namespace(self._security.authorize_team(principal, team, needed).id)

    # ------------------------------------------------------------------ namespaces
    # For domains that own their artifacts (tracking, registry) and authorize their own
    # objects first: these check paths, never permissions.
    def store_file(
        self,
        ctx: AuditContext | None,
        namespace: str,
        path: str,
        chunks: Iterable[bytes],
        *,
        store: str | None = None,
    ) -> ArtifactFile:
        """Stream ``chunks`` into ``namespace``/``path`` (its blob in ``store``; None: the
        artifact store); audited when ``ctx`` is given."""
        clean = safe_relpath(path)
        info = self._store(store).put(chunks)
        actor = ctx.actor if ctx is not None else "system"

        def work(s: Session) -> ArtifactFile:
            stored = _store.upsert_file(
                s, namespace, clean, info.digest, info.size, self._clock(), actor
            )
            if ctx is not None:
                self._audit.record(
                    s, ctx, ctx.target or f"{namespace}/{clean}", digest=info.digest, size=info.size
                )
            return stored

        # Two writers of the same new path race on its insert: the loser's retry replaces it.
        return self._db.run(work, retry_unique=True)

    def file_info(self, namespace: str, path: str) -> ArtifactFile:
        with self._db.unit_of_work(write=False) as s:
            return _store.get_file(s, namespace, safe_relpath(path))

    def read_file(
        self, namespace: str, path: str, *, store: str | None = None
    ) -> tuple[ArtifactFile, Iterator[bytes]]:
        """The file's record and its bytes, read from ``store`` (None: the artifact store)."""
        blobs = self._store(store)
        found = self.file_info(namespace, path)
        return found, blobs.open(found.digest)

    def copy_file(self, namespace: str, path: str, *, source: str, target: str) -> ArtifactFile:
        """Copy the blob of ``namespace``/``path`` from store ``source`` into ``target``
        (verified against its address on the way: a corrupt copy is never published)."""
        into = self._store(target)
        found = self.file_info(namespace, path)
        if not into.exists(found.digest):
            into.put(self._store(source).open(found.digest), expected_digest=found.digest)
        return found

    def files_under(
        self, namespace: str, prefix: str = "", limit: int = MAX_LIST
    ) -> list[ArtifactFile]:
        clean = safe_relpath(prefix) if prefix else ""
        with self._db.unit_of_work(write=False) as s:
            return _store.list_files(s, namespace, clean, limit)

    def folder_files(self, namespace: str, folder: str, limit: int) -> list[ArtifactFile]:
        """See :func:`shamal.artifacts._store.folder_files`; ``folder`` is checked first."""
        clean = safe_relpath(folder) if folder else ""
        with self._db.unit_of_work(write=False) as s:
            return _store.folder_files(s, namespace, clean, limit)

    def remove_files(self, ctx: AuditContext, namespace: str, path: str) -> int:
        """Remove a file, or every file under a folder; returns how many."""
        clean = safe_relpath(path)

        def work(s: Session) -> int:
            removed = _store.delete_tree(s, namespace, clean)
            if removed:
                self._audit.record(s, ctx, ctx.target or f"{namespace}/{clean}", files=removed)
            return removed

        return self._db.run(work)

    def purge_file(
        self, namespace: str, path: str, *, stores: Sequence[str | None] = (None,)
    ) -> bool:
        """Remove a file from the index and its bytes from ``stores`` (None: the artifact
        store), unless another file names the same content (an erasure: the bytes must go,
        not only the name). The caller audits. Returns whether the bytes were deleted; a
        missing file is no error.

        A byte-identical file stored at the very moment of the purge may lose its blob
        (reads of it then fail their check, loudly): purges are rare and deliberate.
        """
        clean = safe_relpath(path)

        def work(s: Session) -> str | None:
            try:
                removed = _store.delete_file(s, namespace, clean)
            except NotFound:
                return None
            return None if _store.digest_in_use(s, removed.digest) else removed.digest

        blobs = [self._store(store) for store in stores]  # an unknown store: before any change
        digest = self._db.run(work)
        if digest is None:
            return False
        deleted = [store.delete(digest) for store in blobs]
        return any(deleted)

    def put(
        self, ctx: AuditContext, team: str, raw_path: str, chunks: Iterable[bytes]
    ) -> ArtifactFile:
        """Stream ``chunks`` into the team's file ``raw_path`` (replacing it if present).

        Raises:
            InvalidParameter: the path fails the path rules.
            NotFound / PermissionDenied: see :meth:`SecurityService.authorize_team`.
        """
        path = safe_relpath(raw_path)
        ctx.target = f"team:{team}/artifact:{path}"
        namespace = self._namespace(ctx.require_principal(), team, Role.MEMBER)
        info = self._blobs.put(chunks)

        def work(s: Session) -> ArtifactFile:
            stored = _store.upsert_file(
                s, namespace, path, info.digest, info.size, self._clock(), ctx.actor
            )
            self._audit.record(s, ctx, ctx.target, digest=info.digest, size=info.size)
            return stored

        return self._db.run(work, retry_unique=True)  # as in store_file

    def stat(self, principal: Principal, team: str, raw_path: str) -> ArtifactFile:
        path = safe_relpath(raw_path)
        namespace = self._namespace(principal, team, Role.VIEWER)
        with self._db.unit_of_work(write=False) as s:
            return _store.get_file(s, namespace, path)

    def open(
        self, principal: Principal, team: str, raw_path: str
    ) -> tuple[ArtifactFile, Iterator[bytes]]:
        """The file's record and its bytes, verified against the digest as they stream."""
        found = self.stat(principal, team, raw_path)
        return found, self._blobs.open(found.digest)

    def list(
        self,
        principal: Principal,
        team: str,
        prefix: str = "",
        limit: int = 1000,
        after: str | None = None,
    ) -> list[ArtifactFile]:
        """The team's files by path, those under ``prefix``; ``after``: the page after
        that path."""
        clean = safe_relpath(prefix) if prefix else ""
        namespace = self._namespace(principal, team, Role.VIEWER)
        with self._db.unit_of_work(write=False) as s:
            return _store.list_files(s, namespace, clean, min(limit, MAX_LIST), after)

    def delete(self, ctx: AuditContext, team: str, raw_path: str) -> None:
        """Remove the file from the index; the blob stays while other files use it."""
        path = safe_relpath(raw_path)
        ctx.target = f"team:{team}/artifact:{path}"
        namespace = self._namespace(ctx.require_principal(), team, Role.MAINTAINER)

        def work(s: Session) -> None:
            removed = _store.delete_file(s, namespace, path)
            self._audit.record(s, ctx, ctx.target, digest=removed.digest)

        self._db.run(work)
