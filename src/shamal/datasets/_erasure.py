"""Erasing a data subject: their rows leave every version of a dataset that holds them.

Versions are immutable and content-addressed, and erasure is the one exception the law makes:
each Parquet part holding the subject's rows is rewritten without them (a new part, named by
its new content), every version listing the old part lists the new one instead, and takes a
new digest, row count, size and profile (computed from the parts, merged per version); its
validation report keeps its verdicts but loses its failing-row samples (they may show the
subject). The version keeps its number, and its ``transformations`` record the erasure (its
id, the rows removed, the digest before). Then the old parts' bytes are deleted from the
artifact store (unless another dataset's part has the same content). The erasure's own record
keeps the subject only as a keyed hash.

Residency: a part may be held in several stores (a copy); its rewrite is written to each store
that held it, recorded there, and the old bytes are deleted from each. A part held in a store
this server does not configure is not erased behind its back: the erasure is refused until an
operator configures the store again.

Concurrency: parts are rewritten outside any transaction; the versions are then changed in
one transaction under the dataset row's lock (the lock writers of versions take), after
checking that no version appeared or changed meanwhile; if one did, the scan runs again
(parts already rewritten are reused).
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]
from sqlalchemy.orm import Session

from shamal.artifacts import ArtifactService
from shamal.clock import Clock
from shamal.datasets import _rules, _store
from shamal.datasets._entities import DataVersion, Erasure, Part
from shamal.datasets._ingest import file_digest
from shamal.datasets._privacy import matching_rows
from shamal.datasets._profile import Profiler
from shamal.db import Database
from shamal.errors import Conflict, NotFound
from shamal.security import AuditContext, AuditLog

__all__ = ["ErasureRequest", "Eraser"]

logger = logging.getLogger(__name__)

_ATTEMPTS = 3
_BATCH_ROWS = 65_536


@dataclass(frozen=True, slots=True)
class ErasureRequest:
    """What to erase: rows whose ``column`` reads (as text) as one of ``candidates`` (the
    subject's value and its tokens under every key); ``subject_hash`` is what is kept."""

    column: str
    candidates: tuple[str, ...]
    subject_hash: str
    personal: tuple[str, ...]


@dataclass
class _Rewritten:
    part: Part | None  # None: the part holds no row of the subject
    removed: int
    local: Path  # the part as it now is (the old one when unchanged)
    stores: tuple[str, ...] = ()  # the stores that held the old part (and hold the new one)


def _chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(size):
            yield chunk


def _no_samples(validation: dict[str, Any] | None) -> dict[str, Any] | None:
    if validation is None:
        return None
    results = [{**r, "samples": []} for r in validation.get("results", [])]
    return {**validation, "results": results, "samples_erased": True}


class Eraser:
    """Rewrites the parts and versions of one dataset for one erasure request."""

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        artifacts: ArtifactService,
        namespace: str,
        work_dir: Path,
        clock: Clock,
        read_part: Callable[[Part], Iterator[bytes]],
    ) -> None:
        """``read_part``: a part's bytes, from a store that holds it."""
        self._db = db
        self._read_part = read_part
        self._audit = audit
        self._artifacts = artifacts
        self._namespace = namespace
        self._work_dir = work_dir
        self._clock = clock

    def erase(self, ctx: AuditContext, ref: _store.DataSetRef, request: ErasureRequest) -> Erasure:
        """Remove the subject's rows from every version; see the module's docstring.

        Raises:
            NotFound: no version has the column.
            Conflict: writers kept changing the dataset through every attempt.
        """
        self._purge_leftovers(ref)
        self._work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="erase-", dir=self._work_dir))
        try:
            seen: dict[str, _Rewritten] = {}
            for _attempt in range(_ATTEMPTS):
                with self._db.unit_of_work(write=False) as s:
                    versions = _store.every_version(s, ref)
                if not any(request.column in {c["name"] for c in v.schema} for v in versions):
                    raise NotFound(f"no version of {ref.name!r} has a column {request.column!r}")
                for version in versions:
                    for part in version.parts:
                        if part.path not in seen:
                            seen[part.path] = self._rewrite(ref, part, request, folder)
                commit = functools.partial(
                    self._commit, ctx=ctx, ref=ref, scanned=versions, seen=seen, request=request
                )
                done = self._db.run(commit)
                if done is not None:
                    self._purge(ref, seen)
                    return done
            raise Conflict(
                f"{ref.name!r} kept changing while the erasure ran; run the erasure again"
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ parts
    def _download(self, part: Part, folder: Path) -> Path:
        local = folder / f"{part.digest}.parquet"
        if not local.exists():
            with local.open("wb") as out:
                for chunk in self._read_part(part):
                    out.write(chunk)
        return local

    def _rewrite(
        self, ref: _store.DataSetRef, part: Part, request: ErasureRequest, folder: Path
    ) -> _Rewritten:
        local = self._download(part, folder)
        source = pq.ParquetFile(local)
        if request.column not in source.schema_arrow.names:
            return _Rewritten(None, 0, local)
        out = folder / f"{part.digest}.erased.parquet"
        removed = 0
        with pq.ParquetWriter(out, source.schema_arrow, compression="zstd") as writer:
            for batch in source.iter_batches(batch_size=_BATCH_ROWS):
                mask = matching_rows(batch.column(request.column), request.candidates)
                hits = int(pc.sum(mask).as_py() or 0)
                removed += hits
                writer.write_batch(batch.filter(pc.invert(mask)) if hits else batch)
        if not removed:
            out.unlink()
            return _Rewritten(None, 0, local)
        digest = file_digest(out)
        path = _rules.part_path(ref.id, digest)
        holders = self._holders(ref, part)
        for store in holders:
            self._artifacts.store_file(None, self._namespace, path, _chunks(out), store=store)
        new = Part(path, digest, part.rows - removed, out.stat().st_size)
        return _Rewritten(new, removed, out, holders)

    def _holders(self, ref: _store.DataSetRef, part: Part) -> tuple[str, ...]:
        """The stores holding ``part``, every one of them configured here."""
        with self._db.unit_of_work(write=False) as s:
            held = _store.part_stores(s, ref.id, [part.digest])[part.digest]
        known = {store.name for store in self._artifacts.stores()}
        missing = [store for store in held if store not in known]
        if missing:
            raise Conflict(
                f"a part of {ref.name!r} is held in store(s) {', '.join(missing)}, which this "
                "server does not configure: an operator configures them again, then erase"
            )
        return tuple(held)

    def _profile(self, parts: Sequence[_Rewritten], personal: Sequence[str]) -> dict[str, Any]:
        profiler: Profiler | None = None
        for rewritten in parts:
            source = pq.ParquetFile(rewritten.local)
            names = set(source.schema_arrow.names)
            if profiler is None:
                profiler = Profiler([c for c in personal if c in names])
            for batch in source.iter_batches(batch_size=_BATCH_ROWS):
                profiler.update(batch)
        assert profiler is not None
        return {"scope": "version", **profiler.result().to_json()}

    # ------------------------------------------------------------------ versions
    def _changed(
        self, version: DataVersion, seen: dict[str, _Rewritten], request: ErasureRequest
    ) -> tuple[dict[str, Any], int] | None:
        """The new values of a version that held the subject's rows, and how many it lost."""
        rewritten = [seen[p.path] for p in version.parts]
        lost = sum(r.removed for r in rewritten)
        if not lost:
            return None
        parts = [
            r.part if r.part is not None else old
            for r, old in zip(rewritten, version.parts, strict=True)
        ]
        values = {
            "parts": [p.to_json() for p in parts],
            "digest": _rules.version_digest([p.digest for p in parts]),
            "row_count": sum(p.rows for p in parts),
            "size_bytes": sum(p.size for p in parts),
            "profile": self._profile(rewritten, request.personal),
            "validation": _no_samples(version.validation),
        }
        return values, lost

    def _commit(
        self,
        s: Session,
        ctx: AuditContext,
        ref: _store.DataSetRef,
        scanned: list[DataVersion],
        seen: dict[str, _Rewritten],
        request: ErasureRequest,
    ) -> Erasure | None:
        """Change every version that held the subject's rows, in one transaction; None
        when the dataset changed since ``scanned`` was read (the caller scans again)."""
        now = self._clock()
        _store.lock_dataset(s, ref, now)
        current = _store.every_version(s, ref)
        if [(v.id, v.digest) for v in current] != [(v.id, v.digest) for v in scanned]:
            return None
        changes = []
        for version in current:
            changed = self._changed(version, seen, request)
            if changed is not None:
                changes.append((version, *changed))
        record = _store.insert_erasure(
            s,
            ref,
            {
                "column": request.column,
                "subject_hash": request.subject_hash,
                "rows_removed": sum(lost for _v, _values, lost in changes),
                "versions": [
                    {
                        "version": v.version,
                        "rows_removed": lost,
                        "digest_before": v.digest,
                        "digest_after": values["digest"],
                        "parts_replaced": [
                            p.path for p in v.parts if seen[p.path].part is not None
                        ],
                    }
                    for v, values, lost in changes
                ],
                "created_by": ctx.actor,
                "created_at": now,
            },
        )
        for rewritten in seen.values():
            if rewritten.part is not None:
                for store in rewritten.stores:
                    _store.add_part_store(s, ref.id, rewritten.part.digest, store, now)
        for version, values, lost in changes:
            note = {
                "action": "erasure",
                "erasure": record.id,
                "column": request.column,
                "rows_removed": lost,
                "digest_before": version.digest,
            }
            values["transformations"] = [*version.transformations, note]
            _store.rewrite_version(s, version.id, values)
        self._audit.record(
            s,
            ctx,
            f"dataset/{ref.name}",
            erasure=record.id,
            column=request.column,
            subject_hash=request.subject_hash,
            rows_removed=record.rows_removed,
            versions=[v.version for v, _values, _lost in changes],
        )
        return record

    def _purge_leftovers(self, ref: _store.DataSetRef) -> None:
        """Purge what an earlier erasure replaced and could not delete (the process died
        between its commit and its purge): every part it replaced that no version names."""
        with self._db.unit_of_work(write=False) as s:
            named = {p.path for v in _store.every_version(s, ref) for p in v.parts}
            replaced = {
                path
                for done in _store.erasures(s, ref)
                for entry in done.versions
                for path in entry.get("parts_replaced", ())
            }
        for path in sorted(replaced - named):
            self._purge_part(ref, path)

    def _purge(self, ref: _store.DataSetRef, seen: dict[str, _Rewritten]) -> None:
        """Delete the bytes of every part the erasure replaced (no version names them now)."""
        for old_path, rewritten in seen.items():
            if rewritten.part is not None and rewritten.part.path != old_path:
                self._purge_part(ref, old_path)
                logger.info("erasure: purged part %s", old_path)

    def _purge_part(self, ref: _store.DataSetRef, path: str) -> None:
        """Delete a replaced part's bytes from every store that holds them, then its record
        of where it was."""
        digest = path.rsplit("/", 1)[-1].removesuffix(".parquet")
        with self._db.unit_of_work(write=False) as s:
            held = _store.part_stores(s, ref.id, [digest])[digest]
        known = {store.name for store in self._artifacts.stores()}
        self._artifacts.purge_file(
            self._namespace, path, stores=[store for store in held if store in known]
        )
        self._db.run(lambda s: _store.remove_part_stores(s, ref.id, digest))
