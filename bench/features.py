"""Features: offline retrieval, materialization and online serving, Shamal vs Feast.

One generated data set, two feature stores, the same machine and the same Redis, in one run:

- **Feast** (``bench/.features-venv``, see ``PEER_PACKAGES``): a repo generated in a temp folder,
  ``provider: local``, a file registry, the ``file`` offline store (Parquet read by pandas and
  dask) and the ``redis`` online store on ``127.0.0.1:6379`` db ``REDIS_DB`` under a project name
  unique to the run. Its entity, five feature views and feature service are applied with
  ``FeatureStore.apply`` in a process of their own before anything is timed.
- **Shamal**: an embedded platform in a temp folder (the functions under "the Shamal side"
  below): the five views' files ingested as datasets and the definitions applied in a process
  of their own before anything is timed, as Feast's apply.

The data: ``ENTITIES`` entities (1,000,000 at ``--scale 1``), five feature views ``fv0..fv4``,
each a Parquet file of ``entity_id`` (int64), ``event_timestamp`` (timestamp[us, UTC]) and 20
features ``fv{i}_f{j}`` (15 float64, 5 int64), with ``ROWS_PER_ENTITY`` = 2 rows per entity,
at a random time in each half of the ``SPAN`` (90 days from ``START``): 2,000,000 rows per
view, 10,000,000 in all. Every view's TTL is 60 days. The entity rows: ``ENTITY_ROWS``
(1,000,000) rows of ``entity_id`` (uniform over the entities), ``event_timestamp`` (uniform from
30 days after ``START`` to 20 days after the span's end) and a ``label``: about 10% of them
fall before an entity's first row in some view, about 13% past the TTL of its latest row in
some view, and about 76% find a row in all five. ``--scale S`` multiplies every row count.

What is measured, each tool in turn, part by part:

- **offline**: point-in-time join of the entity rows with all 100 features. Feast:
  ``get_historical_features(entity_df=<pandas frame of the entity rows>, features=[all 100])
  .to_arrow()``; the entity rows are read into pandas before the clock starts. Shamal:
  ``FeatureStoreService.historical(..., out=None)``, the training set as an Arrow table (the
  entity rows an Arrow table before the clock starts). Time from the call to the Arrow table;
  peak memory is the worker process's maximum resident set size, as ``wait4`` reports it
  when the process ends (imports and the store's start-up included).
  Both results are checked against a reference computed by DuckDB (an ASOF LEFT JOIN per view,
  then the TTL; in a process of its own, not timed): the rows, per view the non-null count of
  ``fv{i}_f0``, the rows with all five found and the sum of their ``fv{i}_f0``. Feast's file
  offline store (dask) drops an entity row that has no feature row within the TTL in some view,
  where a left join keeps it with nulls: its result is checked on the rows with all five.
- **materialize**: the latest row of each of the entities, all five views, written to the
  online store (Redis). Feast: ``store.materialize(START - 1 day, START + SPAN + 1 day)``.
- **online**: ``POST`` requests of 1, 10 and 100 entities, all 100 features each, from
  ``CONCURRENCY`` = 8 client threads (one keep-alive ``http.client`` connection each, bodies
  encoded beforehand from the same seeded entity ids for both tools, sent in the same order),
  ``WARMUP_S`` seconds of warm-up not counted, then ``--online-seconds`` (10) seconds counted,
  and longer until at least ``MIN_REQUESTS`` (200) requests are counted: p50 and p99 of the
  requests' latencies, and requests per second. Feast: ``feast serve`` (its Python feature
  server, gunicorn + uvicorn) with ``--workers`` set to ``--server-workers`` (1),
  ``--no-access-log`` and ``--max-requests 0`` (its default recycles a worker every ~1,000
  requests, a restart that would land in the p99); the body is ``{"features":
  ["fv0:fv0_f0", ...], "entities": {"entity_id": [...]}}``, POSTed to
  ``/get-online-features``. Before the load, one 100-entity answer is checked against the
  Parquet files (``fv{i}_f0`` of each view, from the entity's latest row). The client runs in
  this process, on the same CPUs as the servers, the same for both.

Run from the repository root with Shamal's venv::

    .venv/bin/python bench/features.py --scale 0.01 --only feast   # a quick run of Feast alone
    .venv/bin/python bench/features.py                              # the benchmark

The peer venv ``bench/.features-venv`` (git-ignored) is created when it is missing. Only keys
of the run's project are deleted from Redis at the end. Exit status: 0 once the benchmark ran,
pass or fail; 2 when the peer venv could not be set up or a tool failed. When both tools ran,
the last line sums it up: ``offline_speedup X materialize_speedup Y online_p99_ratio_min Z``
(Feast's time or p99 over Shamal's; the smallest of the three p99 ratios).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from http.client import HTTPConnection, HTTPException
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import _peers

REPO = Path(__file__).resolve().parent.parent
PEER_VENV = REPO / "bench" / ".features-venv"
FEAST_VERSION = "0.67.0"
PEER_PACKAGES = (f"feast[redis]=={FEAST_VERSION}", "pandas==2.3.3", "pyarrow==26.0.1")
SEED = 21
ENTITIES = 1_000_000
ENTITY_ROWS = 1_000_000
VIEWS = 5
FEATURES_PER_VIEW = 20
ROWS_PER_ENTITY = 2
CHUNK_ENTITIES = 250_000
#: The span starts 95 days before today (midnight UTC): every entity's newest row is then
#: within the 60-day TTL when the online stores are read, so both answer every value.
START = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=95)
SPAN = timedelta(days=90)
TTL = timedelta(days=60)
#: The entity rows' times: from this long after START to this long after START + SPAN.
ENTITY_TIMES = (timedelta(days=30), timedelta(days=20))
REDIS_HOST, REDIS_PORT, REDIS_DB = "127.0.0.1", 6379, 1
ONLINE_SIZES = (1, 10, 100)
CONCURRENCY = 8
WARMUP_S = 3.0
MIN_REQUESTS = 200
#: Request bodies encoded beforehand per size, used round-robin.
BODY_POOL = 1000
TARGET_OFFLINE = 10.0
TARGET_MATERIALIZE = 5.0
TARGET_ONLINE_P99 = 5.0
NOT_YET = "Shamal's feature store lands with issue 21"
TOOLS = ("shamal", "feast")

#: Encodes one online request for all 100 features of the given entity ids.
EncodeRequest = Callable[[Sequence[int]], bytes]
#: What a tool's online side hands the load generator: URL, encoder, and how to stop it.
#: (url, encode, stop, headers): where requests go, how a request is made of entity ids,
#: how the server stops, and the headers every request carries (a token).
OnlineTarget = tuple[str, EncodeRequest, Callable[[], None], dict[str, str]]


# ------------------------------------------------------------------------------ the data


def feature_names(view: int) -> list[str]:
    """The 20 feature columns of view ``fv{view}``."""
    return [f"fv{view}_f{j}" for j in range(FEATURES_PER_VIEW)]


def is_int_feature(j: int) -> bool:
    """Every fourth feature is int64, the rest float64."""
    return j % 4 == 3


def feature_refs() -> list[str]:
    """All 100 features as ``view:feature`` references, view by view."""
    return [f"fv{i}:{name}" for i in range(VIEWS) for name in feature_names(i)]


def scaled(count: int, scale: float) -> int:
    return max(1, round(count * scale))


def generate(data_dir: Path, scale: float) -> None:
    """Write ``fv0..fv4.parquet`` and ``entity_rows.parquet`` into ``data_dir``, seeded."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(SEED)
    entities = scaled(ENTITIES, scale)
    start_us = int(START.timestamp() * 1e6)
    span_us = int(SPAN.total_seconds() * 1e6)
    ts_type = pa.timestamp("us", tz="UTC")
    for view in range(VIEWS):
        writer = None
        for first in range(0, entities, CHUNK_ENTITIES):
            ids = np.arange(first + 1, min(first + CHUNK_ENTITIES, entities) + 1, dtype=np.int64)
            n = len(ids) * ROWS_PER_ENTITY
            # Row k of an entity falls in the k-th part of the span.
            part_us = span_us // ROWS_PER_ENTITY
            ts = np.tile(np.arange(ROWS_PER_ENTITY) * part_us, len(ids))
            columns: dict[str, Any] = {
                "entity_id": pa.array(np.repeat(ids, ROWS_PER_ENTITY)),
                "event_timestamp": pa.array(start_us + ts + rng.integers(0, part_us, n), ts_type),
            }
            for j, name in enumerate(feature_names(view)):
                values = rng.integers(0, 1000, n) if is_int_feature(j) else rng.random(n)
                columns[name] = pa.array(values)
            table = pa.table(columns)
            if writer is None:
                writer = pq.ParquetWriter(data_dir / f"fv{view}.parquet", table.schema)
            writer.write_table(table)
        assert writer is not None
        writer.close()
    rows = scaled(ENTITY_ROWS, scale)
    low = start_us + int(ENTITY_TIMES[0].total_seconds() * 1e6)
    high = start_us + span_us + int(ENTITY_TIMES[1].total_seconds() * 1e6)
    entity_rows = pa.table(
        {
            "entity_id": pa.array(rng.integers(1, entities + 1, rows, dtype=np.int64)),
            "event_timestamp": pa.array(rng.integers(low, high, rows), ts_type),
            "label": pa.array(rng.integers(0, 2, rows, dtype=np.int64)),
        }
    )
    pq.write_table(entity_rows, data_dir / "entity_rows.parquet")


