"""Rules of the feature store: who may define, read and write features; every change audited.

The **registry** holds every version of every definition. An apply validates the whole
desired set, computes its plan against the live one, refuses it when it would break a
feature service in use (a deployment names it), checks that the caller is a member of the
team that owns each object it writes and that each view's dataset belongs to that team (or
to the platform), and writes one new version per changed object under one registry number.
The catalog is readable by every account; feature *values* (training sets, online reads) only
by the owning team's members, as the datasets beneath them are.

**Offline**, a training set is a point-in-time join in DuckDB over the dataset versions the
views read (:mod:`._pit`), in bounded memory; it can be saved as a dataset version whose source
names every view version and dataset version used.

**Online**, a materialization writes each entity's newest row per view into the online store
in chunks; every write is idempotent and never goes back in time, so a run killed part way is
resumed from its last chunk. Reads take every view of a request in one round trip per key
shape.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.config import FeatureSettings
from shamal.datasets import DatasetService, DataVersion, WriteMode, parse_ref
from shamal.db import Database
from shamal.errors import Conflict, InvalidParameter, NotFound, PermissionDenied
from shamal.features import _store
from shamal.features._definitions import Definitions, FeatureView
from shamal.features._entities import (
    KINDS,
    Applied,
    EntityRows,
    FeatureObject,
    Materialization,
    MaterializeState,
    OnlineFeatures,
    TrainingSet,
)
from shamal.features._latest import compose_sql, latest_rows, select_rows
from shamal.features._online import (
    EncodedRow,
    OnlineStore,
    encode_payloads,
    encode_rows,
    open_online_store,
)
from shamal.features._pit import JoinLimits, ViewInput, historical_join
from shamal.features._plan import Plan, applied, plan
from shamal.security import AuditContext, AuditLog, Principal, Role, SecurityService

__all__ = ["MAX_ONLINE_ENTITIES", "FeatureStoreService", "ServicesInUse"]

logger = logging.getLogger(__name__)

#: How long the registry read last stays trusted without asking the database again.
REGISTRY_CHECK_S = 1.0
#: Entities one online read may name.
MAX_ONLINE_ENTITIES = 10_000
#: Threads that copy a join's dataset parts out of the artifact store (reads wait on the disk or
#: the network far more than they compute: more in flight finish sooner).
COPY_THREADS = 6
#: How the registry's JSON names each kind's list.
_SECTIONS = {
    "entity": "entities",
    "feature_view": "feature_views",
    "feature_service": "feature_services",
}

#: The feature services in use (named by a deployment): handed in by the platform.
ServicesInUse = Callable[[], frozenset[str]]


def _digest(definition: Mapping[str, Any]) -> str:
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _split(definitions: Definitions) -> dict[tuple[str, str], dict[str, Any]]:
    """Each object's JSON form, by (kind, name)."""
    data = definitions.to_json()
    return {
        (kind, item["name"]): item
        for kind, section in _SECTIONS.items()
        for item in data.get(section, [])
    }


def _joined(objects: Iterable[tuple[str, dict[str, Any]]]) -> Definitions:
    data: dict[str, list[dict[str, Any]]] = {section: [] for section in _SECTIONS.values()}
    for kind, item in objects:
        data[_SECTIONS[kind]].append(item)
    return Definitions.from_json(data)


def _pairs(features: Sequence[str]) -> list[tuple[str, str]]:
    pairs = []
    for feature in features:
        view, sep, name = feature.partition(":")
        if not sep or not view or not name:
            raise InvalidParameter(
                f"feature {feature[:100]!r} is not VIEW:FEATURE (or VIEW:* for all of a view)"
            )
        pairs.append((view, name))
    return pairs


