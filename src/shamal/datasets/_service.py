"""Rules of datasets: who may create, write, alias and read them; every change audited.

A dataset belongs to a team: its members create datasets and write versions, maintainers move
aliases, viewers read. Another team's dataset answers 404. Platform-wide datasets (no team) are
made by platform admins and readable by every account.

Writing a version: the source is spooled to a private folder, read in bounded batches and
written as one zstd Parquet part, stored content-addressed in the artifact store (so encryption
at rest, S3 and hash checks apply); then, in one transaction, the version takes the next number
and its row is written with the audit entry. A failure anywhere before that leaves no version
(a stored part no version names is only an unreferenced blob).

A partitioned write (:meth:`DatasetService.stage_part`, :meth:`DatasetService.commit_parts`)
splits this in two: each worker of a gang job has the server store one partition as a staged
part (the same pseudonymization, residency choice and streaming profile), recorded under the
caller's own name; one commit then makes a version of all of a batch's parts in one
transaction, profiled and validated over every part in one scan.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from shamal.artifacts import ArtifactService
from shamal.clock import Clock, utc_now
from shamal.datasets import _ingest, _rules, _store
from shamal.datasets._diff import VersionDiff, diff_versions
from shamal.datasets._entities import (
    DataSet,
    DataVersion,
    Erasure,
    Part,
    Residency,
    StagedPart,
    StoreResidency,
    VersionStatus,
    WriteMode,
)
from shamal.datasets._erasure import Eraser, ErasureRequest
from shamal.datasets._expectations import Suite
from shamal.datasets._privacy import (
    PrivacyPolicy,
    Pseudonymizer,
    reveal,
    subject_hash,
    subject_tokens,
)
from shamal.datasets._profile import Profiler
from shamal.datasets._rules import part_path
from shamal.datasets._validation import Report, validate
from shamal.db import Database
from shamal.errors import Conflict, InvalidParameter, NotFound, PermissionDenied
from shamal.events import EventKind, NewEvent, emit
from shamal.security import (
    AuditContext,
    AuditLog,
    KeyUse,
    Principal,
    PseudonymKeys,
    Role,
    SecurityService,
)

__all__ = ["NAMESPACE", "BatchHook", "DatasetService", "Ingested", "Within"]

#: The artifact namespace of dataset parts: ``<dataset id>/parts/<sha256>.parquet``.
NAMESPACE = "datasets"
MAX_LIST = 1000
#: The most partitions one partitioned write has.
MAX_STAGED = _rules.MAX_PARTITIONS
#: Called with each batch on its way to storage (pseudonymization, profiling); returns the
#: batch to store.
BatchHook = Callable[[pa.RecordBatch], pa.RecordBatch]
#: Called inside the transaction that commits a version, with it (see ``ingest_batches``).
Within = Callable[[Session, DataVersion], None]


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


def _emit_version(
    s: Session, ctx: AuditContext, team: str | None, version: DataVersion, report: Report | None
) -> None:
    """The events of a new version, in its transaction: created, and validated when a suite
    judged it. Written with a job's token, both name the job (``job``: its id's prefix, as
    the token's name says), so a pipeline is never started by its own runs' writes."""
    about: dict[str, Any] = {"dataset": version.dataset, "version": version.version, "team": team}
    job = ctx.principal.job if ctx.principal is not None else None
    if job is not None:
        about["job"] = job
    created = {**about, "rows": version.row_count, "digest": version.digest}
    emit(s, NewEvent(EventKind.DATASET_VERSION_CREATED, version.uri, team, ctx.actor, created))
    if report is not None:
        judged = {**about, "passed": report.ok}
        emit(s, NewEvent(EventKind.DATASET_VERSION_VALIDATED, version.uri, team, ctx.actor, judged))


def _then(first: BatchHook | None, second: BatchHook | None) -> BatchHook | None:
    """``first`` then ``second`` (the privacy policy first: no later hook sees a raw
    personal value)."""
    if first is None or second is None:
        return first or second
    return lambda batch: second(first(batch))


#: Subjects and tokens are at most this long (a cell of text, not a file).
MAX_SUBJECT_CHARS = 65_536
MAX_REVEAL = 1000
#: The purpose of the keyed hash an erasure record keeps of its subject.
ERASURE_PURPOSE = "shamal.erasure"


def _column_rules(
    policy: PrivacyPolicy | None, versions: list[DataVersion], column: str
) -> list[dict[str, Any]]:
    """How ``column`` was (and is to be) transformed: the policy's rule and every version's
    recorded one, each once."""
    found: list[dict[str, Any]] = []
    rule = policy.rule(column) if policy is not None else None
    if rule is not None:
        found.append(rule.to_json())
    for version in versions:
        for done in version.transformations:
            if done.get("column") == column and done.get("action") != "erasure":
                entry = {k: v for k, v in done.items() if k not in ("column", "key")}
                if entry not in found:
                    found.append(entry)
    return found


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
        privacy_keys: PseudonymKeys | None = None,
        limits: _ingest.Limits | None = None,
    ) -> None:
        """``work_dir``: where sources are spooled and parts written before storage (private
        to the server; each ingestion uses, then removes, a folder of its own).
        ``privacy_keys``: the pseudonymization keys (hmac and tokenize policies need them).
        ``limits``: how far a compressed source may expand (decompression bombs)."""
        self._db = db
        self._audit = audit
        self._security = security
        self._artifacts = artifacts
        self._work_dir = work_dir
        self._clock = clock
        self._keys = privacy_keys
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
        store: str | None = None,
    ) -> DataVersion:
        """A new version of ``name`` from a source file's bytes (``fmt``: csv, parquet, jsonl
        or arrow). ``append`` keeps the latest valid version's parts before the new one.

        The rows are profiled as they stream to storage, and validated against the dataset's
        suite when it has one: a version whose error-severity expectations fail is kept with
        its report, quarantined (never read by default, never aliased).

        The part goes to ``store`` (None: the first store the dataset's residency policy
        allows, the artifact store first); see :meth:`set_residency`.

        Raises:
            InvalidParameter: an unknown format, an unreadable source (where it failed, not
                what it held), a source whose columns differ from the version it appends to.
            NotFound / PermissionDenied: not the caller's dataset, or a role below member;
                no store in a region the dataset's residency policy allows (audited).
        """
        if fmt not in _ingest.FORMATS:
            raise InvalidParameter(f"unknown format {fmt!r}; one of {', '.join(_ingest.FORMATS)}")
        text_columns = self._keyed_columns(ctx, name)

        def spooled(folder: Path) -> Iterator[pa.RecordBatch]:
            path = folder / "source"
            with path.open("wb") as handle:
                for chunk in chunks:
                    handle.write(chunk)
            yield from _ingest.read_batches(path, fmt, self._limits, text_columns=text_columns)
            path.unlink()

        return self._write_version(
            ctx,
            name,
            spooled,
            {"kind": source, "format": fmt},
            mode=mode,
            on_batch=on_batch,
            store=store,
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
        store: str | None = None,
        within: Within | None = None,
    ) -> DataVersion:
        """A new version of ``name`` from Arrow ``batches`` (a SQL cursor, a stream's
        micro-batch): as :meth:`ingest`, whose rules all apply. ``source`` describes where the
        rows came from (``kind`` and what names it, never credentials); it is stored with the
        version. ``within`` runs in the transaction that commits the version, after its row is
        written (a stream records its idempotency keys there): if it raises, no version."""
        return self._write_version(
            ctx,
            name,
            lambda _folder: batches,
            dict(source),
            mode=mode,
            on_batch=on_batch,
            store=store,
            within=within,
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
        store: str | None = None,
        within: Within | None = None,
    ) -> DataVersion:
        principal = ctx.require_principal()
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, name, Role.MEMBER)
            suite_text = _store.suite_of(s, ref)
            seen = _store.latest_valid(s, ref) if mode is WriteMode.APPEND else None
            regions = _store.regions_of(s, ref)
            policy_json = _store.privacy_of(s, ref)
        # Chosen before a byte is read: a refused write reads and stores nothing.
        target = self._write_store(ctx, name, regions, store)
        suite = Suite.from_yaml(suite_text) if suite_text else None
        policy = PrivacyPolicy.from_mapping(policy_json) if policy_json else None
        pseudonymize = self._pseudonymizer(policy)
        ingested = self._store_part(
            ref,
            produce,
            _then(pseudonymize, on_batch),
            suite,
            seen,
            target,
            personal=policy.personal if policy is not None else (),
        )
        transformations = pseudonymize.transformations() if pseudonymize is not None else []

        def work(s: Session) -> DataVersion:
            # The number first: taking it locks the dataset's row, so the version appended to
            # is read after every concurrent writer before this one committed.
            number = _store.reserve_version(s, ref.id, self._clock())
            if _store.regions_of(s, ref) != regions:
                raise Conflict(
                    f"the residency policy of {name!r} changed during the write; write again"
                )
            _store.add_part_store(s, ref.id, ingested.part.digest, target, self._clock())
            base = _store.latest_valid(s, ref) if mode is WriteMode.APPEND else None
            if base is not None and list(base.schema) != list(ingested.schema):
                raise InvalidParameter(
                    f"the source's columns differ from {name}/{base.version}'s; append rows "
                    "of the same columns and types, or write with mode overwrite"
                )
            parts = (*(base.parts if base else ()), ingested.part)
            scope, profile, report = ingested.judged(base)
            return self._insert(
                s,
                ctx,
                ref,
                number,
                parts,
                {
                    "source": source,
                    "mode": mode,
                    "transformations": transformations,
                    "schema": ingested.schema,
                    "within": within,
                },
                (scope, profile, report),
            )

        return self._db.run(work)

    def _insert(
        self,
        s: Session,
        ctx: AuditContext,
        ref: _store.DataSetRef,
        number: int,
        parts: tuple[Part, ...],
        written: dict[str, Any],
        judged: tuple[str, dict[str, Any], Report | None],
    ) -> DataVersion:
        """Write version ``number`` of ``parts`` and its audit entry (inside the transaction
        that reserved the number). ``written``: its source, mode, transformations, schema and
        ``within`` hook; ``judged``: the scope, profile and report it was measured with."""
        scope, profile, report = judged
        mode: WriteMode = written["mode"]
        within: Within | None = written.get("within")
        bad = report is not None and not report.ok
        status = VersionStatus.QUARANTINED if bad else VersionStatus.VALID
        version = _store.insert_version(
            s,
            ref,
            {
                "version": number,
                "digest": _rules.version_digest([p.digest for p in parts]),
                "status": status.value,
                "row_count": sum(p.rows for p in parts),
                "size_bytes": sum(p.size for p in parts),
                "schema": list(written["schema"]),
                "parts": [p.to_json() for p in parts],
                "source": written["source"],
                "mode": mode.value,
                "profile": {"scope": scope, **profile},
                "validation": None if report is None else {"scope": scope, **report.to_json()},
                "transformations": list(written["transformations"]),
                "created_by": ctx.actor,
                "created_at": self._clock(),
            },
        )
        if within is not None:
            within(s, version)
        self._audit.record(
            s,
            ctx,
            version.uri,
            digest=version.digest,
            rows=version.row_count,
            mode=mode.value,
            status=status.value,
        )
        _emit_version(s, ctx, _store.get(s, ref.id).team or None, version, report)
        return version

    def _store_part(
        self,
        ref: _store.DataSetRef,
        produce: Callable[[Path], Iterable[pa.RecordBatch]],
        on_batch: BatchHook | None,
        suite: Suite | None,
        base: DataVersion | None,
        store: str | None = None,
        *,
        personal: tuple[str, ...] = (),
    ) -> Ingested:
        self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="ingest-", dir=self._work_dir))
        try:
            # Personal columns keep no value in the profile; samples of them are redacted.
            profiler = Profiler(personal)

            def each(batch: pa.RecordBatch) -> pa.RecordBatch:
                stored = on_batch(batch) if on_batch is not None else batch
                profiler.update(stored)  # as the rows stream by: no second pass
                return stored

            written = _ingest.write_part(iter(produce(folder)), folder / "part.parquet", each)
            report = (
                None
                if suite is None
                else validate(suite, [written.path], now=self._clock(), personal=personal)
            )
            whole = None
            if base is not None and list(base.schema) == list(written.schema):
                # Measured as the version it makes; if the parts will not merge (an Arrow type
                # Parquet stores otherwise), the write's own figures stand, scoped to it.
                with contextlib.suppress(InvalidParameter):
                    whole = self._measure_whole(
                        base, folder, profiler, written.path, suite, personal
                    )
            digest = _ingest.file_digest(written.path)
            path = part_path(ref.id, digest)
            self._artifacts.store_file(
                None, NAMESPACE, path, _file_chunks(written.path), store=store
            )
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
        personal: tuple[str, ...] = (),
    ) -> tuple[dict[str, Any], Report | None]:
        """The profile and report of ``base``'s rows plus the new part's: the earlier parts
        are read back batch by batch and profiled, then merged with the profile the new rows
        got as they streamed in; the suite runs over every part in one scan."""
        whole = Profiler(personal)
        files = []
        for index, part in enumerate(base.parts):
            target = folder / f"base-{index:05d}.parquet"
            with target.open("wb") as out:
                for chunk in self._part_chunks(part):
                    out.write(chunk)
            for batch in pq.ParquetFile(target).iter_batches(batch_size=65_536):
                whole.update(batch)
            files.append(target)
        whole.merge(written)
        report = (
            None
            if suite is None
            else validate(suite, [*files, new_part], now=self._clock(), personal=personal)
        )
        return whole.result().to_json(), report

    # ------------------------------------------------------------------ partitioned writes
    def stage_part(
        self,
        ctx: AuditContext,
        name: str,
        batches: Iterable[pa.RecordBatch],
        *,
        source: dict[str, Any],
        batch: str,
        partition: int,
        partitions: int,
        store: str | None = None,
    ) -> StagedPart:
        """Store partition ``partition`` of ``partitions`` of a write of ``name`` as a part of
        the caller's ``batch``, not yet a version (:meth:`commit_parts` makes one of them).

        The part is written as :meth:`ingest_batches` writes one: pseudonymized by the
        dataset's privacy policy before any byte is stored, into a store its residency policy
        allows, profiled as it streams. Its record is kept next to it, under the caller's own
        name (``<dataset id>/staged/<user id>/<batch>/<partition>-of-<partitions>.json``), so
        no one else can commit it; staging a partition again (a retried worker) replaces it.

        Raises:
            InvalidParameter: a malformed batch label or partition numbers; an unreadable
                source (see :meth:`ingest`).
            NotFound / PermissionDenied: as :meth:`ingest`.
        """
        principal = ctx.require_principal()
        where = _rules.staged_folder(batch) + _rules.staged_name(partition, partitions)
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, name, Role.MEMBER)
            regions = _store.regions_of(s, ref)
            policy_json = _store.privacy_of(s, ref)
        target = self._write_store(ctx, name, regions, store)
        policy = PrivacyPolicy.from_mapping(policy_json) if policy_json else None
        pseudonymize = self._pseudonymizer(policy)
        ingested = self._store_part(
            ref,
            lambda _folder: batches,
            pseudonymize,
            None,
            None,
            target,
            personal=policy.personal if policy is not None else (),
        )
        staged = StagedPart(
            batch,
            partition,
            partitions,
            ingested.part,
            target,
            ingested.schema,
            ingested.profile,
            dict(source),
            tuple(pseudonymize.transformations() if pseudonymize is not None else ()),
            ctx.actor,
            self._clock(),
        )
        record = json.dumps(staged.to_json(), sort_keys=True).encode()
        ctx.target = f"dataset/{name}"
        ctx.detail.update(
            batch=batch, partition=partition, partitions=partitions, digest=staged.part.digest
        )
        self._artifacts.store_file(
            ctx, NAMESPACE, f"{ref.id}/staged/{principal.user.id}/{where}", [record], store=target
        )
        return staged

    def staged_parts(self, principal: Principal, name: str, batch: str) -> list[StagedPart]:
        """The caller's staged parts of ``batch`` of ``name``, by partition."""
        folder = _rules.staged_folder(batch)
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, name, Role.MEMBER)
            regions = _store.regions_of(s, ref)
        prefix = f"{ref.id}/staged/{principal.user.id}/{folder}"
        found = []
        for file in self._artifacts.files_under(NAMESPACE, prefix, MAX_STAGED + 1):
            record = self._staged_record(file.path, regions)
            if record is not None and record.batch == batch:
                found.append(record)
        return sorted(found, key=lambda r: (r.partitions, r.partition))

    def _staged_record(self, path: str, regions: tuple[str, ...] | None) -> StagedPart | None:
        """The record at ``path``, read from the first allowed store that holds it."""
        known = self._store_regions()
        for store in (name for name in known if self._allows(regions, known[name])):
            try:
                chunks = self._artifacts.read_file(NAMESPACE, path, store=store)[1]
                return StagedPart.from_json(json.loads(b"".join(chunks)))
            except NotFound:
                continue
        return None

    def commit_parts(
        self,
        ctx: AuditContext,
        name: str,
        batch: str,
        partitions: int,
        *,
        mode: WriteMode = WriteMode.APPEND,
    ) -> DataVersion:
        """One version of ``name`` from the caller's ``partitions`` staged parts of ``batch``
        (in partition order), in one transaction: their schemas and pseudonymization must
        agree; the version is profiled and validated (one scan of every part) as a whole.

        Raises:
            Conflict: not every partition is staged yet (commit once each worker staged its
                own); another writer appended meanwhile, or the parts are already committed.
            InvalidParameter: the parts' columns differ from each other or from the version
                appended to; they were pseudonymized differently.
            NotFound / PermissionDenied: as :meth:`ingest`; a staged part held only in a store
                the residency policy no longer allows.
        """
        principal = ctx.require_principal()
        _rules.staged_name(0, partitions)
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, name, Role.MEMBER)
            suite_text = _store.suite_of(s, ref)
            seen = _store.latest_valid(s, ref) if mode is WriteMode.APPEND else None
            regions = _store.regions_of(s, ref)
            policy_json = _store.privacy_of(s, ref)
        mine = self.staged_parts(principal, name, batch)
        staged = [p for p in mine if p.partitions == partitions]
        if len(staged) != partitions:
            raise Conflict(
                f"{len(staged)} of the {partitions} partitions of batch {batch!r} are staged: "
                "commit once every worker has staged its partition"
            )
        schema = _agreed(name, staged, seen)
        policy = PrivacyPolicy.from_mapping(policy_json) if policy_json else None
        suite = Suite.from_yaml(suite_text) if suite_text else None
        profile, report = self._measure_staged(
            seen, staged, suite, policy.personal if policy is not None else ()
        )

        def work(s: Session) -> DataVersion:
            number = _store.reserve_version(s, ref.id, self._clock())
            if _store.regions_of(s, ref) != regions:
                raise Conflict(
                    f"the residency policy of {name!r} changed during the write; commit again"
                )
            base = _store.latest_valid(s, ref) if mode is WriteMode.APPEND else None
            if (base and base.digest) != (seen and seen.digest):
                raise Conflict(
                    f"another version of {name!r} was written meanwhile; commit again (the "
                    "staged parts are kept)"
                )
            for part in staged:
                _store.add_part_store(s, ref.id, part.part.digest, part.store, self._clock())
            parts = (*(base.parts if base else ()), *(p.part for p in staged))
            source = {
                **{k: v for k, v in staged[0].source.items() if k != "partition"},
                "partitions": partitions,
                "batch": batch,
            }
            return self._insert(
                s,
                ctx,
                ref,
                number,
                parts,
                {
                    "source": source,
                    "mode": mode,
                    "transformations": staged[0].transformations,
                    "schema": schema,
                },
                ("version", profile, report),
            )

        return self._db.run(work)

    def _measure_staged(
        self,
        base: DataVersion | None,
        staged: Sequence[StagedPart],
        suite: Suite | None,
        personal: tuple[str, ...],
    ) -> tuple[dict[str, Any], Report | None]:
        """The profile and report of ``base``'s rows plus the staged parts': every part is
        read back batch by batch into one profiler, and the suite runs over all of them in
        one scan."""
        self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="commit-", dir=self._work_dir))
        try:
            whole = Profiler(personal)
            sources = [*(self._part_chunks(p) for p in (base.parts if base else ()))]
            sources += [
                self._artifacts.read_file(NAMESPACE, p.part.path, store=p.store)[1] for p in staged
            ]
            files = []
            for index, chunks in enumerate(sources):
                target = folder / f"part-{index:05d}.parquet"
                with target.open("wb") as out:
                    for chunk in chunks:
                        out.write(chunk)
                for batch in pq.ParquetFile(target).iter_batches(batch_size=65_536):
                    whole.update(batch)
                files.append(target)
            report = (
                None
                if suite is None
                else validate(suite, files, now=self._clock(), personal=personal)
            )
            return whole.result().to_json(), report
        finally:
            shutil.rmtree(folder, ignore_errors=True)

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

    def diff(self, principal: Principal, before: str, after: str) -> VersionDiff:
        """How the version ``after`` names differs from the one ``before`` names (references
        as :meth:`version` takes them): schema changes, row change and the shift of each
        column's profile. Read from what the versions keep: no data is read.

        Raises:
            NotFound: either version is not there (or not the caller's to read).
        """
        return diff_versions(self.version(principal, before), self.version(principal, after))

    def open_part(self, principal: Principal, reference: str, index: int) -> Iterator[bytes]:
        """The bytes of part ``index`` of the version ``reference`` names (Parquet)."""
        found = self.version(principal, reference)
        if not 0 <= index < len(found.parts):
            raise NotFound(f"{found.uri} has no part {index} (it has {len(found.parts)})")
        return self._part_chunks(found.parts[index])

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

    # ------------------------------------------------------------------ residency
    def _store_regions(self) -> dict[str, str | None]:
        return {store.name: store.region for store in self._artifacts.stores()}

    @staticmethod
    def _allows(regions: tuple[str, ...] | None, region: str | None) -> bool:
        """Whether a store in ``region`` may hold data under a policy of ``regions`` (an
        unlabelled store never may under a policy: where it keeps data is not known)."""
        return regions is None or (region is not None and region in regions)

    def _refuse(
        self, ctx: AuditContext, target: str, message: str, **detail: Any
    ) -> PermissionDenied:
        """A residency refusal, recorded in the audit log (outcome ``residency_denied``)."""
        ctx.target = target
        ctx.detail.update(detail)
        self._audit.record_outcome(ctx, "residency_denied")
        return PermissionDenied(message)

    def _write_store(
        self, ctx: AuditContext, name: str, regions: tuple[str, ...] | None, store: str | None
    ) -> str:
        """The store a new part of ``name`` goes to: ``store`` when named and allowed, else
        the first store the policy allows (the artifact store first)."""
        known = self._store_regions()
        if store is not None:
            if store not in known:
                raise NotFound(f"no store {store!r}; the stores are: {', '.join(known)}")
            if not self._allows(regions, known[store]):
                raise self._refuse(
                    ctx,
                    f"dataset/{name}",
                    f"store {store!r} is in region {known[store] or 'unlabelled'}, and the "
                    f"residency policy of {name!r} allows only {', '.join(regions or ())}: "
                    "name a store in an allowed region with --store (`shamal data residency "
                    f"{name}` lists them)",
                    store=store,
                    region=known[store],
                )
            return store
        for candidate, region in known.items():
            if self._allows(regions, region):
                return candidate
        raise self._refuse(
            ctx,
            f"dataset/{name}",
            f"no store of this server is in a region the residency policy of {name!r} allows "
            f"({', '.join(regions or ())}): an operator adds one (settings data_stores, with "
            "labels.region), or a maintainer widens the policy",
            regions=list(regions or ()),
        )

    def _part_chunks(self, part: Part) -> Iterator[bytes]:
        """The bytes of ``part``, read from a store that holds it (the artifact store first)
        and that its dataset's policy allows."""
        dataset_id = part.path.split("/", 1)[0]  # parts live at <dataset id>/parts/...
        with self._db.unit_of_work(write=False) as s:
            held = _store.part_stores(s, dataset_id, [part.digest])[part.digest]
            regions = _store.regions_of(s, _store.DataSetRef(dataset_id, "", None))
        known = self._store_regions()
        usable = [name for name in known if name in held and self._allows(regions, known[name])]
        if not usable:
            raise NotFound(
                f"part {part.digest[:12]} is held only in store(s) {', '.join(held)}, which this "
                "server does not configure in an allowed region: an operator adds the store back"
            )
        return self._artifacts.read_file(NAMESPACE, part.path, store=usable[0])[1]

    def residency(self, principal: Principal, name: str) -> Residency:
        """The dataset's residency policy and every store, judged by it."""
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, name, Role.VIEWER)
            regions = _store.regions_of(s, ref)
            held = _store.dataset_stores(s, ref.id)
        return self._residency(name, regions, held)

    def _residency(
        self, name: str, regions: tuple[str, ...] | None, held: dict[str, int]
    ) -> Residency:
        known = self._store_regions()
        stores = [
            StoreResidency(store, region, self._allows(regions, region), held.get(store, 0))
            for store, region in known.items()
        ]
        stores += [
            StoreResidency(store, None, False, count)
            for store, count in held.items()
            if store not in known
        ]
        return Residency(name, regions, tuple(stores))

    def set_residency(
        self, ctx: AuditContext, name: str, regions: Sequence[str] | None
    ) -> Residency:
        """Allow ``name``'s data to be stored and processed only in ``regions`` (None: the
        policy is removed, anywhere). Maintainers; audited.

        Raises:
            InvalidParameter: malformed regions.
            PermissionDenied: a role below maintainer; the dataset already holds data in a
                store outside the regions (audited; the data stays where it is).
        """
        principal = ctx.require_principal()
        wanted = None if regions is None else _rules.check_regions(regions)
        known = self._store_regions()
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, name, Role.MAINTAINER)
            held = _store.dataset_stores(s, ref.id)
        outside = sorted(store for store in held if not self._allows(wanted, known.get(store)))
        if outside:
            raise self._refuse(
                ctx,
                f"dataset/{name}",
                f"{name!r} already holds data in store(s) {', '.join(outside)}, outside "
                f"{', '.join(wanted or ())}: include their regions, or write the data to a new "
                "dataset made with the policy first",
                regions=list(wanted or ()),
                outside=outside,
            )

        def work(s: Session) -> Residency:
            ref = self._ref(s, principal, name, Role.MAINTAINER)
            if _store.dataset_stores(s, ref.id) != held:
                raise Conflict(f"{name!r} was written to meanwhile; set the policy again")
            _store.set_regions(s, ref, wanted, self._clock())
            self._audit.record(
                s, ctx, f"dataset/{name}", regions=None if wanted is None else list(wanted)
            )
            return self._residency(name, wanted, held)

        return self._db.run(work)

    def version_stores(self, principal: Principal, reference: str) -> tuple[str, ...]:
        """The stores that hold every part of the version ``reference`` names."""
        found = self.version(principal, reference)
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, found.dataset, Role.VIEWER)
            held = _store.part_stores(s, ref.id, [p.digest for p in found.parts])
        return _whole(found, held)

    def copy_version(self, ctx: AuditContext, reference: str, store: str) -> tuple[str, ...]:
        """Copy the parts of the version ``reference`` names into ``store`` (maintainers;
        audited), when the dataset's residency policy allows the store's region. Returns
        the stores that now hold the whole version.

        Raises:
            NotFound: no such version or store.
            PermissionDenied: a role below maintainer; the store's region is not allowed
                (audited; nothing is copied).
        """
        principal = ctx.require_principal()
        found = self.version(principal, reference)
        known = self._store_regions()
        if store not in known:
            raise NotFound(f"no store {store!r}; the stores are: {', '.join(known)}")
        with self._db.unit_of_work(write=False) as s:
            ref = self._ref(s, principal, found.dataset, Role.MAINTAINER)
            regions = _store.regions_of(s, ref)
            held = _store.part_stores(s, ref.id, [p.digest for p in found.parts])
        if not self._allows(regions, known[store]):
            raise self._refuse(
                ctx,
                found.uri,
                f"store {store!r} is in region {known[store] or 'unlabelled'}, and the "
                f"residency policy of {found.dataset!r} allows only {', '.join(regions or ())}: "
                "copy it to a store in an allowed region",
                store=store,
                region=known[store],
            )
        for part in found.parts:
            if store not in held[part.digest]:
                self._artifacts.copy_file(
                    NAMESPACE, part.path, source=self._source(held[part.digest]), target=store
                )

        def work(s: Session) -> tuple[str, ...]:
            if _store.regions_of(s, ref) != regions:
                raise Conflict(f"the residency policy of {found.dataset!r} changed; copy again")
            for part in found.parts:
                _store.add_part_store(s, ref.id, part.digest, store, self._clock())
            self._audit.record(s, ctx, found.uri, store=store, region=known[store])
            return _whole(found, _store.part_stores(s, ref.id, [p.digest for p in found.parts]))

        return self._db.run(work)

    def _source(self, holders: Sequence[str]) -> str:
        known = self._store_regions()
        for name in known:
            if name in holders:
                return name
        raise NotFound(
            f"the part is held only in store(s) {', '.join(holders)}, which this server does "
            "not configure"
        )

    def allowed_regions(
        self, principal: Principal, references: Sequence[str]
    ) -> frozenset[str] | None:
        """The regions where a job reading every dataset of ``references`` may run: the
        intersection of their residency policies (None: no policy restricts it; empty: no
        region is allowed by all of them).

        Raises:
            NotFound: a dataset the caller cannot read (no such dataset, or another team's).
        """
        allowed: frozenset[str] | None = None
        with self._db.unit_of_work(write=False) as s:
            for reference in references:
                ref = self._ref(s, principal, _rules.parse_ref(reference).name, Role.VIEWER)
                regions = _store.regions_of(s, ref)
                if regions is not None:
                    mine = frozenset(regions)
                    allowed = mine if allowed is None else allowed & mine
        return allowed

    # ------------------------------------------------------------------ privacy
    def _pseudonymizer(self, policy: PrivacyPolicy | None) -> Pseudonymizer | None:
        if policy is None:
            return None
        keys = {}
        for rule in policy.rules:
            if rule.keyed and rule.purpose is not None:
                use: KeyUse = "hmac" if rule.action == "hmac" else "siv"
                keys[rule.column] = self._require_keys().active(use, rule.purpose)
        return Pseudonymizer(policy, keys)

    def _keyed_columns(self, ctx: AuditContext, name: str) -> tuple[str, ...]:
        """The columns a policy hmacs or tokenizes: a CSV reads them as text, so that a
        value's token does not hang on how a reader guessed its type."""
        with self._db.unit_of_work(write=False) as s:
            found = _store.privacy_of(s, self._ref(s, ctx.require_principal(), name, Role.MEMBER))
        policy = PrivacyPolicy.from_mapping(found) if found else None
        return () if policy is None else tuple(r.column for r in policy.rules if r.keyed)

    def _require_keys(self) -> PseudonymKeys:
        if self._keys is None:
            raise InvalidParameter(
                "this server has no pseudonymization keys; hmac and tokenize policies need "
                "them (the server makes its key ring on start)"
            )
        return self._keys

    def set_privacy(self, ctx: AuditContext, name: str, text: str | None) -> PrivacyPolicy | None:
        """Transform the personal columns of every new version of ``name`` as the policy
        ``text`` (YAML or JSON) says, before any byte is stored; None removes it
        (maintainers). Versions already written keep what they hold: erase or overwrite.

        Raises:
            InvalidParameter: the policy does not parse (the key named), or needs keys the
                server lacks.
        """
        principal = ctx.require_principal()
        policy = PrivacyPolicy.from_text(text) if text is not None else None
        if policy is not None and policy.purposes:
            self._require_keys()

        def work(s: Session) -> None:
            ref = self._ref(s, principal, name, Role.MAINTAINER)
            _store.set_privacy(s, ref, None if policy is None else policy.to_json(), self._clock())
            self._audit.record(
                s,
                ctx,
                f"dataset/{name}",
                privacy=None if policy is None else {r.column: r.action for r in policy.rules},
            )

        self._db.run(work)
        return policy

    def privacy(self, principal: Principal, name: str) -> PrivacyPolicy | None:
        with self._db.unit_of_work(write=False) as s:
            found = _store.privacy_of(s, self._ref(s, principal, name, Role.VIEWER))
        return PrivacyPolicy.from_mapping(found) if found else None

    def _officer_or(
        self, s: Session, principal: Principal, name: str, needed: Role
    ) -> _store.DataSetRef:
        """The dataset, for a privacy officer (every dataset) or a holder of ``needed``."""
        if principal.user.privacy_officer and principal.scope == "full":
            return _store.ref(s, _rules.check_name(name))
        return self._ref(s, principal, name, needed)

    def reveal(
        self, ctx: AuditContext, name: str, column: str, tokens: list[str]
    ) -> list[str | None]:
        """The values behind tokenize tokens of ``column`` (privacy officers only), in
        order; None for a token that is not one of this column's. Audited with the counts,
        never the tokens or values.

        Raises:
            PermissionDenied: the caller is not a privacy officer.
            InvalidParameter: too many or too long tokens; the column is not tokenized.
        """
        principal = ctx.require_principal()
        principal.require_privacy_officer("revealing tokenized values")
        if not 1 <= len(tokens) <= MAX_REVEAL:
            raise InvalidParameter(f"give 1 to {MAX_REVEAL} tokens")
        if any(not isinstance(t, str) or len(t) > 4 * MAX_SUBJECT_CHARS for t in tokens):
            raise InvalidParameter("a token is a string of at most 256 KiB")
        with self._db.unit_of_work(write=False) as s:
            ref = _store.ref(s, _rules.check_name(name))
            found = _store.privacy_of(s, ref)
            versions = _store.every_version(s, ref)
        policy = PrivacyPolicy.from_mapping(found) if found else None
        purposes = [
            str(r["purpose"])
            for r in _column_rules(policy, versions, column)
            if r.get("action") == "tokenize"
        ]
        if not purposes:
            raise InvalidParameter(
                f"column {column!r} of {name!r} is not tokenized; only tokenize columns reveal"
            )
        values: list[str | None] = [None] * len(tokens)
        for purpose in purposes:
            keys = {k.key_id: k for k in self._require_keys().every("siv", purpose)}
            for index, value in enumerate(reveal(tokens, keys)):
                values[index] = values[index] if value is None else value
        revealed = sum(v is not None for v in values)

        def work(s: Session) -> None:
            self._audit.record(
                s, ctx, f"dataset/{name}", column=column, tokens=len(tokens), revealed=revealed
            )

        self._db.run(work)
        return values

    def erase(self, ctx: AuditContext, name: str, column: str, subject: str) -> Erasure:
        """Remove every row whose ``column`` holds ``subject`` from every version of
        ``name`` (dataset maintainers and privacy officers); see :mod:`._erasure`. The
        subject is matched as the column stored it (its hmac or tokenize token under every
        key of the ring, or the value itself) and kept only as a keyed hash.

        Raises:
            InvalidParameter: an empty or oversized subject; the column is generalized
                (it names no one).
            NotFound: no version has the column.
            NotFound / PermissionDenied: not the caller's dataset, or a role below
                maintainer (and no privacy-officer grant).
        """
        principal = ctx.require_principal()
        if not isinstance(subject, str) or not 0 < len(subject) <= MAX_SUBJECT_CHARS:
            raise InvalidParameter(f"a subject is 1 to {MAX_SUBJECT_CHARS} characters")
        keys = self._require_keys()
        with self._db.unit_of_work(write=False) as s:
            ref = self._officer_or(s, principal, name, Role.MAINTAINER)
            found = _store.privacy_of(s, ref)
            versions = _store.every_version(s, ref)
        policy = PrivacyPolicy.from_mapping(found) if found else None
        candidates = [subject]
        for rule in _column_rules(policy, versions, column):
            if rule.get("action") == "generalize":
                raise InvalidParameter(
                    f"column {column!r} is generalized: it does not single out a person; "
                    "erase by a column that identifies the subject"
                )
            if rule.get("action") in ("hmac", "tokenize"):
                parsed = PrivacyPolicy.from_mapping({"columns": {column: rule}}).rules[0]
                use: KeyUse = "hmac" if parsed.action == "hmac" else "siv"
                assert parsed.purpose is not None
                candidates.extend(subject_tokens(subject, parsed, keys.every(use, parsed.purpose)))
        request = ErasureRequest(
            column=column,
            candidates=tuple(dict.fromkeys(candidates)),
            subject_hash=subject_hash(subject, keys.active("hmac", ERASURE_PURPOSE)),
            personal=policy.personal if policy is not None else (),
        )
        eraser = Eraser(
            self._db,
            self._audit,
            self._artifacts,
            NAMESPACE,
            self._work_dir,
            self._clock,
            read_part=self._part_chunks,
        )
        return eraser.erase(ctx, ref, request)

    def erasures(self, principal: Principal, name: str) -> list[Erasure]:
        """The erasures made in ``name`` (maintainers and privacy officers)."""
        with self._db.unit_of_work(write=False) as s:
            ref = self._officer_or(s, principal, name, Role.MAINTAINER)
            return _store.erasures(s, ref)

    def rotate_privacy_key(self, ctx: AuditContext) -> str:
        """Make a new pseudonymization secret active (platform admins); older tokens still
        reveal and match. Returns the new key's id."""
        ctx.require_principal().require_admin()
        key_id = self._require_keys().rotate()

        def work(s: Session) -> None:
            self._audit.record(s, ctx, "privacy/keys", key=key_id)

        self._db.run(work)
        return key_id