def summarize(table: Any) -> dict[str, Any]:
    """What an offline result is compared on (its row order is free): ``rows``, ``found``
    (per view, the non-null count of ``fv{i}_f0``), ``all_found`` (rows with all five
    non-null) and ``checksum`` (the sum of the five over those rows)."""
    import pyarrow.compute as pc

    columns = [table.column(f"fv{i}_f0") for i in range(VIEWS)]
    found = [table.num_rows - column.null_count for column in columns]
    everywhere = pc.and_(*[pc.is_valid(c) for c in columns[:2]])
    for column in columns[2:]:
        everywhere = pc.and_(everywhere, pc.is_valid(column))
    total = 0.0
    for column in columns:
        total += pc.sum(pc.filter(column, everywhere)).as_py() or 0.0
    return {
        "rows": table.num_rows,
        "found": found,
        "all_found": pc.sum(everywhere).as_py() or 0,
        "checksum": round(total, 6),
    }


def reference_offline(data_dir: Path, work: Path) -> dict[str, Any]:
    """The point-in-time join's answer, by DuckDB (ASOF LEFT JOIN per view, then the TTL),
    in :func:`summarize`'s terms: what both tools' results are checked against. Not timed."""
    import duckdb

    ttl_s = int(TTL.total_seconds())
    picks, joins = [], []
    for i in range(VIEWS):
        picks.append(
            f"CASE WHEN v{i}.event_timestamp >= e.event_timestamp - INTERVAL {ttl_s} SECOND "
            f"THEN v{i}.fv{i}_f0 END AS f{i}"
        )
        joins.append(
            f"ASOF LEFT JOIN read_parquet('{data_dir / f'fv{i}.parquet'}') v{i} "
            f"ON e.entity_id = v{i}.entity_id AND e.event_timestamp >= v{i}.event_timestamp"
        )
    everywhere = " AND ".join(f"f{i} IS NOT NULL" for i in range(VIEWS))
    query = (
        f"WITH j AS (SELECT {', '.join(picks)} "
        f"FROM read_parquet('{data_dir / 'entity_rows.parquet'}') e {' '.join(joins)}) "
        f"SELECT count(*), {', '.join(f'count(f{i})' for i in range(VIEWS))}, "
        f"count(*) FILTER (WHERE {everywhere}), "
        f"sum({' + '.join(f'f{i}' for i in range(VIEWS))}) FILTER (WHERE {everywhere}) FROM j"
    )
    with duckdb.connect() as con:
        (row,) = con.sql(query).fetchall()
    return {
        "rows": row[0],
        "found": list(row[1 : 1 + VIEWS]),
        "all_found": row[1 + VIEWS],
        "checksum": round(row[2 + VIEWS] or 0.0, 6),
    }


