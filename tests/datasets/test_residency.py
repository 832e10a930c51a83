"""Data residency on SQLite and PostgreSQL: two stores (two folders) labelled with different
regions, two pools likewise. Ingestion writes only to a store the dataset's policy allows, a
copy elsewhere is refused, a job reading a restricted dataset is placed only in a pool of an
allowed region (and refused when none is), and every refusal is in the audit log."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from shamal.config import LocalArtifactSettings, NodeSettings, PoolSettings, Settings
from shamal.datasets import NAMESPACE, DatasetService
from shamal.errors import InvalidParameter, NotFound, PermissionDenied
from shamal.jobs import Job, JobSpec
from shamal.scheduler.core import Start
from shamal.scheduler.live import JobLifecycle
from shamal.security import AuditContext, AuditEntry
from shamal.server import Platform
from tests.registry.conftest import People, people
from tests.scheduler.live.test_lifecycle import local_loop

__all__ = ["people"]

TABLE = pa.table({"id": [1, 2, 3], "emirate": ["Dubai", "Abu Dhabi", "Sharjah"]})
EU, UAE = "eu-frankfurt", "ae-dubai"


def _parquet(table: pa.Table = TABLE) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _pool(name: str, region: str, memory_mib: int) -> PoolSettings:
    node = NodeSettings(name=f"{name}-1", cpus=4, memory_mib=memory_mib)
    return PoolSettings(name=name, labels={"region": region}, nodes=(node,))


@pytest.fixture
def settings(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Settings:
    """The artifact store in Frankfurt, a data store ``dubai`` in Dubai (two folders); a
    pool in each region."""
    home = tmp_path_factory.mktemp("home")
    base = Settings(home=home, database_url=database_url, allowed_hosts=("*",))
    scheduler = base.scheduler.model_copy(
        update={"pools": (_pool("fra", EU, 16384), _pool("dxb", UAE, 8192))}
    )
    return base.model_copy(
        update={
            "artifacts": LocalArtifactSettings(root=home / "store-fra", labels={"region": EU}),
            "data_stores": {
                "dubai": LocalArtifactSettings(root=home / "store-dxb", labels={"region": UAE})
            },
            "scheduler": scheduler,
        }
    )


@pytest.fixture
def service(platform: Platform) -> DatasetService:
    return platform.datasets


def _blobs(root: Path) -> set[str]:
    """The blobs a store folder holds (their digests)."""
    return {p.name for p in (root / "blobs").rglob("*") if p.is_file()}


def test_settings_name_the_data_stores_and_leave_the_default_alone(tmp_path: Path) -> None:
    plain = Settings(home=tmp_path)
    assert (plain.data_stores, plain.artifacts.labels) == ({}, {})
    named = Settings(home=tmp_path, data_stores={"dubai": {"type": "local"}})  # type: ignore[dict-item]
    assert named.data_store_root("dubai") == tmp_path / "data-stores" / "dubai"
    for stores in ({"default": {"type": "local"}}, {"Dubai Store": {"type": "local"}}):
        with pytest.raises(ValidationError):
            Settings(home=tmp_path, data_stores=stores)  # type: ignore[arg-type]


def _denials(platform: Platform) -> list[AuditEntry]:
    return [e for e in platform.audit.entries(limit=200) if e.outcome == "residency_denied"]


def _restricted(service: DatasetService, people: People, name: str = "customers") -> None:
    service.create(people.ctx("rita"), name, "red")
    service.set_residency(people.ctx("rita", "dataset.residency"), name, [UAE, "ae-abudhabi"])


def test_ingestion_goes_to_a_store_in_an_allowed_region_and_reads_back(
    service: DatasetService, people: People, settings: Settings
) -> None:
    _restricted(service, people)
    version = service.ingest(people.ctx("mo"), "customers", [_parquet()], "parquet")
    (part,) = version.parts
    # The part's bytes are in the Dubai folder, not in the Frankfurt artifact store.
    assert part.digest in _blobs(settings.data_store_root("dubai"))
    assert part.digest not in _blobs(settings.artifact_root)
    assert service.version_stores(people.principals["vi"], "customers/1") == ("dubai",)
    data = b"".join(service.open_part(people.principals["vi"], "customers/1", 0))
    assert pq.read_table(io.BytesIO(data)).to_pylist() == TABLE.to_pylist()
    # An append measures the whole version: the earlier part is read from where it lies.
    second = service.ingest(people.ctx("mo"), "customers", [_parquet()], "parquet")
    assert (second.row_count, second.profile["scope"]) == (6, "version")
    residency = service.residency(people.principals["vi"], "customers")
    assert residency.regions == ("ae-abudhabi", UAE)
    assert [(s.name, s.region, s.allowed) for s in residency.stores] == [
        ("default", EU, False),
        ("dubai", UAE, True),
    ]
    assert residency.stores[1].parts == 1  # the same rows twice: one content-addressed part


def test_an_unrestricted_dataset_keeps_the_artifact_store(
    service: DatasetService, people: People, settings: Settings
) -> None:
    service.create(people.ctx("mo"), "events", "red")
    version = service.ingest(people.ctx("mo"), "events", [_parquet()], "parquet")
    assert version.parts[0].digest in _blobs(settings.artifact_root)
    assert service.version_stores(people.principals["vi"], "events/1") == ("default",)
    # A store may be named, wherever it is, when no policy restricts the dataset.
    other = service.ingest(
        people.ctx("mo"), "events", [_parquet(TABLE.slice(0, 1))], "parquet", store="dubai"
    )
    assert other.parts[1].digest in _blobs(settings.data_store_root("dubai"))
    assert len(b"".join(service.open_part(people.principals["vi"], "events/2", 1))) > 0


def test_naming_a_store_outside_the_policy_is_refused_audited_and_writes_nothing(
    platform: Platform, service: DatasetService, people: People, settings: Settings
) -> None:
    _restricted(service, people)
    with pytest.raises(PermissionDenied, match="residency policy of 'customers' allows only"):
        service.ingest(
            people.ctx("mo", "dataset.ingest"),
            "customers",
            [_parquet()],
            "parquet",
            store="default",
        )
    with pytest.raises(NotFound, match="no store 'mars'"):
        service.ingest(people.ctx("mo"), "customers", [_parquet()], "parquet", store="mars")
    assert service.versions(people.principals["vi"], "customers") == []
    assert _blobs(settings.artifact_root) == set()
    (denied,) = _denials(platform)
    assert (denied.action, denied.actor, denied.target) == (
        "dataset.ingest",
        "mo",
        "dataset/customers",
    )
    assert denied.detail["store"] == "default"
    assert platform.audit.verify().ok


def test_ingestion_is_refused_when_no_store_is_in_an_allowed_region(
    platform: Platform, service: DatasetService, people: People
) -> None:
    service.create(people.ctx("rita"), "patients", "red")
    service.set_residency(people.ctx("rita"), "patients", ["sa-riyadh"])
    with pytest.raises(PermissionDenied, match="no store of this server is in a region"):
        service.ingest(people.ctx("mo", "dataset.ingest"), "patients", [_parquet()], "parquet")
    assert service.versions(people.principals["vi"], "patients") == []
    (denied,) = _denials(platform)
    assert denied.detail["regions"] == ["sa-riyadh"]


def test_the_policy_is_for_maintainers_checked_and_not_narrower_than_the_data(
    platform: Platform, service: DatasetService, people: People
) -> None:
    service.create(people.ctx("mo"), "events", "red")
    with pytest.raises(PermissionDenied):
        service.set_residency(people.ctx("mo"), "events", [UAE])
    for bad in ([], ["Dubai!"], "ae-dubai"):
        with pytest.raises(InvalidParameter):
            service.set_residency(people.ctx("rita"), "events", bad)  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        service.set_residency(people.ctx("bo"), "events", [UAE])  # another team's
    # Its data is in Frankfurt already: a Dubai-only policy would be a lie.
    service.ingest(people.ctx("mo"), "events", [_parquet()], "parquet")
    with pytest.raises(PermissionDenied, match="already holds data in store"):
        service.set_residency(people.ctx("rita", "dataset.residency"), "events", [UAE])
    assert service.residency(people.principals["vi"], "events").regions is None
    assert _denials(platform)[0].detail["outside"] == ["default"]
    widened = service.set_residency(people.ctx("rita"), "events", [EU, UAE])
    assert widened.regions == (UAE, EU)
    assert service.set_residency(people.ctx("rita"), "events", None).regions is None
    changes = [e for e in platform.audit.entries(limit=200) if e.target == "dataset/events"]
    assert [e.detail.get("regions") for e in changes if e.outcome == "ok"][:2] == [
        None,
        [UAE, EU],
    ]


def test_a_copy_to_a_store_elsewhere_is_refused_and_to_an_allowed_one_made(
    platform: Platform, service: DatasetService, people: People, settings: Settings
) -> None:
    _restricted(service, people)
    service.ingest(people.ctx("mo"), "customers", [_parquet()], "parquet")
    with pytest.raises(PermissionDenied, match="store 'default' is in region eu-frankfurt"):
        service.copy_version(people.ctx("rita", "dataset.copy"), "customers/1", "default")
    assert _blobs(settings.artifact_root) == set()  # not a byte left the region
    (denied,) = _denials(platform)
    assert (denied.action, denied.target) == ("dataset.copy", "data:/customers/1")
    # Unrestricted data copies anywhere; the copy is verified and recorded.
    service.create(people.ctx("mo"), "events", "red")
    service.ingest(people.ctx("mo"), "events", [_parquet(TABLE.slice(1))], "parquet")
    with pytest.raises(PermissionDenied):
        service.copy_version(people.ctx("mo"), "events/1", "dubai")  # members may not
    stores = service.copy_version(people.ctx("rita", "dataset.copy"), "events/1", "dubai")
    assert stores == ("default", "dubai")
    assert _blobs(settings.data_store_root("dubai")) >= {
        p.digest for p in service.version(people.principals["vi"], "events/1").parts
    }
    copied = [e for e in platform.audit.entries(limit=50) if e.action == "dataset.copy"]
    assert [(e.outcome, e.detail.get("store")) for e in copied] == [
        ("ok", "dubai"),
        ("residency_denied", "default"),
    ]
    # Now in both regions, a Dubai-only policy is still refused (the Frankfurt copy stays).
    with pytest.raises(PermissionDenied):
        service.set_residency(people.ctx("rita"), "events", [UAE])


def _submit(platform: Platform, people: People, **options: object) -> Job:
    fields: dict[str, object] = {"cpus": 0.5, "memory_mib": 64, "team": "red", **options}
    spec = JobSpec(command=("true",), **fields)  # type: ignore[arg-type]
    return platform.jobs.submit(people.ctx("mo", "job.submit"), spec)


def test_a_job_reading_a_restricted_dataset_runs_only_in_an_allowed_pool(
    platform: Platform, service: DatasetService, people: People, tmp_path: Path
) -> None:
    _restricted(service, people)
    service.create(people.ctx("mo"), "events", "red")
    reads = _submit(platform, people, datasets=("customers@prod",))
    assert (reads.datasets, reads.regions) == (("customers@prod",), ("ae-abudhabi", UAE))
    free = _submit(platform, people, datasets=("events",))
    assert free.regions is None
    # The live scheduler's model places the restricted job in Dubai every time, even while
    # Frankfurt (first by name) is idle; the unrestricted one goes anywhere.
    life = JobLifecycle(platform.db, platform.audit, "s1")
    loop = local_loop(platform, life, tmp_path / "jobs")
    queued, active = life.pending()
    state = loop._state(queued, active, datetime.now(UTC).timestamp(), {})
    decisions = loop.policy.decide(state, datetime.now(UTC).timestamp())
    placed = {d.job_id: d.placement.slots[0].node for d in decisions if isinstance(d, Start)}
    assert placed[reads.id] == "dxb-1"
    assert placed[free.id] in {"fra-1", "dxb-1"}
    # What it waits for is told in its pools' terms.
    waiting = platform.jobs.waiting([reads])[reads.id]
    assert waiting.endswith("(the data it reads holds it to pool(s) dxb)")


def test_a_job_no_allowed_pool_can_take_is_refused_and_audited(
    platform: Platform, service: DatasetService, people: People
) -> None:
    _restricted(service, people)
    with pytest.raises(PermissionDenied, match="pool 'fra' is in region eu-frankfurt"):
        _submit(platform, people, datasets=("customers",), pool="fra")
    service.create(people.ctx("rita"), "riyadh", "red")
    service.set_residency(people.ctx("rita"), "riyadh", ["sa-riyadh"])
    with pytest.raises(PermissionDenied, match="no pool is in a region"):
        _submit(platform, people, datasets=("riyadh",))
    with pytest.raises(PermissionDenied, match="no region common"):
        _submit(platform, people, datasets=("customers", "riyadh"))
    with pytest.raises(NotFound):
        _submit(platform, people, datasets=("nope",))
    # Too big for Dubai's node: refused, though Frankfurt's would take it if allowed.
    with pytest.raises(InvalidParameter, match="could never start"):
        _submit(platform, people, datasets=("customers",), memory_mib=9000)
    denied = _denials(platform)
    assert [e.action for e in denied] == ["job.submit"] * 3
    assert denied[-1].detail["pool"] == "fra"
    assert denied[-1].target == "team:red/job"
    assert platform.jobs.list_jobs(people.principals["mo"]) == []


def test_residency_over_http(platform: Platform, api: TestClient, people: People) -> None:
    mo, rita = people.headers("mo"), people.headers("rita")
    api.post("/api/v1/datasets", json={"name": "customers", "team": "red"}, headers=mo)
    put = api.put("/api/v1/datasets/customers/residency", json={"regions": [UAE]}, headers=rita)
    assert put.status_code == 200, put.text
    assert put.json()["regions"] == [UAE]
    assert (
        api.put(
            "/api/v1/datasets/customers/residency", json={"regions": [UAE], "x": 1}, headers=rita
        ).status_code
        == 400
    )
    refused = api.post(
        "/api/v1/dataset-uploads/customers",
        params={"format": "parquet", "store": "default"},
        content=_parquet(),
        headers=mo,
    )
    assert refused.status_code == 403
    assert "allows only ae-dubai" in refused.json()["message"]
    up = api.post(
        "/api/v1/dataset-uploads/customers",
        params={"format": "parquet"},
        content=_parquet(),
        headers=mo,
    )
    assert up.status_code == 201, up.text
    stores = api.get("/api/v1/datasets/customers/versions/1/stores", headers=mo).json()
    assert stores == {"uri": "data:/customers/1", "stores": ["dubai"]}
    copy = api.post(
        "/api/v1/datasets/customers/versions/1/copies", json={"store": "default"}, headers=rita
    )
    assert copy.status_code == 403
    assert api.get("/api/v1/datasets/customers/versions/1/parts/0", headers=mo).status_code == 200
    got = api.get("/api/v1/datasets/customers/residency", headers=mo).json()
    assert [(s["name"], s["allowed"], s["parts"]) for s in got["stores"]] == [
        ("default", False, 0),
        ("dubai", True, 1),
    ]
    job = api.post(
        "/api/v1/jobs",
        json={"command": ["true"], "team": "red", "datasets": ["customers"], "pool": "fra"},
        headers=mo,
    )
    assert job.status_code == 403
    # The refusals are audited once each, with the service's own outcome.
    denied = [(e.action, e.outcome) for e in _denials(platform)]
    assert denied == [
        ("job.submit", "residency_denied"),
        ("dataset.copy", "residency_denied"),
        ("dataset.ingest", "residency_denied"),
    ]
    assert NAMESPACE == "datasets"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_data_store_is_encrypted_at_rest_and_its_keys_rotate(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from shamal.cli import app as cli_app
    from shamal.server import start_platform

    encrypted = settings.model_copy(update={"encrypt_artifacts": True})
    running = start_platform(encrypted)
    admin = running.security.authenticate(running.admin_secret or "")
    ctx = AuditContext(action="test", actor=admin.name, principal=admin)
    running.datasets.create(ctx, "secret")
    running.datasets.ingest(ctx, "secret", [_parquet()], "parquet", store="dubai")
    root = encrypted.data_store_root("dubai")
    blobs = [p for p in (root / "blobs").rglob("*") if p.is_file() and p.suffix != ".key"]
    assert blobs
    assert all(b"PAR1" not in p.read_bytes() for p in blobs)  # no Parquet file in clear
    monkeypatch.setenv("SHAMAL_HOME", str(encrypted.home))
    monkeypatch.setenv("SHAMAL_ENCRYPT_ARTIFACTS", "true")
    monkeypatch.setenv(
        "SHAMAL_DATA_STORES", json.dumps({"dubai": {"type": "local", "root": str(root)}})
    )
    result = CliRunner().invoke(cli_app, ["artifacts", "rotate-key", "--retire-old"])
    assert result.exit_code == 0, result.output
    assert "re-wrapped 1 blob key" in result.output  # the Dubai store's one part
    running.close()
    again = start_platform(encrypted)  # the old master key is gone: only the new one reads
    data = b"".join(again.datasets.open_part(admin, "secret/1", 0))
    assert pq.read_table(io.BytesIO(data)).to_pylist() == TABLE.to_pylist()
    again.close()