def _whole(found: DataVersion, held: dict[str, list[str]]) -> tuple[str, ...]:
    """The stores holding every part of ``found``."""
    stores: set[str] | None = None
    for part in found.parts:
        mine = set(held.get(part.digest, ()))
        stores = mine if stores is None else stores & mine
    return tuple(sorted(stores or ()))


def _agreed(
    name: str, staged: Sequence[StagedPart], base: DataVersion | None
) -> tuple[dict[str, Any], ...]:
    """The one schema of ``staged`` (and of ``base``, appended to), which must agree."""
    schema = staged[0].schema
    for part in staged:
        if list(part.schema) != list(schema):
            raise InvalidParameter(
                f"partition {part.partition}'s columns differ from partition "
                f"{staged[0].partition}'s: every partition of a write has the same columns and "
                "types (cast them in the query, or convert the files)"
            )
        if part.transformations != staged[0].transformations:
            raise InvalidParameter(
                f"the privacy policy of {name!r} changed while the partitions were staged: "
                "stage every partition again"
            )
    if base is not None:
        if list(base.schema) != list(schema):
            raise InvalidParameter(
                f"the partitions' columns differ from {name}/{base.version}'s; append rows of "
                "the same columns and types, or write with mode overwrite"
            )
        held = {p.digest for p in base.parts}
        if any(p.part.digest in held for p in staged):
            raise Conflict(
                f"a staged part of this batch is already in {name}/{base.version}: the batch "
                "was committed"
            )
    return schema