def agrees(result: dict[str, Any], reference: dict[str, Any], keys: Sequence[str]) -> bool:
    """Whether an offline summary matches the reference's on ``keys`` (sums to 1e-9)."""
    for key in keys:
        if key == "checksum":
            if not math.isclose(result[key], reference[key], rel_tol=1e-9):
                return False
        elif result[key] != reference[key]:
            return False
    return True


def latest_values(data_dir: Path, ids: Sequence[int]) -> list[list[float | None]]:
    """Per view, ``fv{i}_f0`` of each entity's latest row (None when it has no row)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = pa.array(sorted(set(ids)), pa.int64())
    out: list[list[float | None]] = []
    for view in range(VIEWS):
        table = pq.read_table(
            data_dir / f"fv{view}.parquet", columns=["entity_id", "event_timestamp", f"fv{view}_f0"]
        )
        table = table.filter(pc.is_in(table.column("entity_id"), value_set=wanted))
        best: dict[int, tuple[Any, float]] = {}
        for row in table.to_pylist():
            key = row["entity_id"]
            if key not in best or row["event_timestamp"] > best[key][0]:
                best[key] = (row["event_timestamp"], row[f"fv{view}_f0"])
        out.append([best[i][1] if i in best else None for i in ids])
    return out


# ------------------------------------------------------------------------------ Feast


def feast_repo(repo: Path, project: str) -> None:
    """Write the Feast repo's ``feature_store.yaml``: local provider, file registry, file
    offline store, Redis online store on db ``REDIS_DB``."""
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(
        f"project: {project}\n"
        "provider: local\n"
        f"registry: {repo / 'registry.db'}\n"
        "offline_store:\n"
        "  type: file\n"
        "online_store:\n"
        "  type: redis\n"
        f'  connection_string: "{REDIS_HOST}:{REDIS_PORT},db={REDIS_DB}"\n'
        "entity_key_serialization_version: 3\n"
    )


def feast_apply(data_dir: Path, work: Path) -> dict[str, Any]:
    """Register the entity, the five feature views over their Parquet files and a feature
    service of all 100 features (``FeatureStore.apply``)."""
    from feast import (
        Entity,
        FeatureService,
        FeatureStore,
        FeatureView,
        Field,
        FileSource,
        ValueType,
    )
    from feast.types import Float64, Int64

    entity = Entity(name="entity", join_keys=["entity_id"], value_type=ValueType.INT64)
    views = [
        FeatureView(
            name=f"fv{i}",
            entities=[entity],
            ttl=TTL,
            schema=[
                Field(name=name, dtype=Int64 if is_int_feature(j) else Float64)
                for j, name in enumerate(feature_names(i))
            ],
            source=FileSource(
                name=f"fv{i}_source",
                path=str(data_dir / f"fv{i}.parquet"),
                timestamp_field="event_timestamp",
            ),
            online=True,
        )
        for i in range(VIEWS)
    ]
    started = time.perf_counter()
    FeatureStore(repo_path=str(work)).apply(
        [entity, *views, FeatureService(name="all_features", features=views)]
    )
    return {"work_s": time.perf_counter() - started}


def feast_offline(data_dir: Path, work: Path) -> dict[str, Any]:
    """``get_historical_features`` of the entity rows, all 100 features, to Arrow."""
    import pandas as pd
    from feast import FeatureStore

    store = FeatureStore(repo_path=str(work))
    entity_df = pd.read_parquet(data_dir / "entity_rows.parquet")
    started = time.perf_counter()
    table = store.get_historical_features(entity_df=entity_df, features=feature_refs()).to_arrow()
    elapsed = time.perf_counter() - started
    return {"work_s": elapsed, **summarize(table)}


def feast_materialize(data_dir: Path, work: Path) -> dict[str, Any]:
    """``materialize`` of all five views over the whole time range into Redis: one call, or
    (``--feast-windows N``) N calls over consecutive windows in time order, the way a Feast
    user keeps its memory within the machine's (a later window's rows overwrite an
    entity's older ones, so Redis ends with each entity's latest row either way)."""
    from feast import FeatureStore

    store = FeatureStore(repo_path=str(work))
    windows = int(os.environ.get(WINDOWS_ENV, "1"))
    first, last = START - timedelta(days=1), START + SPAN + timedelta(days=1)
    step = (last - first) / windows
    started = time.perf_counter()
    for k in range(windows):
        store.materialize(first + step * k, last if k == windows - 1 else first + step * (k + 1))
    return {"work_s": time.perf_counter() - started, "windows": windows}


def feast_online_target(work: Path, workers: int) -> OnlineTarget:
    """Start ``feast serve`` on the repo in ``work`` and wait until it is ready and quiet."""
    from _servers import ServerProcess, free_port

    port = free_port()
    argv = [str(PEER_VENV / "bin" / "feast"), "-c", str(work), "serve", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--workers", str(workers), "--no-access-log"]
    argv += ["--max-requests", "0"]
    server = ServerProcess(
        name="Feast",
        argv=argv,
        env={},
        log=work / "feast-serve.log",
        port=port,
        ready_path="/health",
    )
    server.start()
    server.settle()
    refs = feature_refs()

    def encode(ids: Sequence[int]) -> bytes:
        return json.dumps({"features": refs, "entities": {"entity_id": list(ids)}}).encode()

    return server.url + "/get-online-features", encode, server.stop, {}


def check_feast_online(url: str, body: bytes, expected: list[list[float | None]]) -> str:
    """Compare one Feast answer's ``fv{i}_f0`` values with the Parquet files' latest rows."""
    import httpx

    response = httpx.post(url, content=body, headers={"content-type": "application/json"})
    if response.status_code != 200:
        return f"NO: status {response.status_code}: {response.text[:200]}"
    answer = response.json()
    names = answer["metadata"]["feature_names"]
    wrong = 0
    for view in range(VIEWS):
        got = answer["results"][names.index(f"fv{view}_f0")]["values"]
        wrong += sum(g != e for g, e in zip(got, expected[view], strict=True))
    total = VIEWS * len(expected[0])
    return f"yes, {total} of {total}" if wrong == 0 else f"NO: {wrong} of {total} differ"


# ------------------------------------------------------------------------------ the Shamal side
# Written by the integrator with issue 21. The offline and materialize functions run each in a
# worker process of its own (Shamal's venv, PYTHONPATH=src); the online one runs in the parent,
# and the load generator after it. ``work`` is the same folder for all three, kept between
# them: the materialize step's state is there for the online step.


#: Shamal's online store in the benchmark: the same Redis as Feast's, another database.
SHAMAL_REDIS = "redis://127.0.0.1:6379/2"


def _shamal_settings(work: Path) -> Any:
    from shamal.config import FeatureSettings, Settings

    home = work / "shamal-home"
    return Settings(
        home=home,
        database_url=f"sqlite:///{home / 'shamal.db'}",
        allowed_hosts=("*",),
        features=FeatureSettings(online_store=SHAMAL_REDIS, join_memory_mb=4096),
    )


def _shamal_definitions() -> Any:
    from shamal.features import Definitions, Entity, Feature, FeatureService, FeatureView

    views = tuple(
        FeatureView(
            name=f"fv{i}",
            entities=("entity",),
            source=f"data:fv{i}",
            timestamp_field="event_timestamp",
            features=tuple(
                Feature(name, "int64" if is_int_feature(j) else "float64")
                for j, name in enumerate(feature_names(i))
            ),
            owner="bench",
            ttl_seconds=int(TTL.total_seconds()),
        )
        for i in range(VIEWS)
    )
    return Definitions(
        entities=(Entity("entity", ("entity_id",)),),
        views=views,
        services=(FeatureService("all_features", tuple(feature_refs()), "bench"),),
    )


def _shamal_platform(data_dir: Path, work: Path) -> tuple[Any, Any]:
    """The embedded platform in ``work`` with the five views' datasets ingested and the
    definitions applied (once: a later step finds them there); its admin's context."""
    from shamal.datasets import WriteMode
    from shamal.security import AuditContext
    from shamal.server import start_platform

    platform = start_platform(_shamal_settings(work))
    assert platform.admin_secret is not None or (work / "shamal-home" / "token").exists()
    secret = platform.admin_secret or (work / "shamal-home" / "token").read_text().strip()
    admin = platform.security.authenticate(secret)
    ctx = AuditContext(action="bench", actor=admin.name, principal=admin)
    if platform.features.objects():
        return platform, ctx
    platform.security.create_team(ctx, "bench")
    for i in range(VIEWS):
        platform.datasets.create(ctx, f"fv{i}", "bench")
        path = data_dir / f"fv{i}.parquet"

        def chunks(path: Path = path) -> Any:
            with path.open("rb") as handle:
                while chunk := handle.read(4 << 20):
                    yield chunk

        platform.datasets.ingest(ctx, f"fv{i}", chunks(), "parquet", mode=WriteMode.OVERWRITE)
    platform.features.apply(ctx, _shamal_definitions())
    return platform, ctx