def _with_times(rows: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``rows`` with the text of these columns read as ISO-8601 times (JSON has no time)."""
    for name in columns:
        column = rows.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            try:
                cast = column.cast(pa.timestamp("us", tz="UTC"))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise InvalidParameter(
                    f"column {name!r} holds text that is not an ISO-8601 time"
                ) from None
            rows = rows.set_column(rows.schema.get_field_index(name), name, cast)
    return rows


_TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=([^\]]+))?\]")


def _arrow_type(text: str) -> pa.DataType | None:
    """An Arrow type from its name as a version's schema records it (None: not a simple one)."""
    found = _TIMESTAMP.fullmatch(text)
    if found is not None:
        return pa.timestamp(found.group(1), tz=found.group(2))
    try:
        return pa.type_for_alias(text)
    except ValueError:
        return None


def _conformed(rows: pa.Table, schema: Sequence[Mapping[str, Any]]) -> pa.Table:
    """``rows`` as the dataset's columns: in its order, cast to its types.

    Raises:
        InvalidParameter: a column of the dataset missing, or a value that does not cast.
    """
    names = [str(c["name"]) for c in schema]
    missing = [n for n in names if n not in rows.column_names]
    if missing:
        raise InvalidParameter(f"pushed rows lack the dataset's column(s) {', '.join(missing)}")
    columns = []
    for spec in schema:
        column = rows.column(str(spec["name"]))
        wanted = _arrow_type(str(spec["type"]))
        if wanted is not None and column.type != wanted:
            try:
                column = column.cast(wanted)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise InvalidParameter(
                    f"column {spec['name']!r} does not hold {spec['type']} values"
                ) from None
        columns.append(column)
    return pa.table(columns, names=names)


def _write_chunk(
    store: OnlineStore,
    view: str,
    rows: pa.Table,
    keys: Sequence[str],
    timestamp_field: str,
    features: Sequence[str],
) -> int:
    """Write one chunk of a materialization (one row per entity): the rows whose stored JSON
    the query made (:func:`._latest.latest_rows`) as they are, the others (non-finite numbers,
    types it does not make) encoded here."""
    if "__payload" not in rows.column_names:
        return store.write(view, rows, keys, timestamp_field, features)
    payloads = rows.column("__payload")
    made = pc.is_valid(payloads)
    ready = rows.filter(made)
    texts = ready.column("__payload").cast(pa.binary()).to_pylist()
    if "__entity" in ready.column_names:
        entities = ready.column("__entity").cast(pa.binary()).to_pylist()
        micros = ready.column("__micros").to_pylist()
        # Plain (entity, micros, payload) tuples: what an EncodedRow is, without its cost.
        encoded = cast(list[EncodedRow], list(zip(entities, micros, texts, strict=True)))
    else:
        encoded = encode_payloads(ready, keys, timestamp_field, texts)
    if payloads.null_count:
        plain = [c for c in rows.column_names if not c.startswith("__")]
        rest = rows.filter(pc.invert(made)).select(plain)
        encoded += encode_rows(rest, keys, timestamp_field, features)
    return store.write_encoded(view, encoded)


def _dataset_of(view: FeatureView) -> str:
    """The name of the dataset a view reads directly (``data:NAME``, ``@alias``, ``/3``)."""
    return parse_ref(view.source.removeprefix("data:")).name


class _Registry:
    """The live definitions at one registry number, and each object's stored version."""

    def __init__(self, number: int, objects: list[FeatureObject]) -> None:
        self.number = number
        self.objects = {(o.kind, o.name): o for o in objects}
        self.definitions = _joined((o.kind, o.definition) for o in objects)


class FeatureStoreService:
    """Feature definitions, training sets and online features. Thread-safe; one per process."""

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        security: SecurityService,
        datasets: DatasetService,
        settings: FeatureSettings,
        home: Path,
        *,
        clock: Clock = utc_now,
        in_use: ServicesInUse | None = None,
    ) -> None:
        self._db = db
        self._audit = audit
        self._security = security
        self._datasets = datasets
        self._settings = settings
        self._home = home
        self._work = home / "features"
        self._clock = clock
        self._in_use = in_use or (lambda: frozenset())
        self._lock = threading.Lock()
        self._registry: _Registry | None = None
        self._checked = 0.0
        self._online: OnlineStore | None = None
        self._running: set[str] = set()

    def close(self) -> None:
        with self._lock:
            if self._online is not None:
                self._online.close()
                self._online = None

    # ------------------------------------------------------------------ registry
    def _current(self) -> _Registry:
        """The live registry: re-read when an apply has moved its number, and that number
        checked at most every :data:`REGISTRY_CHECK_S` (an apply in another server process
        reaches this one's reads within that; this process's own applies at once)."""
        cached = self._registry
        now = time.monotonic()
        if cached is not None and now - self._checked < REGISTRY_CHECK_S:
            return cached
        with self._db.unit_of_work(write=False) as s:
            number = _store.latest_apply(s)
            if cached is None or cached.number != number:
                cached = _Registry(number, _store.live_objects(s))
        self._registry = cached
        self._checked = now
        return cached

    def definitions(self) -> tuple[int, Definitions]:
        """The registry's number and its live definitions (the catalog every account reads)."""
        registry = self._current()
        return registry.number, registry.definitions

    def objects(self, kind: str | None = None) -> list[FeatureObject]:
        """The live version of every definition (of ``kind``), by kind and name."""
        if kind is not None and kind not in KINDS:
            raise InvalidParameter(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        found = self._current().objects.values()
        return sorted(
            (o for o in found if kind is None or o.kind == kind), key=lambda o: (o.kind, o.name)
        )

    def history(self, kind: str, name: str) -> list[FeatureObject]:
        """Every version of one definition, newest first (deleted ones included)."""
        if kind not in KINDS:
            raise InvalidParameter(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        with self._db.unit_of_work(write=False) as s:
            return _store.history(s, kind, name)

    def _desired(self, registry: _Registry, desired: Definitions, prune: bool) -> Definitions:
        """What the registry holds once ``desired`` is applied, every rule checked (a kept
        object may no longer hold with the new ones)."""
        desired.validate()
        whole = applied(registry.definitions, desired, prune=prune)
        whole.validate()
        return whole

    def plan(self, principal: Principal, desired: Definitions, *, prune: bool = False) -> Plan:
        """What :meth:`apply` would change (``prune``: delete what ``desired`` leaves out).

        Raises:
            InvalidParameter: the definitions break a rule (every problem listed).
        """
        del principal  # the catalog is every account's to read
        registry = self._current()
        whole = self._desired(registry, desired, prune)
        return plan(registry.definitions, whole, in_use=self._in_use(), prune=True)

    def apply(self, ctx: AuditContext, desired: Definitions, *, prune: bool = False) -> Applied:
        """Apply ``desired``: a new version of every object it changes, under one registry
        number, audited.

        Raises:
            InvalidParameter: the definitions break a rule.
            Conflict: the change would break a feature service in use (the reasons given), or
                another apply ran meanwhile.
            PermissionDenied / NotFound: an object of a team the caller is not a member of;
                a view over a dataset its team may not read.
        """
        principal = ctx.require_principal()
        registry = self._current()
        whole = self._desired(registry, desired, prune)
        planned = plan(registry.definitions, whole, in_use=self._in_use(), prune=True)
        if planned.breaking:
            raise Conflict(
                "the change would break a feature service in use: " + " ".join(planned.breaking)
            )
        if planned.empty:
            return Applied(None, ())
        writes = self._writes(principal, registry, whole, planned)
        changes = [
            {"kind": c.kind, "name": c.name, "action": c.action, "fields": list(c.fields)}
            for c in planned.changes
        ]

        def work(s: Session) -> Applied:
            number, written = _store.add_apply(
                s, registry.number, writes, changes, whole.digest(), ctx.actor, self._clock()
            )
            self._audit.record(s, ctx, f"features/apply/{number}", changes=len(changes))
            return Applied(number, tuple(changes), tuple(written))

        done = self._db.run(work)
        self._registry = None  # this process reads its own apply at once
        return done

    def _writes(
        self, principal: Principal, registry: _Registry, whole: Definitions, planned: Plan
    ) -> list[dict[str, Any]]:
        """The rows an apply writes, each checked against its owning team."""
        wanted = _split(whole)
        writes = []
        for change in planned.changes:
            key = (change.kind, change.name)
            before = registry.objects.get(key)
            if before is not None and before.owner:
                self._security.owning_team(principal, before.owner, "owns this definition")
            if change.action == "delete":
                assert before is not None
                team = self._team(principal, before.owner)
                writes.append(
                    {
                        "kind": change.kind,
                        "name": change.name,
                        "team": team,
                        "definition": before.definition,
                        "digest": before.digest,
                        "deleted": True,
                    }
                )
                continue
            definition = wanted[key]
            owner = str(definition.get("owner") or (before.owner if before else "")) or None
            team = self._team(principal, owner)
            if change.kind == "feature_view":
                self._check_source(principal, whole.view(change.name), team[0])
            writes.append(
                {
                    "kind": change.kind,
                    "name": change.name,
                    "team": team,
                    "definition": definition,
                    "digest": _digest(definition),
                    "deleted": False,
                }
            )
        return writes

    def _team(self, principal: Principal, owner: str | None) -> tuple[str, str | None]:
        return self._security.owning_team(principal, owner or None, "owns this definition")

    def _check_source(self, principal: Principal, view: FeatureView, team: str) -> None:
        """A view reads only a dataset of its own team, or a platform-wide one."""
        if not view.source.startswith("data:"):
            return
        name = _dataset_of(view)
        found = self._datasets.get(principal, name)
        if found.team not in ("", team):
            raise PermissionDenied(
                f"feature view {view.name!r} of team {team!r} cannot read dataset {name!r} of "
                f"team {found.team!r}: a view reads its own team's datasets or platform-wide ones"
            )

    # ------------------------------------------------------------------ reading views
    def _readable_view(self, principal: Principal, registry: _Registry, name: str) -> FeatureView:
        found = registry.objects.get(("feature_view", name))
        if found is None:
            raise NotFound(f"no feature view named {name!r}")
        if found.owner:
            principal.require_team_role(found.owner, Role.VIEWER)
        return registry.definitions.view(name)

    def _view_source(
        self, principal: Principal, definitions: Definitions, view: FeatureView
    ) -> tuple[DataVersion, str | None]:
        """The dataset version a view reads at the bottom of its chain, and its composed
        transformation."""
        chain = [view]
        for upstream in definitions.upstream(view.name):
            chain.append(definitions.view(upstream))
        base = chain[-1]
        reference = base.source.removeprefix("data:")
        version = self._datasets.version(principal, reference)
        return version, compose_sql([v.sql for v in reversed(chain)])

    def _part_files(self, principal: Principal, version: DataVersion, folder: Path) -> list[Path]:
        return self._copies(principal, [version], folder)[version.uri]

    def _copies(
        self, principal: Principal, versions: Sequence[DataVersion], folder: Path
    ) -> dict[str, list[Path]]:
        """Every part of these versions, decrypted and verified, as files in ``folder``, by
        version URI. Parts are copied on a few threads: one part's hashing and writing
        overlaps another's reading (each holds no lock while it does)."""
        distinct = {v.uri: v for v in versions}
        jobs = [(v, i) for v in distinct.values() for i in range(len(v.parts))]

        def copy(job: tuple[DataVersion, int]) -> Path:
            version, index = job
            path = folder / f"{version.dataset}-{version.version}-{index:05d}.parquet"
            reference = f"{version.dataset}/{version.version}"
            with path.open("wb") as out:
                for chunk in self._datasets.open_part(principal, reference, index):
                    out.write(chunk)
            return path

        with ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix="parts") as pool:
            paths = list(pool.map(copy, jobs))
        found: dict[str, list[Path]] = {uri: [] for uri in distinct}
        for (version, _), path in zip(jobs, paths, strict=True):
            found[version.uri].append(path)
        return found

    def _requested(
        self, registry: _Registry, features: Sequence[str] | None, service: str | None
    ) -> list[tuple[str, list[str]]]:
        """The features asked for, grouped by view in the order first named."""
        if (features is None) == (service is None):
            raise InvalidParameter("name either features (VIEW:FEATURE ...) or a feature service")
        definitions = registry.definitions
        if service is not None:
            pairs = list(definitions.resolve_service(service))
        else:
            assert features is not None
            pairs = []
            for view_name, name in _pairs(features):
                view = definitions.view(view_name)
                if name == "*":
                    pairs += [(view_name, f.name) for f in view.features]
                elif name not in {f.name for f in view.features}:
                    raise InvalidParameter(f"feature view {view_name!r} has no feature {name!r}")
                else:
                    pairs.append((view_name, name))
        grouped: dict[str, list[str]] = {}
        for view_name, name in pairs:
            wanted = grouped.setdefault(view_name, [])
            if name not in wanted:
                wanted.append(name)
        if not grouped:
            raise InvalidParameter("no features asked for")
        return list(grouped.items())

    # ------------------------------------------------------------------ offline
    def historical(
        self,
        ctx: AuditContext,
        entities: EntityRows,
        *,
        features: Sequence[str] | None = None,
        service: str | None = None,
        full_names: bool = False,
        out: Path | None,
        save_as: str | None = None,
    ) -> TrainingSet:
        """A training set: each entity row joined with the latest feature row at or before its
        timestamp and within each view's TTL, written to ``out`` (Parquet), or returned as an
        Arrow table (``TrainingSet.table``) when ``out`` is None.

        ``entities``: an Arrow table, or a dataset reference whose version holds the rows
        (optionally through a SELECT over it, named ``source``). ``save_as``: also write it as a
        new version of that dataset, whose source names every view and dataset version used.

        Raises:
            InvalidParameter: unknown features, missing or mistyped columns, bad SQL.
            NotFound / PermissionDenied: a view or dataset the caller may not read; a saved
                copy whose dataset's residency is wider than its sources allow.
        """
        principal = ctx.require_principal()
        registry = self._current()
        wanted = self._requested(registry, features, service)
        self._work.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="join-", dir=self._work))
        try:
            inputs: list[ViewInput] = []
            used: list[dict[str, Any]] = []
            sources = []
            for view_name, _ in wanted:
                view = self._readable_view(principal, registry, view_name)
                sources.append((view, *self._view_source(principal, registry.definitions, view)))
            started = time.perf_counter()
            copies = self._copies(principal, [version for _, version, _ in sources], folder)
            copied = time.perf_counter()
            for (view, version, sql), (_, names) in zip(sources, wanted, strict=True):
                inputs.append(
                    ViewInput(
                        name=view.name,
                        files=tuple(copies[version.uri]),
                        join_keys=registry.definitions.join_keys(view.name),
                        timestamp_field=view.timestamp_field,
                        features=tuple(names),
                        ttl_seconds=view.ttl_seconds,
                        sql=sql,
                    )
                )
                stored = registry.objects[("feature_view", view.name)]
                used.append(
                    {
                        "view": stored.uri,
                        "name": view.name,
                        "version": stored.version,
                        "dataset": version.uri,
                    }
                )
            rows = self._entity_rows(principal, entities.rows, entities.sql, folder)
            limits = JoinLimits(
                memory_limit_mb=self._settings.join_memory_mb, temp_dir=folder / "spill"
            )
            (folder / "spill").mkdir()
            result = historical_join(
                rows, entities.timestamp, inputs, out, full_names=full_names, limits=limits
            )
            logger.debug(
                "training set of %d rows: parts copied in %.2f s, joined (%s) in %.2f s",
                result.rows,
                copied - started,
                result.method,
                time.perf_counter() - copied,
            )
            saved = None
            if save_as is not None:
                batches = (
                    result.table.to_batches(max_chunksize=65_536)
                    if result.table is not None
                    else pq.ParquetFile(result.path).iter_batches(batch_size=65_536)
                )
                saved = self._save(ctx, save_as, batches, used, [u["dataset"] for u in used])
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return TrainingSet(
            result.path,
            result.rows,
            result.columns,
            tuple(used),
            saved,
            result.table,
            result.method,
        )

    def _entity_rows(
        self, principal: Principal, entities: pa.Table | str, sql: str | None, folder: Path
    ) -> pa.Table | list[Path]:
        if isinstance(entities, pa.Table):
            if sql is not None:
                raise InvalidParameter("entity SQL reads a dataset version, not uploaded rows")
            return entities
        version = self._datasets.version(principal, entities)
        (folder / "entities").mkdir()
        parts = self._part_files(principal, version, folder / "entities")
        if sql is None:
            return parts
        out = folder / "entities.parquet"
        return [select_rows(parts, sql, out, memory_limit_mb=self._settings.join_memory_mb)]

    def _save(
        self,
        ctx: AuditContext,
        name: str,
        batches: Iterable[pa.RecordBatch],
        used: list[dict[str, Any]],
        sources: list[str],
    ) -> str:
        principal = ctx.require_principal()
        allowed = self._datasets.allowed_regions(
            principal, [s.removeprefix("data:/") for s in sources]
        )
        if allowed is not None:
            target = self._datasets.residency(principal, name).regions
            if target is None or not set(target) <= allowed:
                ctx.target = f"dataset/{name}"
                self._audit.record_outcome(ctx, "residency_denied")
                raise PermissionDenied(
                    f"the training set reads data restricted to {', '.join(sorted(allowed))}; "
                    f"dataset {name!r} may be stored elsewhere: give it a residency policy "
                    "within those regions first"
                )
        version = self._datasets.ingest_batches(
            ctx,
            name,
            batches,
            source={"kind": "features", "feature_views": used},
            mode=WriteMode.OVERWRITE,
        )
        return version.uri

    # ------------------------------------------------------------------ online
    def _store(self) -> OnlineStore:
        with self._lock:
            if self._online is None:
                self._online = open_online_store(self._settings.online_store, home=self._home)
            return self._online

    def _store_name(self) -> str:
        url = self._settings.online_store
        return "redis" if url.startswith("redis") else "sqlite"

    def materialize(
        self,
        ctx: AuditContext,
        views: Sequence[str] | None = None,
        *,
        end: datetime | None = None,
        incremental: bool = False,
        on_progress: Callable[[Materialization], None] | None = None,
    ) -> list[Materialization]:
        """Write each online view's newest row per entity (event time up to ``end``, after
        the last run's end when ``incremental``) into the online store, in chunks. A run of
        the same view left unfinished (its server killed) is resumed, not started again.

        Raises:
            NotFound / PermissionDenied: a view the caller may not write (a member of its
                team may); a view whose dataset may not be copied to the online store's region.
            Conflict: the view is being materialized now.
        """
        principal = ctx.require_principal()
        registry = self._current()
        names = list(views) if views else [v.name for v in registry.definitions.views if v.online]
        done = []
        for name in names:
            view = self._readable_view(principal, registry, name)
            stored = registry.objects[("feature_view", name)]
            if stored.owner:
                principal.require_team_role(stored.owner, Role.MEMBER)
            if not view.online:
                raise InvalidParameter(f"feature view {name!r} is not online (online: false)")
            done.append(
                self._materialize_view(ctx, registry, view, stored, end, incremental, on_progress)
            )
        return done

    def _check_region(self, ctx: AuditContext, principal: Principal, version: DataVersion) -> None:
        allowed = self._datasets.allowed_regions(principal, [version.dataset])
        region = self._settings.online_region
        if allowed is not None and region not in allowed:
            ctx.target = version.uri
            self._audit.record_outcome(ctx, "residency_denied")
            raise PermissionDenied(
                f"{version.uri} may be stored only in {', '.join(sorted(allowed))}; the online "
                f"store is in {region or 'no labelled region'}: it is not copied there"
            )

    def _materialize_view(
        self,
        ctx: AuditContext,
        registry: _Registry,
        view: FeatureView,
        stored: FeatureObject,
        end: datetime | None,
        incremental: bool,
        on_progress: Callable[[Materialization], None] | None,
    ) -> Materialization:
        principal = ctx.require_principal()
        version, sql = self._view_source(principal, registry.definitions, view)
        self._check_region(ctx, principal, version)
        run = self._resumable(view.name, stored.version, version.uri)
        if run is None:
            start = self._last_end(view.name, stored.version) if incremental else None
            window = (start, end or self._clock())

            def begin(s: Session) -> Materialization:
                found = _store.start_materialization(
                    s,
                    (view.name, stored.version),
                    version.uri,
                    self._store_name(),
                    window,
                    ctx.actor,
                    self._clock(),
                )
                self._audit.record(s, ctx, f"features/materialize/{found.id}", view=view.name)
                return found

            run = self._db.run(begin)
        with self._lock:
            if run.id in self._running:
                raise Conflict(f"feature view {view.name!r} is being materialized now")
            self._running.add(run.id)
        try:
            return self._run_chunks(principal, registry, view, version, sql, run, on_progress)
        finally:
            with self._lock:
                self._running.discard(run.id)

    def _resumable(self, view: str, version: int, source: str) -> Materialization | None:
        with self._db.unit_of_work(write=False) as s:
            runs = _store.materializations(s, view, limit=1)
        if runs and runs[0].state is MaterializeState.RUNNING:
            last = runs[0]
            if last.view_version == version and last.source == source:
                return last
        return None

    def _last_end(self, view: str, version: int) -> datetime | None:
        with self._db.unit_of_work(write=False) as s:
            for run in _store.materializations(s, view, limit=50):
                if run.state is MaterializeState.SUCCEEDED and run.view_version == version:
                    return run.end
        return None

    def _run_chunks(
        self,
        principal: Principal,
        registry: _Registry,
        view: FeatureView,
        version: DataVersion,
        sql: str | None,
        run: Materialization,
        on_progress: Callable[[Materialization], None] | None,
    ) -> Materialization:
        self._work.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="materialize-", dir=self._work))
        keys = registry.definitions.join_keys(view.name)
        features = [f.name for f in view.features]
        try:
            files = self._part_files(principal, version, folder)
            latest = latest_rows(
                files,
                keys,
                view.timestamp_field,
                features,
                folder / "latest.parquet",
                sql=sql,
                window=(run.start, run.end),
                memory_limit_mb=self._settings.join_memory_mb,
            )
            chunk = self._settings.materialize_chunk_rows
            total = max(1, -(-latest.rows // chunk))
            reader = pq.ParquetFile(latest.path)
            store = self._store()
            rows = run.chunks_done * chunk
            for index, batch in enumerate(reader.iter_batches(batch_size=chunk)):
                if index < run.chunks_done:
                    continue  # written before the run was cut short
                _write_chunk(
                    store,
                    view.name,
                    pa.Table.from_batches([batch]),
                    keys,
                    view.timestamp_field,
                    features,
                )
                rows += batch.num_rows
                self._progress(run.id, index + 1, total, rows)
                if on_progress is not None:
                    on_progress(self._materialization(run.id))
            self._progress(run.id, total, total, latest.rows)
            return self._finish(run.id, MaterializeState.SUCCEEDED, None)
        except (InvalidParameter, NotFound, PermissionDenied) as exc:
            self._finish(run.id, MaterializeState.FAILED, str(exc)[:500])
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _progress(self, run_id: str, done: int, total: int, rows: int) -> None:
        def work(s: Session) -> None:
            _store.progress(s, run_id, done, total, rows)

        self._db.run(work)

    def _finish(self, run_id: str, state: MaterializeState, error: str | None) -> Materialization:
        def work(s: Session) -> Materialization:
            return _store.finish_materialization(s, run_id, state, error, self._clock())

        return self._db.run(work)

    def _materialization(self, run_id: str) -> Materialization:
        with self._db.unit_of_work(write=False) as s:
            return _store.materialization(s, run_id)

    def materializations(
        self, view: str | None = None, *, limit: int = 100
    ) -> list[Materialization]:
        """Materializations, newest first."""
        if not 1 <= limit <= 1000:
            raise InvalidParameter("limit must be between 1 and 1000")
        with self._db.unit_of_work(write=False) as s:
            return _store.materializations(s, view, limit=limit)

    def online(
        self,
        principal: Principal,
        entities: Mapping[str, Sequence[Any]],
        *,
        features: Sequence[str] | None = None,
        service: str | None = None,
        full_names: bool = False,
    ) -> OnlineFeatures:
        """The online values of each entity (``entities``: join key -> one value per entity),
        every view of the request read in one round trip per key shape.

        Raises:
            InvalidParameter: unknown features; a view's join key missing from ``entities``;
                key lists of different lengths; more than :data:`MAX_ONLINE_ENTITIES`.
        """
        counts = {len(values) for values in entities.values()}
        if len(counts) > 1:
            raise InvalidParameter("every join key needs one value per entity (same lengths)")
        count = counts.pop() if counts else 0
        if count > MAX_ONLINE_ENTITIES:
            raise InvalidParameter(
                f"{count:,} entities in one request; at most {MAX_ONLINE_ENTITIES:,}: split it"
            )
        registry = self._current()
        shapes = self._by_key_shape(
            principal, registry, self._requested(registry, features, service), entities
        )
        answer = OnlineFeatures(entities={k: list(v) for k, v in entities.items()})
        now = self._clock()
        for keys, group in shapes.items():
            columns = [entities[k] for k in keys]
            tuples = [tuple(c[i] for c in columns) for i in range(count)]
            found = self._store().read([view.name for view, _ in group], tuples)
            for view, names in group:
                self._fill(answer, view, names, found, now, full_names)
        return answer

    def _by_key_shape(
        self,
        principal: Principal,
        registry: _Registry,
        wanted: list[tuple[str, list[str]]],
        entities: Mapping[str, Sequence[Any]],
    ) -> dict[tuple[str, ...], list[tuple[FeatureView, list[str]]]]:
        """The views asked for, grouped by their join keys (one store read per group)."""
        shapes: dict[tuple[str, ...], list[tuple[FeatureView, list[str]]]] = {}
        for view_name, names in wanted:
            view = self._readable_view(principal, registry, view_name)
            keys = registry.definitions.join_keys(view_name)
            missing = [k for k in keys if k not in entities]
            if missing:
                raise InvalidParameter(
                    f"feature view {view_name!r} is keyed by {', '.join(keys)}: give "
                    f"{', '.join(missing)} for every entity"
                )
            shapes.setdefault(keys, []).append((view, names))
        return shapes

    @staticmethod
    def _fill(
        answer: OnlineFeatures,
        view: FeatureView,
        names: list[str],
        found: list[dict[str, Any]],
        now: datetime,
        full_names: bool,
    ) -> None:
        ttl = None if view.ttl_seconds is None else timedelta(seconds=view.ttl_seconds)
        states: list[str] = []
        stamps: list[datetime | None] = []
        present: list[dict[str, Any]] = []  # each entity's values, empty when not present
        nothing: dict[str, Any] = {}
        for entity in found:
            row = entity.get(view.name)
            if row is None:
                states.append("not_found")
                stamps.append(None)
                present.append(nothing)
            elif ttl is not None and now - row.event_ts > ttl:
                states.append("expired")
                stamps.append(row.event_ts)
                present.append(nothing)
            else:
                states.append("present")
                stamps.append(row.event_ts)
                present.append(row.values)
        answer.status[view.name] = states
        answer.event_timestamps[view.name] = stamps
        for name in names:
            column = f"{view.name}__{name}" if full_names else name
            if column in answer.values:
                raise InvalidParameter(
                    f"two views give a feature named {name!r}: ask with full names"
                )
            answer.values[column] = [values.get(name) for values in present]
            answer.views[column] = view.name

    def push(
        self, ctx: AuditContext, view_name: str, rows: pa.Table, *, offline: bool = True
    ) -> int:
        """Write fresh rows of a view to the online store and (``offline``) as a new version
        of its dataset, the offline copy first. Only a view that reads a dataset directly
        (no transformation) takes pushes.

        Raises:
            InvalidParameter: a view with a transformation or over another view; rows without
                its keys, event time or features.
        """
        principal = ctx.require_principal()
        registry = self._current()
        view = self._readable_view(principal, registry, view_name)
        if view.sql is not None or not view.source.startswith("data:"):
            raise InvalidParameter(
                f"feature view {view_name!r} is computed (SQL or another view): push to the "
                "dataset it reads instead"
            )
        keys = registry.definitions.join_keys(view_name)
        features = [f.name for f in view.features]
        missing = [
            c for c in (*keys, view.timestamp_field, *features) if c not in rows.column_names
        ]
        if missing:
            raise InvalidParameter(f"pushed rows lack column(s) {', '.join(missing)}")
        times = [view.timestamp_field, *(f.name for f in view.features if f.dtype == "timestamp")]
        rows = _with_times(rows, times)
        if offline:
            dataset = _dataset_of(view)
            current = self._datasets.version(principal, dataset)
            self._datasets.ingest_batches(
                ctx,
                dataset,
                _conformed(rows, current.schema).to_batches(),
                source={"kind": "feature-push", "view": view_name},
                mode=WriteMode.APPEND,
            )
        else:
            stored = registry.objects[("feature_view", view_name)]
            if stored.owner:
                principal.require_team_role(stored.owner, Role.MEMBER)
        return self._store().write(view_name, rows, keys, view.timestamp_field, features)
