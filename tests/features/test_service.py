"""FeatureStoreService on SQLite and PostgreSQL: apply and versions, refusals (teams, services
in use, residency), training sets, materialization (resumed after a cut), online reads equal to
offline ones, pushes, and hostile requests."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shamal.config import FeatureSettings, LocalArtifactSettings, Settings
from shamal.datasets import WriteMode
from shamal.errors import Conflict, InvalidParameter, NotFound, PermissionDenied
from shamal.features import Definitions, EntityRows, FeatureStoreService, MaterializeState
from shamal.lineage import Direction
from shamal.server import Platform
from tests.registry.conftest import People, people

__all__ = ["people"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


DEFINITIONS = """
entities:
  - name: customer
    join_keys: [customer_id]
feature_views:
  - name: customer_stats
    entities: [customer]
    source: txns
    timestamp_field: ts
    ttl_seconds: 86400
    owner: red
    features:
      - {name: amount, dtype: float64}
      - {name: count, dtype: int64}
feature_services:
  - name: fraud
    owner: red
    features: ["customer_stats:*"]
"""

#: Customer 1: rows at 0 h, 10 h and 30 h; customer 2: at 5 h; customer 3: two at 8 h (the
#: later written wins).
TXNS = pa.table(
    {
        "customer_id": pa.array([1, 1, 1, 2, 3, 3], pa.int64()),
        "ts": pa.array(
            [_at(0), _at(10), _at(30), _at(5), _at(8), _at(8)], pa.timestamp("us", tz="UTC")
        ),
        "amount": [1.0, 2.0, 3.0, 20.0, 30.0, 31.0],
        "count": pa.array([1, 2, 3, 1, 1, 2], pa.int64()),
    }
)


def _features(
    platform: Platform,
    tmp_path: Path,
    *,
    in_use: frozenset[str] = frozenset(),
    region: str | None = None,
    chunk: int = 100_000,
    clock: object = None,
) -> FeatureStoreService:
    settings = FeatureSettings(
        online_store=f"sqlite:///{tmp_path / 'online.db'}",
        online_region=region,
        materialize_chunk_rows=chunk,
        join_memory_mb=256,
    )
    return FeatureStoreService(
        platform.db,
        platform.audit,
        platform.security,
        platform.datasets,
        settings,
        tmp_path / "home",
        clock=clock or (lambda: _at(31)),  # type: ignore[arg-type]
        in_use=lambda: in_use,
    )


@pytest.fixture
def settings(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Settings:
    """The artifact store labelled as in Dubai (a residency policy may then name it)."""
    home = tmp_path_factory.mktemp("home")
    return Settings(
        home=home,
        database_url=database_url,
        allowed_hosts=("*",),
        artifacts=LocalArtifactSettings(root=home / "store", labels={"region": "ae-dubai"}),
    )


@pytest.fixture
def store(platform: Platform, people: People, tmp_path: Path) -> Iterator[FeatureStoreService]:
    platform.datasets.create(people.ctx("mo"), "txns", "red")
    platform.datasets.ingest_batches(
        people.ctx("mo"), "txns", TXNS.to_batches(), source={"kind": "test"}
    )
    service = _features(platform, tmp_path)
    service.apply(people.ctx("mo"), Definitions.from_yaml(DEFINITIONS))
    yield service
    service.close()


def test_an_apply_writes_a_version_per_changed_object_and_plans_show_the_fields(
    store: FeatureStoreService, people: People
) -> None:
    assert [(o.kind, o.name, o.version) for o in store.objects()] == [
        ("entity", "customer", 1),
        ("feature_service", "fraud", 1),
        ("feature_view", "customer_stats", 1),
    ]
    changed = Definitions.from_yaml(DEFINITIONS.replace("ttl_seconds: 86400", "ttl_seconds: 3600"))
    planned = store.plan(people.principals["vi"], changed)
    assert [(c.kind, c.name, c.action) for c in planned.changes] == [
        ("feature_view", "customer_stats", "update")
    ]
    assert "ttl_seconds" in planned.changes[0].fields
    done = store.apply(people.ctx("mo"), changed)
    assert done.number == 2
    assert [o.version for o in store.history("feature_view", "customer_stats")] == [2, 1]
    # The same definitions again change nothing and write no apply.
    assert store.apply(people.ctx("mo"), changed).number is None


def test_without_prune_an_apply_keeps_what_it_leaves_out_and_with_prune_deletes_it(
    store: FeatureStoreService, people: People
) -> None:
    only_entity = Definitions.from_yaml(DEFINITIONS.split("feature_views:")[0])
    assert store.apply(people.ctx("mo"), only_entity).number is None
    done = store.apply(people.ctx("mo"), only_entity, prune=True)
    assert {(c["kind"], c["action"]) for c in done.changes} == {
        ("feature_view", "delete"),
        ("feature_service", "delete"),
    }
    assert [o.name for o in store.objects()] == ["customer"]
    assert store.history("feature_view", "customer_stats")[0].deleted


def test_a_change_that_breaks_a_service_in_use_is_refused_with_the_reason(
    platform: Platform, store: FeatureStoreService, people: People, tmp_path: Path
) -> None:
    guarded = _features(platform, tmp_path / "g", in_use=frozenset({"fraud"}))
    without_count = DEFINITIONS.replace("      - {name: count, dtype: int64}\n", "")
    with pytest.raises(Conflict, match="fraud"):
        guarded.apply(people.ctx("mo"), Definitions.from_yaml(without_count))
    assert [o.version for o in guarded.history("feature_view", "customer_stats")] == [1]
    # Not in use: the same change is applied.
    assert store.apply(people.ctx("mo"), Definitions.from_yaml(without_count)).number == 2


def test_teams_own_definitions_and_views_read_only_their_teams_datasets(
    platform: Platform, store: FeatureStoreService, people: People
) -> None:
    # Blue may not change red's view.
    changed = Definitions.from_yaml(DEFINITIONS.replace("ttl_seconds: 86400", "ttl_seconds: 60"))
    with pytest.raises((PermissionDenied, NotFound)):
        store.apply(people.ctx("bo"), changed)
    # A blue view over red's dataset is refused (blue cannot even see it).
    blue = (
        DEFINITIONS.replace("name: customer_stats", "name: blue_stats")
        .replace(
            "owner: red\n    features:\n      - {name: amount",
            "owner: blue\n    features:\n      - {name: amount",
        )
        .split("feature_services:")[0]
    )
    with pytest.raises((PermissionDenied, NotFound)):
        store.apply(people.ctx("bo"), Definitions.from_yaml(blue))
    assert "blue_stats" not in {o.name for o in store.objects()}


def test_a_training_set_is_point_in_time_correct_and_saved_with_its_lineage(
    platform: Platform, store: FeatureStoreService, people: People, tmp_path: Path
) -> None:
    entities = pa.table(
        {
            "customer_id": pa.array([1, 1, 1, 2, 2, 3, 4], pa.int64()),
            "event_timestamp": pa.array(
                [_at(-1), _at(10), _at(29), _at(5), _at(40), _at(9), _at(9)],
                pa.timestamp("us", tz="UTC"),
            ),
            "label": [0, 1, 0, 1, 0, 1, 0],
        }
    )
    platform.datasets.create(people.ctx("mo"), "training", "red")
    found = store.historical(
        people.ctx("mo"),
        EntityRows(entities),
        service="fraud",
        out=tmp_path / "train.parquet",
        save_as="training",
    )
    rows = pq.read_table(found.path).to_pylist()
    assert [(r["customer_id"], r["label"], r["amount"], r["count"]) for r in rows] == [
        (1, 0, None, None),  # before any row
        (1, 1, 2.0, 2),  # equal time: included
        (1, 0, 2.0, 2),  # 19 h later, within the day's TTL; the 30 h row is in its future
        (2, 1, 20.0, 1),
        (2, 0, None, None),  # 35 h after the last row: past the TTL
        (3, 1, 31.0, 2),  # two rows at the same time: the one written later
        (4, 0, None, None),  # no such customer
    ]
    assert found.views[0]["view"] == "features:/feature_view/customer_stats/1"
    assert found.views[0]["dataset"] == "data:/txns/1"
    saved = platform.datasets.version(people.principals["vi"], "training")
    assert saved.uri == found.saved_as
    assert saved.source["kind"] == "features"
    assert saved.source["feature_views"][0]["dataset"] == "data:/txns/1"
    # Lineage walks up from the training set through the view's data to its source.
    up = platform.lineage.lineage(people.principals["vi"], saved.uri, direction=Direction.UP)
    edges = {(e.source, e.target, e.relation) for e in up.edges}
    assert ("data:/txns/1", saved.uri, "joined") in edges
    assert ("source:/txns/1", "data:/txns/1", "ingested") in edges


def test_a_training_set_in_memory_equals_the_file_and_saves_the_same(
    platform: Platform, store: FeatureStoreService, people: People, tmp_path: Path
) -> None:
    times = [_at(-1), _at(10), _at(29), _at(40), _at(9)]
    entities = pa.table(
        {
            "customer_id": pa.array([1, 1, 1, 2, 3], pa.int64()),
            "event_timestamp": pa.array(times, pa.timestamp("us", tz="UTC")),
        }
    )
    ctx = people.ctx("mo")
    written = store.historical(ctx, EntityRows(entities), service="fraud", out=tmp_path / "t.pq")
    platform.datasets.create(ctx, "in_memory", "red")
    held = store.historical(
        ctx, EntityRows(entities), service="fraud", out=None, save_as="in_memory"
    )
    assert held.path is None
    assert held.method == "gather"  # five rows fit any memory limit
    assert held.table.to_pylist() == pq.read_table(written.path).to_pylist()
    assert held.columns == written.columns
    version = platform.datasets.version(people.principals["vi"], "in_memory")
    (part,) = range(len(version.parts))
    data = b"".join(platform.datasets.open_part(people.principals["vi"], "in_memory/1", part))
    assert pq.read_table(pa.BufferReader(data)).to_pylist() == held.table.to_pylist()


def test_online_values_equal_offline_ones_at_the_same_time(
    store: FeatureStoreService, people: People, tmp_path: Path
) -> None:
    (run,) = store.materialize(people.ctx("mo"))
    assert (run.state, run.rows) == (MaterializeState.SUCCEEDED, 3)
    now = _at(31)
    keys = [1, 2, 3, 4]
    online = store.online(people.principals["vi"], {"customer_id": keys}, service="fraud")
    offline = store.historical(
        people.ctx("vi"),
        EntityRows(
            pa.table(
                {
                    "customer_id": pa.array(keys, pa.int64()),
                    "event_timestamp": pa.array([now] * 4, pa.timestamp("us", tz="UTC")),
                }
            )
        ),
        service="fraud",
        out=tmp_path / "now.parquet",
    )
    rows = pq.read_table(offline.path).to_pylist()
    for name in ("amount", "count"):
        assert online.values[name] == [r[name] for r in rows]
    # Customer 2's row is 26 h old: past the TTL online as offline.
    assert online.status["customer_stats"] == ["present", "expired", "present", "not_found"]


def test_a_materialization_cut_short_is_resumed_from_its_last_chunk(
    platform: Platform, people: People, tmp_path: Path
) -> None:
    many = pa.table(
        {
            "customer_id": pa.array(range(2500), pa.int64()),
            "ts": pa.array([_at(20)] * 2500, pa.timestamp("us", tz="UTC")),
            "amount": [float(i) for i in range(2500)],
            "count": pa.array(range(2500), pa.int64()),
        }
    )
    platform.datasets.create(people.ctx("mo"), "txns", "red")
    platform.datasets.ingest_batches(people.ctx("mo"), "txns", many.to_batches(), source={})
    service = _features(platform, tmp_path, chunk=1000)
    service.apply(people.ctx("mo"), Definitions.from_yaml(DEFINITIONS))

    class Cut(Exception):
        pass

    def cut(progress: object) -> None:
        raise Cut  # the server dies after the first chunk

    with pytest.raises(Cut):
        service.materialize(people.ctx("mo"), on_progress=cut)
    (left,) = service.materializations("customer_stats")
    assert (left.state, left.chunks_done, left.chunks_total) == (MaterializeState.RUNNING, 1, 3)
    (done,) = service.materialize(people.ctx("mo"))
    assert done.id == left.id
    assert (done.state, done.chunks_done, done.rows) == (MaterializeState.SUCCEEDED, 3, 2500)
    online = service.online(
        people.principals["vi"],
        {"customer_id": [0, 1999, 2499]},
        features=["customer_stats:amount"],
    )
    assert online.values["amount"] == [0.0, 1999.0, 2499.0]
    service.close()


def test_an_incremental_run_reads_only_rows_after_the_last_end(
    platform: Platform, store: FeatureStoreService, people: People
) -> None:
    (first,) = store.materialize(people.ctx("mo"), end=_at(9))
    assert first.rows == 3  # customers 1 (0 h), 2 (5 h), 3 (8 h)
    (second,) = store.materialize(people.ctx("mo"), incremental=True, end=_at(31))
    assert (second.start, second.rows) == (_at(9), 1)  # customer 1's rows at 10 h and 30 h


def test_a_view_is_never_materialized_outside_its_datasets_regions(
    platform: Platform, store: FeatureStoreService, people: People, tmp_path: Path
) -> None:
    platform.datasets.set_residency(people.ctx("rita"), "txns", ["ae-dubai"])
    elsewhere = _features(platform, tmp_path / "eu", region="eu-west")
    with pytest.raises(PermissionDenied, match="ae-dubai"):
        elsewhere.materialize(people.ctx("mo"))
    assert elsewhere.materializations() == []
    elsewhere.close()
    inside = _features(platform, tmp_path / "ae", region="ae-dubai")
    assert inside.materialize(people.ctx("mo"))[0].state is MaterializeState.SUCCEEDED
    inside.close()


def test_a_push_writes_online_and_offline_at_once(
    platform: Platform, store: FeatureStoreService, people: People
) -> None:
    fresh = pa.table(
        {
            "customer_id": pa.array([2], pa.int64()),
            "ts": pa.array([_at(31)], pa.timestamp("us", tz="UTC")),
            "amount": [99.0],
            "count": pa.array([7], pa.int64()),
        }
    )
    assert store.push(people.ctx("mo"), "customer_stats", fresh) == 1
    online = store.online(people.principals["vi"], {"customer_id": [2]}, service="fraud")
    assert (online.values["amount"], online.status["customer_stats"]) == ([99.0], ["present"])
    latest = platform.datasets.version(people.principals["vi"], "txns")
    assert (latest.version, latest.row_count, latest.mode) == (2, 7, WriteMode.APPEND)


def test_hostile_online_requests_get_clear_errors(
    store: FeatureStoreService, people: People
) -> None:
    vi = people.principals["vi"]
    with pytest.raises(InvalidParameter, match="at most 10,000"):
        store.online(vi, {"customer_id": list(range(1_000_000))}, service="fraud")
    with pytest.raises(InvalidParameter, match="no feature"):
        store.online(vi, {"customer_id": [1]}, features=["customer_stats:nope"])
    with pytest.raises(InvalidParameter, match="customer_id"):
        store.online(vi, {"id": [1]}, service="fraud")
    with pytest.raises((InvalidParameter, NotFound)):
        store.online(vi, {"customer_id": [1]}, features=["x'; DROP TABLE t; --:a"])
    with pytest.raises(NotFound):
        store.online(people.principals["bo"], {"customer_id": [1]}, service="fraud")
