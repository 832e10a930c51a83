"""Rules of datasets: who may create, write, alias and read them; every change audited.

A dataset belongs to a team: its members create datasets and write versions, maintainers move
aliases, viewers read. Another team's dataset answers 404. Platform-wide datasets (no team) are
made by platform admins and readable by every account.

Writing a version: the source is spooled to a private folder, read in bounded batches and
written as one zstd Parquet part, stored content-addressed in the artifact store (so encryption
at rest, S3 and hash checks apply); then, in one transaction, the version takes the next number
and its row is written with the audit entry. A failure anywhere before that leaves no version
(a stored part no version names is only an unreferenced blob).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from shamal.artifacts import ArtifactService
from shamal.clock import Clock, utc_now
from shamal.datasets import _ingest, _rules, _store
from shamal.datasets._entities import DataSet, DataVersion, Part, VersionStatus, WriteMode
from shamal.datasets._expectations import Suite
from shamal.datasets._profile import Profiler
from shamal.datasets._validation import Report, validate
from shamal.db import Database
from shamal.errors import Conflict, InvalidParameter, NotFound, PermissionDenied
from shamal.security import AuditContext, AuditLog, Principal, Role, SecurityService

__all__ = ["NAMESPACE", "BatchHook", "DatasetService", "Ingested"]

#: The artifact namespace of dataset parts: ``<dataset id>/parts/<sha256>.parquet``.
NAMESPACE = "datasets"
MAX_LIST = 1000
#: Called with each batch on its way to storage (pseudonymization, profiling); returns the
#: batch to store.
BatchHook = Callable[[pa.RecordBatch], pa.RecordBatch]


@dataclass(frozen=True, slots=True)
class Ingested:
    """What an ingestion made of its source, before it becomes a version: the stored part,
    its schema, the profile of its rows (computed as they streamed by) and, with a suite, the
    validation report of its rows."""

    part: Part
    schema: tuple[dict[str, object], ...]
    profile: dict[str, Any]
    report: Report | None
    #: The same over the whole version the write appended to (``base``), when there was one.
    base: DataVersion | None = None
    version_profile: dict[str, Any] | None = None
    version_report: Report | None = None

    def judged(self, base: DataVersion | None) -> tuple[str, dict[str, Any], Report | None]:
        """(scope, profile, report) of the version written on ``base``: the whole version's
        when it is the base this write was measured against (or there is none), else (another
        writer appended meanwhile) this write's rows only."""
        if base is None:
            return "version", self.profile, self.report
        if self.base is not None and base.digest == self.base.digest:
            assert self.version_profile is not None
            return "version", self.version_profile, self.version_report
        return "write", self.profile, self.report


def part_path(dataset_id: str, digest: str) -> str:
    return f"{dataset_id}/parts/{digest}.parquet"


def _file_chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(size):
            yield chunk