def run_shamal_apply(data_dir: Path, work: Path) -> dict[str, Any]:
    """Ingest the five views' datasets and apply the definitions, in a process of its own
    before anything is timed (as Feast's apply): each timed part then starts a fresh
    process, not one that has just ingested 10,000,000 rows."""
    started = time.perf_counter()
    platform, _ = _shamal_platform(data_dir, work)
    platform.close()
    return {"work_s": time.perf_counter() - started}


def run_shamal_offline(data_dir: Path, work: Path) -> dict[str, Any]:
    """Point-in-time join of ``data_dir/entity_rows.parquet`` with all 100 features:
    ``FeatureStoreService.historical`` on an embedded platform (the views' datasets ingested
    and the definitions applied first, not timed), the entity rows as an Arrow table, the
    training set asked for in memory (``out=None``), as Feast's ``to_arrow()`` gives it: the
    dataset parts copied out of the artifact store and verified, then the join (its method,
    ``gather`` or ``spill``, chosen by the service under its memory limit, is recorded).

    Returns:
        ``{"work_s": <seconds of the join alone>, **summarize(<the result as an Arrow table>)}``.
    """
    import pyarrow.parquet as pq

    from shamal.features import EntityRows

    platform, ctx = _shamal_platform(data_dir, work)
    # Where the time went (parts copied, join), printed by the service at debug level.
    breakdown = logging.getLogger("shamal.features._service")
    breakdown.setLevel(logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("  shamal: %(message)s"))
    breakdown.addHandler(handler)
    try:
        entities = pq.read_table(data_dir / "entity_rows.parquet")
        started = time.perf_counter()
        found = platform.features.historical(
            ctx, EntityRows(entities, "event_timestamp"), service="all_features", out=None
        )
        elapsed = time.perf_counter() - started
    finally:
        platform.close()
    return {"work_s": elapsed, "method": found.method, **summarize(found.table)}


