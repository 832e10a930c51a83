"""Reference profiles: what a monitor compares live traffic with, built once per model version.

A profile belongs to a registered model version and names the dataset version it was trained
on. The server builds it by streaming that version's Parquet parts, batch by batch, through
the core's :class:`~shamal.monitoring.core.SketchBuilder` (memory bounded by one batch and
the sketches, whatever the dataset's size); a training job that has the model computes its
predictions on the training set and uploads those columns' sketches. Only sketches are kept.

Access follows the registry: readers of the model read its profiles; members of the model's
team build, upload and delete them, and building also needs read access to the dataset.
"""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.datasets import DatasetService
from shamal.db import Database
from shamal.errors import InvalidParameter, NotFound
from shamal.monitoring import _store
from shamal.monitoring._entities import ColumnRole, ReferenceColumn, ReferenceProfile
from shamal.monitoring._rules import MAX_COLUMNS, check_column
from shamal.monitoring.core import ColumnSketch, SketchBuilder, chunk_bands, chunk_statistic
from shamal.registry import RegistryService
from shamal.security import AuditContext, AuditLog, Principal, Role

logger = logging.getLogger(__name__)

__all__ = ["ReferenceService"]

#: Rows per Arrow batch read from a dataset part (what bounds the build's memory).
BATCH_ROWS: Final = 65_536
MAX_LIST: Final = 1000


#: Reference chunks whose drift distances give each column's band (NannyML's approach).
CHUNKS: Final = 10
#: Fewer rows per chunk than this give no bands (the distances would be noise).
MIN_CHUNK_ROWS: Final = 50


class _Chunks:
    """The reference split into :data:`CHUNKS` runs of rows, each sketched as it streams
    by: the spread of the chunks' drift distances from the whole is what a window of live
    traffic is judged against (memory: ten sets of sketches)."""

    def __init__(self, rows: int) -> None:
        self.size = rows // CHUNKS
        self.done: list[dict[str, ColumnSketch]] = []
        self._builder = SketchBuilder()
        self._filled = 0

    def update(self, batch: pa.RecordBatch) -> None:
        if self.size < MIN_CHUNK_ROWS:
            return
        offset = 0
        while offset < batch.num_rows and len(self.done) < CHUNKS:
            take = min(self.size - self._filled, batch.num_rows - offset)
            self._builder.update(batch.slice(offset, take))
            self._filled += take
            offset += take
            if self._filled == self.size:
                self.done.append(self._builder.result())
                self._builder, self._filled = SketchBuilder(), 0

    def bands(self, whole: Mapping[str, ColumnSketch]) -> dict[str, Any] | None:
        """Per column: the chunks' distances and the band above which a window drifted."""
        if len(self.done) < CHUNKS:
            return None
        columns: dict[str, Any] = {}
        for name, sketch in whole.items():
            parts = [c[name] for c in self.done if c[name].kind == sketch.kind]
            values = [chunk_statistic(sketch, part) for part in parts]
            try:
                band = chunk_bands(values, sides="upper")
            except InvalidParameter:  # no finite distance: the column has no band
                continue
            columns[name] = {"band": band.to_json(), "distances": values}
        return {"rows_per_chunk": self.size, "columns": columns}


def _target(model: str, version: int) -> str:
    return f"reference:{model}/{version}"


def _wanted(
    uri: str, names: Sequence[str], columns: Sequence[str] | None, label: str | None
) -> list[str]:
    """The columns to profile: ``columns`` (default: all) and the label, each one the
    dataset version has.

    Raises:
        InvalidParameter: too many columns, or one the version lacks.
    """
    wanted = list(columns) if columns else list(names)
    if label is not None and label not in wanted:
        wanted.append(label)
    if len(wanted) > MAX_COLUMNS:
        raise InvalidParameter(f"a reference profile holds at most {MAX_COLUMNS} columns")
    missing = [check_column(c) for c in wanted if c not in names]
    if missing:
        raise InvalidParameter(
            f"{uri} has no column {missing[0]!r} (its columns: {', '.join(names[:20])})"
        )
    return wanted