class DatasetService:
    """Datasets, their versions and aliases. Thread-safe; one instance per process."""

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        security: SecurityService,
        artifacts: ArtifactService,
        work_dir: Path,
        clock: Clock = utc_now,
        limits: _ingest.Limits | None = None,
    ) -> None:
        """``work_dir``: where sources are spooled and parts written before storage (private
        to the server; each ingestion uses, then removes, a folder of its own). ``limits``:
        how far a compressed source may expand (decompression bombs)."""
        self._db = db
        self._audit = audit
        self._security = security
        self._artifacts = artifacts
        self._work_dir = work_dir
        self._clock = clock
        self._limits = limits or _ingest.Limits()

    # ------------------------------------------------------------------ access
    def _ref(self, s: Session, principal: Principal, name: str, needed: Role) -> _store.DataSetRef:
        ref = _store.ref(s, _rules.check_name(name))
        if ref.team_id is None:
            if needed > Role.VIEWER and not principal.user.is_admin:
                raise PermissionDenied(
                    f"dataset {name!r} is platform-wide: only platform admins change it"
                )
            return ref
        principal.require_owner_role(ref.team_id, needed, f"dataset {name!r}")
        return ref

    # ------------------------------------------------------------------ datasets
    def create(
        self, ctx: AuditContext, name: str, team: str | None = None, description: str = ""
    ) -> DataSet:
        """A new, empty dataset owned by ``team`` (default: the caller's only team).

        Raises:
            InvalidParameter: a malformed name or description; no team named, several held.
            AlreadyExists: the name is taken.
        """
        principal = ctx.require_principal()
        _rules.check_name(name)
        if len(description) > _rules.MAX_DESCRIPTION:
            raise InvalidParameter(f"a description is at most {_rules.MAX_DESCRIPTION} characters")
        owner = self._security.owning_team(principal, team, "owns this dataset")
        if owner[1] is not None:
            principal.require_owner_role(owner[1], Role.MEMBER, f"team {owner[0]!r}")

        def work(s: Session) -> DataSet:
            created = _store.create(s, name, owner, description, ctx.actor, self._clock())
            self._audit.record(s, ctx, f"dataset/{name}", team=owner[0])
            return created

        return self._db.run(work)

    def get(self, principal: Principal, name: str) -> DataSet:
        with self._db.unit_of_work(write=False) as s:
            return _store.get(s, self._ref(s, principal, name, Role.VIEWER).id)

    def list_datasets(
        self, principal: Principal, *, after: str | None = None, limit: int = 100
    ) -> list[DataSet]:
        """Datasets the caller may see, by name, after ``after``."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        visible = None if principal.user.is_admin else frozenset(principal.team_ids.values())
        with self._db.unit_of_work(write=False) as s:
            return _store.listing(s, visible, after, limit)

    # ------------------------------------------------------------------ versions
    def ingest(
        self,
        ctx: AuditContext,
        name: str,
        chunks: Iterable[bytes],
        fmt: str,
        *,
        mode: WriteMode = WriteMode.APPEND,
        source: str = "upload",
        on_batch: BatchHook | None = None,
    ) -> DataVersion:
        """A new version of ``name`` from a source file's bytes (``fmt``: csv, parquet, jsonl
        or arrow). ``append`` keeps the latest valid version's parts before the new one.

        The rows are profiled as they stream to storage, and validated against the dataset's
        suite when it has one: a version whose error-severity expectations fail is kept with
        its report, quarantined (never read by default, never aliased).

        Raises:
            InvalidParameter: an unknown format, an unreadable source (where it failed, not
                what it held), a source whose columns differ from the version it appends to.
            NotFound / PermissionDenied: not the caller's dataset, or a role below member.
        """
        if fmt not in _ingest.FORMATS:
            raise InvalidParameter(f"unknown format {fmt!r}; one of {', '.join(_ingest.FORMATS)}")

        def spooled(folder: Path) -> Iterator[pa.RecordBatch]:
            path = folder / "source"
            with path.open("wb") as handle:
                for chunk in chunks:
                    handle.write(chunk)
            yield from _ingest.read_batches(path, fmt, self._limits)
            path.unlink()

        return self._write_version(
            ctx, name, spooled, {"kind": source, "format": fmt}, mode=mode, on_batch=on_batch
        )

    def ingest_batches(
        self,
        ctx: AuditContext,
        name: str,
        batches: Iterable[pa.RecordBatch],
        *,
        source: dict[str, Any],
        mode: WriteMode = WriteMode.APPEND,
        on_batch: BatchHook | None = None,
    ) -> DataVersion:
        """A new version of ``name`` from Arrow ``batches`` (a SQL cursor, a stream's
        micro-batch): as :meth:`ingest`, whose rules all apply. ``source`` describes where the
        rows came from (``kind`` and what names it, never credentials); it is stored with the
        version."""
        return self._write_version(
            ctx, name, lambda _folder: batches, dict(source), mode=mode, on_batch=on_batch
        )

    def _write_version(
        self,
        ctx: AuditContext,
        name: str,
        produce: Callable[[Path], Iterable[pa.RecordBatch]],
        source: dict[str, Any],
        *,
        mode: WriteMode,
        on_batch: BatchHook | None,
    ) -> DataVersion:
        principal = ctx.require_principal()
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, name, Role.MEMBER)
            suite_text = _store.suite_of(s, ref)
            seen = _store.latest_valid(s, ref) if mode is WriteMode.APPEND else None
        suite = Suite.from_yaml(suite_text) if suite_text else None
        ingested = self._store_part(ref, produce, on_batch, suite, seen)

        def work(s: Session) -> DataVersion:
            # The number first: taking it locks the dataset's row, so the version appended to
            # is read after every concurrent writer before this one committed.
            number = _store.reserve_version(s, ref.id, self._clock())
            base = _store.latest_valid(s, ref) if mode is WriteMode.APPEND else None
            if base is not None and list(base.schema) != list(ingested.schema):
                raise InvalidParameter(
                    f"the source's columns differ from {name}/{base.version}'s; append rows "
                    "of the same columns and types, or write with mode overwrite"
                )
            parts = (*(base.parts if base else ()), ingested.part)
            scope, profile, report = ingested.judged(base)
            status = (
                VersionStatus.QUARANTINED
                if report is not None and not report.ok
                else VersionStatus.VALID
            )
            version = _store.insert_version(
                s,
                ref,
                {
                    "version": number,
                    "digest": _rules.version_digest([p.digest for p in parts]),
                    "status": status.value,
                    "row_count": sum(p.rows for p in parts),
                    "size_bytes": sum(p.size for p in parts),
                    "schema": list(ingested.schema),
                    "parts": [p.to_json() for p in parts],
                    "source": source,
                    "mode": mode.value,
                    "profile": {"scope": scope, **profile},
                    "validation": None if report is None else {"scope": scope, **report.to_json()},
                    "transformations": [],
                    "created_by": ctx.actor,
                    "created_at": self._clock(),
                },
            )
            self._audit.record(
                s,
                ctx,
                version.uri,
                digest=version.digest,
                rows=version.row_count,
                mode=mode.value,
                status=status.value,
            )
            return version

        return self._db.run(work)

    def _store_part(
        self,
        ref: _store.DataSetRef,
        produce: Callable[[Path], Iterable[pa.RecordBatch]],
        on_batch: BatchHook | None,
        suite: Suite | None,
        base: DataVersion | None,
    ) -> Ingested:
        self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="ingest-", dir=self._work_dir))
        try:
            profiler = Profiler()

            def each(batch: pa.RecordBatch) -> pa.RecordBatch:
                stored = on_batch(batch) if on_batch is not None else batch
                profiler.update(stored)  # as the rows stream by: no second pass
                return stored

            written = _ingest.write_part(iter(produce(folder)), folder / "part.parquet", each)
            report = None if suite is None else validate(suite, [written.path], now=self._clock())
            whole = None
            if base is not None and list(base.schema) == list(written.schema):
                # Measured as the version it makes; if the parts will not merge (an Arrow type
                # Parquet stores otherwise), the write's own figures stand, scoped to it.
                with contextlib.suppress(InvalidParameter):
                    whole = self._measure_whole(base, folder, profiler, written.path, suite)
            digest = _ingest.file_digest(written.path)
            path = part_path(ref.id, digest)
            self._artifacts.store_file(None, NAMESPACE, path, _file_chunks(written.path))
            return Ingested(
                Part(path, digest, written.rows, written.size),
                written.schema,
                profiler.result().to_json(),
                report,
                base if whole is not None else None,
                None if whole is None else whole[0],
                None if whole is None else whole[1],
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _measure_whole(
        self,
        base: DataVersion,
        folder: Path,
        written: Profiler,
        new_part: Path,
        suite: Suite | None,
    ) -> tuple[dict[str, Any], Report | None]:
        """The profile and report of ``base``'s rows plus the new part's: the earlier parts
        are read back batch by batch and profiled, then merged with the profile the new rows
        got as they streamed in; the suite runs over every part in one scan."""
        whole = Profiler()
        files = []
        for index, part in enumerate(base.parts):
            target = folder / f"base-{index:05d}.parquet"
            with target.open("wb") as out:
                for chunk in self._artifacts.read_file(NAMESPACE, part.path)[1]:
                    out.write(chunk)
            for batch in pq.ParquetFile(target).iter_batches(batch_size=65_536):
                whole.update(batch)
            files.append(target)
        whole.merge(written)
        report = None if suite is None else validate(suite, [*files, new_part], now=self._clock())
        return whole.result().to_json(), report

    def set_suite(self, ctx: AuditContext, name: str, text: str | None) -> Suite | None:
        """Validate every new version of ``name`` against the suite ``text`` (YAML; None
        removes it). A version whose error-severity expectations fail is quarantined.

        Raises:
            InvalidParameter: the suite does not parse (the key and expectation named).
        """
        principal = ctx.require_principal()
        suite = Suite.from_yaml(text) if text is not None else None

        def work(s: Session) -> None:
            ref = self._ref(s, principal, name, Role.MAINTAINER)
            _store.set_suite(s, ref, None if suite is None else suite.to_yaml(), self._clock())
            self._audit.record(s, ctx, f"dataset/{name}", suite=suite is not None)

        self._db.run(work)
        return suite

    def suite(self, principal: Principal, name: str) -> Suite | None:
        with self._db.unit_of_work(write=False) as s:
            text = _store.suite_of(s, self._ref(s, principal, name, Role.VIEWER))
        return Suite.from_yaml(text) if text else None

    def version(self, principal: Principal, reference: str) -> DataVersion:
        """The version ``reference`` names: ``NAME`` (latest valid), ``NAME/3``, ``NAME@alias``.

        Raises:
            NotFound: no such dataset, version or alias, or no valid version yet.
        """
        wanted = _rules.parse_ref(reference)
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, wanted.name, Role.VIEWER)
            if wanted.version is not None:
                return _store.version(s, ref, wanted.version)
            if wanted.alias is not None:
                return _store.version(s, ref, _store.alias_version(s, ref, wanted.alias))
            latest = _store.latest_valid(s, ref)
        if latest is None:
            raise NotFound(f"dataset {wanted.name!r} has no valid version yet; ingest one first")
        return latest

    def versions(
        self, principal: Principal, name: str, *, before: int | None = None, limit: int = 100
    ) -> list[DataVersion]:
        """The dataset's versions, newest first, below ``before``."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        with self._db.unit_of_work(write=False) as s:
            return _store.versions(s, self._ref(s, principal, name, Role.VIEWER), before, limit)

    def open_part(self, principal: Principal, reference: str, index: int) -> Iterator[bytes]:
        """The bytes of part ``index`` of the version ``reference`` names (Parquet)."""
        found = self.version(principal, reference)
        if not 0 <= index < len(found.parts):
            raise NotFound(f"{found.uri} has no part {index} (it has {len(found.parts)})")
        return self._artifacts.read_file(NAMESPACE, found.parts[index].path)[1]

    # ------------------------------------------------------------------ aliases and tags
    def set_alias(self, ctx: AuditContext, name: str, alias: str, number: int) -> DataVersion:
        """Point ``alias`` at version ``number`` (maintainers; never a quarantined version).

        Raises:
            Conflict: the version is quarantined.
        """
        principal = ctx.require_principal()
        _rules.check_alias(alias)

        def work(s: Session) -> DataVersion:
            ref = self._ref(s, principal, name, Role.MAINTAINER)
            target = _store.version(s, ref, number)
            if target.status is VersionStatus.QUARANTINED:
                raise Conflict(f"{target.uri} is quarantined: it failed validation")
            _store.set_alias(s, ref, alias, number, self._clock())
            self._audit.record(s, ctx, f"{name}@{alias}", version=number)
            return target

        return self._db.run(work)

    def delete_alias(self, ctx: AuditContext, name: str, alias: str) -> None:
        principal = ctx.require_principal()
        _rules.check_alias(alias)

        def work(s: Session) -> None:
            ref = self._ref(s, principal, name, Role.MAINTAINER)
            _store.delete_alias(s, ref, alias)
            self._audit.record(s, ctx, f"{name}@{alias}")

        self._db.run(work)

    def set_tag(self, ctx: AuditContext, name: str, number: int, key: str, value: str) -> None:
        principal = ctx.require_principal()
        _rules.check_tag(key, value)

        def work(s: Session) -> None:
            ref = self._ref(s, principal, name, Role.MEMBER)
            target = _store.version(s, ref, number)
            _store.set_tag(s, target.id, key, value)
            self._audit.record(s, ctx, target.uri, key=key)

        self._db.run(work)