def run_shamal_materialize(data_dir: Path, work: Path) -> dict[str, Any]:
    """The latest row of every entity, all five views, into Redis (database 2):
    ``FeatureStoreService.materialize`` of every online view up to the end of the span.

    Returns:
        ``{"work_s": <seconds of the materialization alone>}``.
    """
    platform, ctx = _shamal_platform(data_dir, work)
    try:
        started = time.perf_counter()
        runs = platform.features.materialize(ctx, end=START + SPAN + timedelta(days=1))
        elapsed = time.perf_counter() - started
    finally:
        platform.close()
    return {"work_s": elapsed, "rows": sum(run.rows for run in runs)}


def shamal_online_target(data_dir: Path, work: Path, *, workers: int = 1) -> OnlineTarget:
    """Start Shamal's server (``workers`` processes, like Feast's) on the home the earlier
    steps made, ready and quiet; requests name the feature service of all 100 features.

    Returns:
        ``(url, encode, stop, headers)``: the URL the requests are POSTed to, a function that
        encodes the request for some entity ids, one that stops the server, and the token.
    """
    from _servers import ServerProcess, free_port

    del data_dir
    home = work / "shamal-home"
    port = free_port()
    argv = [sys.executable, "-m", "shamal", "server", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--workers", str(workers)]
    env = {
        "SHAMAL_HOME": str(home),
        "SHAMAL_DATABASE_URL": f"sqlite:///{home / 'shamal.db'}",
        "SHAMAL_FEATURES__ONLINE_STORE": SHAMAL_REDIS,
        "SHAMAL_ACCESS_LOG": "false",
        "PYTHONPATH": str(REPO / "src"),
    }
    server = ServerProcess(
        name="Shamal",
        argv=argv,
        env=env,
        log=work / "shamal-serve.log",
        port=port,
        ready_path="/ready",
    )
    server.start()
    server.settle()
    token = (home / "token").read_text().strip()

    def encode(ids: Sequence[int]) -> bytes:
        return json.dumps(
            {"entities": {"entity_id": list(ids)}, "feature_service": "all_features"}
        ).encode()

    return (
        server.url + "/api/v1/features/online",
        encode,
        server.stop,
        {"Authorization": f"Bearer {token}"},
    )


def clear_shamal_redis() -> int:
    """Remove what the benchmark wrote to Shamal's Redis database; how many keys."""
    import redis

    client = redis.Redis.from_url(SHAMAL_REDIS)
    try:
        removed = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match="shamal:features:*", count=10_000):
            batch.append(key)
            if len(batch) >= 10_000:
                removed += int(client.delete(*batch))
                batch = []
        if batch:
            removed += int(client.delete(*batch))
        return removed
    finally:
        client.close()


WORKERS: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    "reference-offline": reference_offline,
    "feast-apply": feast_apply,
    "feast-offline": feast_offline,
    "feast-materialize": feast_materialize,
    "shamal-apply": run_shamal_apply,
    "shamal-offline": run_shamal_offline,
    "shamal-materialize": run_shamal_materialize,
}


def worker(name: str, data_dir: Path, work: Path, out: Path) -> int:
    try:
        result = WORKERS[name](data_dir, work)
    except NotImplementedError as exc:
        result = {"not_implemented": str(exc)}
    out.write_text(json.dumps(result))
    return 0


# ------------------------------------------------------------------------------ the load