class ReferenceService:
    """Build, upload, read and delete reference profiles. Thread-safe.

    Every method raises ``NotFound`` for a model version (or dataset) the caller cannot
    see, ``PermissionDenied`` for a role too low and ``InvalidParameter`` for bad input.
    """

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        registry: RegistryService,
        datasets: DatasetService,
        spool: Path,
        clock: Clock = utc_now,
        *,
        batch_rows: int = BATCH_ROWS,
    ) -> None:
        self._db = db
        self._audit = audit
        self._registry = registry
        self._datasets = datasets
        self._spool = spool
        self._clock = clock
        self._batch_rows = batch_rows

    def _model(self, principal: Principal, model: str, version: int, needed: Role) -> None:
        """Raises unless ``principal`` reads ``model``'s ``version`` and holds ``needed``
        in the model's team."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise InvalidParameter("a model version is a number from 1")
        self._registry.get_model_version(principal, model, version)
        if needed > Role.VIEWER:
            found = self._registry.get_registered_model(principal, model)
            principal.require_owner_role(found.team_id, needed, f"registered model {model!r}")

    # ------------------------------------------------------------------ reads
    def get(self, principal: Principal, model: str, version: int) -> ReferenceProfile:
        """The profile of ``model``'s ``version`` (readers of the model).

        Raises:
            NotFound: no such version, or it has no profile yet.
        """
        self._model(principal, model, version, Role.VIEWER)
        with self._db.unit_of_work(write=False) as s:
            found = _store.reference(s, model, version)
        if found is None:
            raise NotFound(
                f"model {model!r} version {version} has no reference profile; build one "
                "with `shamal monitor reference build`"
            )
        return found

    def list_references(
        self, principal: Principal, model: str, *, limit: int = 100
    ) -> list[ReferenceProfile]:
        """The profiles of ``model``'s versions, newest version first."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidParameter(f"limit must be between 1 and {MAX_LIST}")
        self._registry.get_registered_model(principal, model)
        with self._db.unit_of_work(write=False) as s:
            return _store.references(s, model, limit)

    # ------------------------------------------------------------------ writes
    def _save(self, ctx: AuditContext, profile: ReferenceProfile, **detail: Any) -> None:
        def work(s: Session) -> None:
            _store.save_reference(s, uuid.uuid4().hex, profile)
            self._audit.record(s, ctx, _target(profile.model, profile.version), **detail)

        self._db.run(work)

    def _existing(self, model: str, version: int) -> ReferenceProfile | None:
        with self._db.unit_of_work(write=False) as s:
            return _store.reference(s, model, version)

    def build(
        self,
        ctx: AuditContext,
        model: str,
        version: int,
        dataset: str,
        *,
        label: str | None = None,
        columns: Sequence[str] | None = None,
    ) -> ReferenceProfile:
        """Profile the dataset version ``dataset`` names (``NAME/3``, ``NAME@alias``) as
        the reference of ``model``'s ``version``: every column (or ``columns``) is a
        feature, ``label`` the label. Prediction columns uploaded before are kept.

        Raises:
            NotFound: the model version or the dataset version.
            InvalidParameter: a column the dataset does not have, too many columns.
        """
        principal = ctx.require_principal()
        ctx.target = _target(model, version)
        self._model(principal, model, version, Role.MEMBER)
        found = self._datasets.version(principal, dataset)
        wanted = _wanted(found.uri, [str(f.get("name")) for f in found.schema], columns, label)
        sketches, bands = self._sketch_version(
            principal, f"{found.dataset}/{found.version}", wanted
        )
        kept = {}
        before = self._existing(model, version)
        if before is not None:
            kept = {
                n: c
                for n, c in before.columns.items()
                if c.role is ColumnRole.PREDICTION and n not in sketches
            }
        profiled = {
            name: ReferenceColumn(
                name, ColumnRole.LABEL if name == label else ColumnRole.FEATURE, sketch
            )
            for name, sketch in sketches.items()
        }
        now = self._clock()
        profile = ReferenceProfile(
            model=model,
            version=version,
            dataset=found.dataset,
            dataset_version=found.version,
            rows=found.row_count,
            columns={**profiled, **kept},
            chunks=bands,
            created_by=principal.name,
            created_at=before.created_at if before else now,
            updated_at=now,
        )
        self._save(ctx, profile, dataset=found.uri, columns=len(profile.columns))
        return profile

    def _sketch_version(
        self, principal: Principal, reference: str, columns: Sequence[str]
    ) -> tuple[dict[str, ColumnSketch], dict[str, Any] | None]:
        """Stream each part of the version through one builder (and, row by row, through
        the builders of its chunks): a part is spooled to disk (the artifact store hands
        bytes), read back one batch at a time, then removed. Returns the sketches and the
        chunks' bands."""
        found = self._datasets.version(principal, reference)
        builder = SketchBuilder()
        chunks = _Chunks(found.row_count)
        self._spool.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self._spool, prefix="reference-") as folder:
            path = Path(folder) / "part.parquet"
            for index in range(len(found.parts)):
                with path.open("wb") as out:
                    for chunk in self._datasets.open_part(principal, reference, index):
                        out.write(chunk)
                parquet = pq.ParquetFile(path)
                try:
                    for batch in parquet.iter_batches(
                        batch_size=self._batch_rows, columns=list(columns)
                    ):
                        builder.update(batch)
                        chunks.update(batch)
                finally:
                    parquet.close()
        sketches = builder.result()
        return sketches, chunks.bands(sketches)

    def upload(
        self,
        ctx: AuditContext,
        model: str,
        version: int,
        sketches: Mapping[str, Any],
        *,
        role: ColumnRole = ColumnRole.PREDICTION,
    ) -> ReferenceProfile:
        """Add (or replace) columns of ``model``'s ``version`` profile from sketches a client
        computed (a training job's predictions on the training set), each checked by
        :meth:`ColumnSketch.from_json`; the profile is made if there is none.

        Raises:
            InvalidParameter: no sketches, too many, malformed JSON, or a sketch whose name
                is not its key.
        """
        principal = ctx.require_principal()
        ctx.target = _target(model, version)
        if not isinstance(sketches, Mapping) or not sketches:
            raise InvalidParameter("sketches maps column names to sketch JSON")
        if len(sketches) > MAX_COLUMNS:
            raise InvalidParameter(f"at most {MAX_COLUMNS} sketches at once")
        role = ColumnRole(role)
        parsed: dict[str, ReferenceColumn] = {}
        for name, raw in sketches.items():
            sketch = ColumnSketch.from_json(raw)
            if sketch.name != check_column(name):
                raise InvalidParameter(f"the sketch under {name[:64]!r} is of another column")
            parsed[name] = ReferenceColumn(name, role, sketch)
        self._model(principal, model, version, Role.MEMBER)
        before = self._existing(model, version)
        now = self._clock()
        columns = {**(before.columns if before else {}), **parsed}
        if len(columns) > MAX_COLUMNS:
            raise InvalidParameter(f"a reference profile holds at most {MAX_COLUMNS} columns")
        profile = ReferenceProfile(
            model=model,
            version=version,
            dataset=before.dataset if before else None,
            dataset_version=before.dataset_version if before else None,
            rows=before.rows if before else max(c.sketch.count for c in parsed.values()),
            columns=columns,
            chunks=before.chunks if before else None,
            created_by=before.created_by if before else principal.name,
            created_at=before.created_at if before else now,
            updated_at=now,
        )
        self._save(ctx, profile, uploaded=sorted(parsed)[:50], role=role.value)
        return profile

    def delete(self, ctx: AuditContext, model: str, version: int) -> None:
        """Delete the profile of ``model``'s ``version`` (members of the model's team).

        Raises:
            NotFound: no such version or no profile.
        """
        principal = ctx.require_principal()
        ctx.target = _target(model, version)
        self._model(principal, model, version, Role.MEMBER)

        def work(s: Session) -> None:
            if not _store.delete_reference(s, model, version):
                raise NotFound(f"model {model!r} version {version} has no reference profile")
            self._audit.record(s, ctx, ctx.target)

        self._db.run(work)