def load(
    url: str,
    body_for: Callable[[int], bytes],
    concurrency: int,
    duration_s: float,
    *,
    warmup_s: float = WARMUP_S,
    min_requests: int = MIN_REQUESTS,
    extra_headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """POST ``body_for(n)`` (n counts the requests) to ``url`` from ``concurrency`` threads,
    each with its own keep-alive connection, back to back: ``warmup_s`` seconds not counted,
    then ``duration_s`` seconds counted, and on until ``min_requests`` are counted (at most
    ``max(60, 5 * duration_s)`` seconds more), so that a p99 rests on enough requests.

    The client is the standard library's ``http.client``: on this machine it sends about 2.7
    times the requests per second ``httpx`` does (3,900 against 1,400 to a trivial server),
    so less of a latency is the client's own.

    Returns:
        ``requests`` (counted), ``errors`` (answers other than 200 and broken connections
        among them), ``first_error``, ``p50_ms``, ``p99_ms``, ``rps`` (counted requests over
        the counted window, from its start to the last counted answer).
    """
    parts = urlsplit(url)
    path = parts.path or "/"
    headers = {"Content-Type": "application/json", **(extra_headers or {})}
    counter = itertools.count()
    measure_from = time.perf_counter() + warmup_s
    until = measure_from + duration_s
    hard_stop = until + max(60.0, 5 * duration_s)
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    last_done = [measure_from] * concurrency
    errors: list[str] = []

    def client(slot: int) -> None:
        connection = HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
        while True:
            body = body_for(next(counter))
            sent = time.perf_counter()
            enough = sum(map(len, latencies)) >= min_requests
            if (sent >= until and enough) or sent >= hard_stop:
                break
            try:
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
                answer = response.read()
                failure = None if response.status == 200 else f"{response.status}: {answer[:200]!r}"
            except (OSError, HTTPException) as exc:
                connection.close()  # the next request opens a new connection
                failure = f"{type(exc).__name__}: {exc}"
            done = time.perf_counter()
            if sent >= measure_from:
                latencies[slot].append(done - sent)
                last_done[slot] = done
                if failure is not None:
                    errors.append(failure)
        connection.close()

    threads = [threading.Thread(target=client, args=(s,)) for s in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ordered = sorted(itertools.chain.from_iterable(latencies))
    if not ordered:
        raise RuntimeError(f"no request to {url} finished within {duration_s} s")

    def percentile(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000

    return {
        "requests": len(ordered),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "p50_ms": percentile(0.50),
        "p99_ms": percentile(0.99),
        "rps": len(ordered) / (max(last_done) - measure_from),
    }


def entity_pools(entities: int) -> dict[int, list[list[int]]]:
    """Per request size, ``BODY_POOL`` lists of entity ids, seeded: the same for both tools."""
    import numpy as np

    rng = np.random.default_rng(SEED + 1)
    return {
        size: rng.integers(1, entities + 1, (BODY_POOL, size)).tolist() for size in ONLINE_SIZES
    }


def drive(
    url: str,
    encode: EncodeRequest,
    pools: dict[int, list[list[int]]],
    seconds: float,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Load ``url`` at each request size, one after the other."""
    out: dict[str, Any] = {}
    for size in ONLINE_SIZES:
        bodies = [encode(ids) for ids in pools[size]]

        def body_for(n: int, bodies: list[bytes] = bodies) -> bytes:
            return bodies[n % len(bodies)]

        out[str(size)] = load(url, body_for, CONCURRENCY, seconds, extra_headers=headers)
    return out


# ------------------------------------------------------------------------------ the parent


def ensure_peer_venv(say: Callable[[str], None]) -> Path:
    """The peer venv with Feast and its Redis extra, made when missing or on another version."""
    probe = (
        "import feast, redis; from feast.infra.online_stores.redis import RedisOnlineStore; "
        f"assert feast.__version__ == {FEAST_VERSION!r}"
    )
    return _peers.ensure_venv(PEER_VENV, PEER_PACKAGES, probe, say)


def _versions(python: Path) -> str:
    code = (
        "import feast, pandas, pyarrow, redis;"
        "print(f'feast {feast.__version__}, pandas {pandas.__version__}, "
        "pyarrow {pyarrow.__version__}, redis-py {redis.__version__}')"
    )
    return _peers.versions(python, code)


def measure(name: str, python: Path, data_dir: Path, work: Path) -> dict[str, Any] | None:
    """Run one worker in a process of its own: its result with its wall time and peak RSS,
    or None when that side is not implemented yet. A worker that dies (Feast's materialize
    runs out of memory at scale 1) gives ``failed``, its wall time and peak, and no result."""
    out = work / f"{name}.json"
    env = dict(os.environ)
    if name.startswith("shamal"):
        env["PYTHONPATH"] = str(REPO / "src")
    command = [str(python), str(Path(__file__).resolve()), "--worker", name]
    paths = ["--data", str(data_dir), "--work", str(work), "--out", str(out)]
    started = time.perf_counter()
    process = subprocess.Popen([*command, *paths], env=env, cwd=work)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if process.returncode != 0 or not out.exists():
        killed = process.returncode == -9
        return {
            "failed": f"exit status {process.returncode}"
            + (" (killed: out of memory, see dmesg)" if killed else ""),
            "process_s": wall,
            "peak_mb": usage.ru_maxrss / 1024,
        }
    result: dict[str, Any] = json.loads(out.read_text())
    if "not_implemented" in result:
        return None
    result["process_s"] = wall
    result["peak_mb"] = usage.ru_maxrss / 1024  # Linux: kilobytes
    return result


def redis_keys(project: str, *, delete: bool) -> int:
    """Count (and delete, with ``delete``) the Redis keys of Feast's ``project`` in db
    ``REDIS_DB``: Feast's keys end with the project's name. Nothing else is touched."""
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB)
    try:
        count = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match=b"*" + project.encode(), count=10_000):
            count += 1
            batch.append(key)
            if delete and len(batch) >= 10_000:
                client.delete(*batch)
                batch = []
        if delete and batch:
            client.delete(*batch)
        return count
    finally:
        client.close()


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _value(results: dict[str, Any], tool: str, path: Sequence[str]) -> float | None:
    node: Any = results.get(tool)
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return float(node)


def _ratio(shamal: float | None, feast: float | None, higher_is_better: bool) -> float | None:
    """How many times better Shamal does than Feast."""
    if shamal is None or feast is None or min(shamal, feast) <= 0:
        return None
    return shamal / feast if higher_is_better else feast / shamal


def _rows() -> list[tuple[str, tuple[str, ...], str, bool]]:
    """The table's rows: label, where the figure sits, its format, whether higher is better."""
    rows: list[tuple[str, tuple[str, ...], str, bool]] = [
        ("offline: time, s", ("offline", "work_s"), ".2f", False),
        ("offline: peak memory (max RSS), MiB", ("offline", "peak_mb"), ",.0f", False),
        ("materialize: time, s", ("materialize", "work_s"), ".2f", False),
        ("materialize: peak memory (max RSS), MiB", ("materialize", "peak_mb"), ",.0f", False),
    ]
    for size in ONLINE_SIZES:
        name = f"online {size:>3} entit{'y' if size == 1 else 'ies'}"
        rows += [
            (f"{name}: p50, ms", ("online", str(size), "p50_ms"), ".2f", False),
            (f"{name}: p99, ms", ("online", str(size), "p99_ms"), ".2f", False),
            (f"{name}: requests/s", ("online", str(size), "rps"), ",.0f", True),
        ]
    return rows


def report(scale: float, results: dict[str, Any], seconds: float) -> list[str]:
    """The side-by-side table, the checks and the verdict lines."""
    entities = scaled(ENTITIES, scale)
    rows_per_view = entities * ROWS_PER_ENTITY
    lines = [
        f"{entities:,} entities; {VIEWS} views x {FEATURES_PER_VIEW} features, "
        f"{rows_per_view:,} rows each; {scaled(ENTITY_ROWS, scale):,} entity rows; online: "
        f"concurrency {CONCURRENCY}, {WARMUP_S:.0f} s warm-up + {seconds:.0f} s per size",
        "",
        f"{'':42}{'Shamal':>12}{'Feast':>12}{'ratio':>10}   (ratio: times better, Shamal)",
    ]
    for label, path, fmt, higher in _rows():
        shamal, feast = _value(results, "shamal", path), _value(results, "feast", path)
        ratio = _ratio(shamal, feast, higher)
        cells = ["n/a" if v is None else format(v, fmt) for v in (shamal, feast)] + [
            "n/a" if ratio is None else f"{ratio:.1f}x"
        ]
        lines.append(f"{label:42}{cells[0]:>12}{cells[1]:>12}{cells[2]:>10}")
    lines += offline_checks(results)
    peer_results: dict[str, Any] = results.get("feast") or {}
    windows = (peer_results.get("materialize") or {}).get("windows", 1)
    if windows > 1:
        lines.append(f"Feast materialized in {windows} consecutive time windows")
    if "redis_keys" in peer_results and "materialize" in peer_results:
        lines.append(f"Feast's Redis keys after materialize: {peer_results['redis_keys']:,}")
    if "online_check" in peer_results:
        lines.append(
            f"Feast's online answer matches the latest rows: {peer_results['online_check']}"
        )
    for tool in TOOLS:
        for size, run in ((results.get(tool) or {}).get("online") or {}).items():
            if run["errors"]:
                lines.append(
                    f"{tool} at {size}: {run['errors']} errors, first {run['first_error']}"
                )
    for tool in TOOLS:
        for part in ("offline", "materialize"):
            got = (results.get(tool) or {}).get(part) or {}
            if "failed" in got:
                lines.append(
                    f"{tool} {part}: FAILED, {got['failed']}, after {got['process_s']:.0f} s "
                    f"(peak {got['peak_mb']:,.0f} MiB); its online part was not run"
                )
    return lines + ["", *verdicts(results)]


def _described(o: dict[str, Any]) -> str:
    return (
        f"{o['rows']:,} rows, fv*_f0 found {o['found']}, {o['all_found']:,} with all five, "
        f"their sum {o['checksum']}"
    )


def offline_checks(results: dict[str, Any]) -> list[str]:
    """Each tool's offline result against the reference: Shamal's in full, Feast's on the
    rows with all five views found (the only rows its file offline store keeps)."""
    reference = results.get("reference")
    if not reference:
        return []
    lines = [f"offline reference (DuckDB ASOF join + TTL): {_described(reference)}"]
    for tool in TOOLS:
        got = (results.get(tool) or {}).get("offline")
        if not got:
            continue
        if tool == "feast":
            ok = (
                agrees(got, reference, ("all_found", "checksum"))
                and got["rows"] == (got["all_found"])
            )
            verdict = "yes, on the rows with all five (it drops the others)" if ok else "NO"
        else:
            ok = agrees(got, reference, ("rows", "found", "all_found", "checksum"))
            verdict = "yes" if ok else "NO"
        lines.append(f"{tool} offline result: {_described(got)}; matches the reference: {verdict}")
    return lines


def summary(results: dict[str, Any]) -> dict[str, float] | None:
    """The three figures of the last line, or None when a side is missing."""
    offline = _ratio(
        _value(results, "shamal", ("offline", "work_s")),
        _value(results, "feast", ("offline", "work_s")),
        False,
    )
    materialize = _ratio(
        _value(results, "shamal", ("materialize", "work_s")),
        _value(results, "feast", ("materialize", "work_s")),
        False,
    )
    p99 = [
        _ratio(
            _value(results, "shamal", ("online", str(size), "p99_ms")),
            _value(results, "feast", ("online", str(size), "p99_ms")),
            False,
        )
        for size in ONLINE_SIZES
    ]
    failed = (results.get("feast") or {}).get("materialize") or {}
    if materialize is None and "failed" in failed:
        # Feast died: its time until then bounds the ratio from below.
        shamal = _value(results, "shamal", ("materialize", "work_s"))
        materialize = None if not shamal else float(failed["process_s"]) / shamal
    if offline is None or materialize is None or None in p99:
        return None
    return {
        "offline_speedup": offline,
        "materialize_speedup": materialize,
        "online_p99_ratio_min": min(r for r in p99 if r is not None),
    }


def verdicts(results: dict[str, Any]) -> list[str]:
    figures = summary(results)
    if figures is None:
        return ["verdicts: n/a (a part did not run or failed on one side: see above)"]
    targets = {
        "offline_speedup": TARGET_OFFLINE,
        "materialize_speedup": TARGET_MATERIALIZE,
        "online_p99_ratio_min": TARGET_ONLINE_P99,
    }
    return [
        f"{name:22}{figures[name]:7.1f}x   target >= {target:.0f}x   "
        f"{'PASS' if figures[name] >= target else 'FAIL'}"
        for name, target in targets.items()
    ]


def online_target(tool: str, data_dir: Path, work: Path, workers: int) -> OnlineTarget | None:
    if tool == "feast":
        return feast_online_target(work, workers)
    try:
        return shamal_online_target(data_dir, work, workers=workers)
    except NotImplementedError:
        return None


def run_all(
    args: argparse.Namespace, tools: Sequence[str], peer: Path | None, folder: Path, project: str
) -> dict[str, Any]:
    """Generate the data, then each part for each tool in turn."""
    say = _say
    data_dir = folder / "data"
    data_dir.mkdir()
    started = time.perf_counter()
    _generate_in_child(data_dir, args.scale)
    say(f"generated the data in {time.perf_counter() - started:.1f} s")
    works = {tool: folder / tool for tool in tools}
    pythons = {"shamal": Path(sys.executable), "feast": peer or Path("python3")}
    results: dict[str, Any] = {tool: {} for tool in tools}
    if "feast" in tools:
        feast_repo(works["feast"], project)
    for tool in tools:
        works[tool].mkdir(exist_ok=True)
        applied = measure(f"{tool}-apply", pythons[tool], data_dir, works[tool])
        say(f"{tool} apply: {applied['work_s'] if applied else 0:.1f} s (not timed)")
    results["reference"] = measure("reference-offline", pythons["shamal"], data_dir, folder)
    for part in ("offline", "materialize"):
        if part not in args.parts:
            continue
        for tool in tools:
            say(f"{part}: {tool} ...")
            got = measure(f"{tool}-{part}", pythons[tool], data_dir, works[tool])
            results[tool][part] = got
            if got is None:
                say(f"  {tool}: not implemented")
            elif "failed" in got:
                say(
                    f"  {tool}: FAILED, {got['failed']}, after {got['process_s']:.0f} s, "
                    f"peak {got['peak_mb']:,.0f} MiB"
                )
            else:
                say(f"  {tool}: {got['work_s']:.2f} s, peak {got['peak_mb']:,.0f} MiB")
    if "feast" in tools:
        results["feast"]["redis_keys"] = redis_keys(project, delete=False)
    if "online" not in args.parts:
        return results
    pools = entity_pools(scaled(ENTITIES, args.scale))
    for tool in tools:
        say(f"online: {tool} ...")
        if "failed" in (results[tool].get("materialize") or {}):
            say(f"  {tool}: not run: its online store is not filled (materialize failed)")
            continue
        results[tool].update(run_online(tool, data_dir, works[tool], pools, args))
    return results


def run_online(
    tool: str,
    data_dir: Path,
    work: Path,
    pools: dict[int, list[list[int]]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Start the tool's server, check one answer (Feast's), load it, stop it."""
    target = online_target(tool, data_dir, work, args.server_workers)
    if target is None:
        _say(f"  {tool}: not implemented")
        return {}
    url, encode, stop, headers = target
    out: dict[str, Any] = {}
    try:
        if tool == "feast":
            ids = pools[max(ONLINE_SIZES)][0]
            expected = latest_values(data_dir, ids)
            out["online_check"] = check_feast_online(url, encode(ids), expected)
        out["online"] = drive(url, encode, pools, args.online_seconds, headers)
    finally:
        stop()
    _say(
        "  "
        + ", ".join(
            f"{size}: p99 {run['p99_ms']:.1f} ms {run['rps']:,.0f}/s"
            for size, run in out["online"].items()
        )
    )
    return out


def _say(text: str) -> None:
    print(text, flush=True)


#: Feast's materialize windows (``--feast-windows``): the worker inherits them in this variable.
WINDOWS_ENV = "BENCH_FEAST_WINDOWS"
#: The benchmark's parts, in the order they run.
PARTS = ("offline", "materialize", "online")


def _parts(text: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in chosen if p not in PARTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose among {', '.join(PARTS)}")
    if "online" in chosen and "materialize" not in chosen:
        raise argparse.ArgumentTypeError("online reads what materialize writes: add materialize")
    return chosen


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every row count")
    parser.add_argument("--only", choices=(*TOOLS, "both"), default="both", help="which tools")
    parser.add_argument(
        "--online-seconds", type=float, default=10.0, help="counted seconds per request size"
    )
    parser.add_argument(
        "--server-workers", type=int, default=1, help="server processes of each online server"
    )
    parser.add_argument(
        "--parts",
        type=_parts,
        default=PARTS,
        help="comma-separated parts to run (online needs materialize): "
        f"{','.join(PARTS)} (the default)",
    )
    parser.add_argument(
        "--feast-windows",
        type=int,
        default=1,
        help="materialize Feast in this many consecutive time windows (1: one call, which "
        "runs out of memory at --scale 1 on a 24 GiB machine)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data and work folders")
    parser.add_argument("--dir", type=Path, default=None, help="where the data is written")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker and scaled(ENTITIES, args.scale) < max(ONLINE_SIZES):
        parser.error(f"--scale must leave at least {max(ONLINE_SIZES)} entities")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker:
        return worker(args.worker, args.data, args.work, args.out)
    os.environ[WINDOWS_ENV] = str(max(1, args.feast_windows))  # for the workers started below
    say = _say
    tools = TOOLS if args.only == "both" else (args.only,)
    peer = None
    if "feast" in tools:
        try:
            peer = ensure_peer_venv(say)
        except (OSError, subprocess.CalledProcessError) as exc:
            say(f"cannot set up the peer venv {PEER_VENV}: {exc}")
            return 2
    load_avg = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    say(f"{_cpu()}, {os.cpu_count()} CPUs, load average at start {load_avg}")
    say(f"Shamal: {sys.executable}; peer: {_versions(peer) if peer else 'not run'}")
    folder = Path(tempfile.mkdtemp(prefix="bench-features-", dir=args.dir))
    project = f"bench_features_{os.getpid()}_{int(time.time())}"
    try:
        results = run_all(args, tools, peer, folder, project)
    except RuntimeError as exc:
        say(str(exc))
        return 2
    finally:
        if "feast" in tools:
            say(f"deleted {redis_keys(project, delete=True):,} Redis keys of project {project}")
        if "shamal" in tools:
            say(f"deleted {clear_shamal_redis():,} Redis keys of Shamal's online store")
        if args.keep:
            say(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    for line in report(args.scale, results, args.online_seconds):
        say(line)
    say(f"load average at end {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    figures = summary(results)
    if figures is not None:
        say(" ".join(f"{name} {value:.1f}" for name, value in figures.items()))
    return 0


def _generate_in_child(data_dir: Path, scale: float) -> None:
    """Generate in a process of its own, so this one stays small (a child's peak memory
    counts from what it inherits)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import features; "
        "features.generate(__import__('pathlib').Path(sys.argv[2]), float(sys.argv[3]))"
    )
    here = str(Path(__file__).resolve().parent)
    subprocess.run([sys.executable, "-c", code, here, str(data_dir), str(scale)], check=True)


if __name__ == "__main__":
    sys.exit(main())
