"""The domains record their events in the transaction of the change: datasets, the registry,
jobs. A change that fails leaves no event."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from sqlalchemy.orm import Session

from shamal.datasets import DataVersion
from shamal.errors import NotFound
from shamal.events import Event, EventKind, EventService
from shamal.jobs import JobState
from shamal.registry import TEAM_TAG, RegistryService
from shamal.scheduler.live import JobLifecycle
from shamal.security import AuditContext, job_token_name
from shamal.server import Platform
from tests.events.conftest import People
from tests.registry.conftest import ArtifactSources
from tests.scheduler.live.test_lifecycle import _run, _submit

TABLE = pa.table({"id": [1, 2, 3], "x": [0.5, 1.5, 2.5]})
SUITE = "version: 1\nexpectations:\n  - {kind: range, column: x, min: 0, max: 2}\n"


def _csv(table: pa.Table = TABLE) -> bytes:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return sink.getvalue()


def _all(events: EventService, people: People, *kinds: EventKind) -> list[Event]:
    page = events.list_events(people.principals["admin"], kinds=[k.value for k in kinds])
    return list(page.events)


# --------------------------------------------------------------------------- datasets
def test_a_dataset_version_is_announced_and_so_is_its_validation(
    platform: Platform, events: EventService, people: People
) -> None:
    data = platform.datasets
    data.create(people.ctx("mo"), "customers", "red")
    plain = data.ingest(people.ctx("mo"), "customers", [_csv()], "csv")
    data.set_suite(people.ctx("rita"), "customers", SUITE)
    judged = data.ingest(people.ctx("mo"), "customers", [_csv()], "csv")
    created = _all(events, people, EventKind.DATASET_VERSION_CREATED)
    assert [(e.subject, e.team, e.actor) for e in created] == [
        ("data:/customers/1", "red", "mo"),
        ("data:/customers/2", "red", "mo"),
    ]
    assert created[0].payload == {
        "dataset": "customers",
        "version": 1,
        "team": "red",
        "rows": 3,
        "digest": plain.digest,
    }
    (validated,) = _all(events, people, EventKind.DATASET_VERSION_VALIDATED)
    assert validated.payload == {
        "dataset": "customers",
        "version": judged.version,
        "team": "red",
        "passed": False,  # x = 2.5 is out of range
    }
    # Team red's readers see them; team blue's do not.
    assert len(events.list_events(people.principals["vi"]).events) == 3
    assert events.list_events(people.principals["bo"]).events == ()


def test_a_version_a_job_wrote_names_the_job_in_its_events(
    platform: Platform, events: EventService, people: People
) -> None:
    data = platform.datasets
    data.create(people.ctx("mo"), "customers", "red")
    data.set_suite(people.ctx("rita"), "customers", SUITE)
    job_id = uuid.uuid4().hex
    issued = platform.security.issue_job_token("mo", job_token_name(job_id, 1), timedelta(hours=1))
    job = platform.security.authenticate(issued.secret)
    version = data.ingest(AuditContext("test", job.name, job), "customers", [_csv()], "csv")
    data.ingest(people.ctx("mo"), "customers", [_csv()], "csv")  # mo's own token: no job
    created = _all(events, people, EventKind.DATASET_VERSION_CREATED)
    assert created[0].payload == {
        "dataset": "customers",
        "version": 1,
        "team": "red",
        "job": job_id[:12],
        "rows": 3,
        "digest": version.digest,
    }
    assert created[0].actor == "mo"
    validated = _all(events, people, EventKind.DATASET_VERSION_VALIDATED)
    assert [e.payload.get("job") for e in validated] == [job_id[:12], None]
    assert "job" not in created[1].payload


def test_a_dataset_write_that_fails_leaves_no_event(
    platform: Platform, events: EventService, people: People
) -> None:
    platform.datasets.create(people.ctx("mo"), "customers", "red")

    class Refused(Exception):
        pass

    def within(s: Session, version: DataVersion) -> None:
        raise Refused

    with pytest.raises(Refused):
        platform.datasets.ingest_batches(
            people.ctx("mo"), "customers", TABLE.to_batches(), source={"kind": "t"}, within=within
        )
    assert _all(events, people) == []


# --------------------------------------------------------------------------- registry
@pytest.fixture
def registry(platform: Platform) -> RegistryService:
    return RegistryService(platform.db, platform.audit, ArtifactSources())


def test_a_registered_version_and_moved_aliases_are_announced(
    registry: RegistryService, events: EventService, people: People
) -> None:
    registry.create_registered_model(people.ctx("mo"), "churn", tags={TEAM_TAG: "red"})
    registry.create_model_version(people.ctx("mo"), "churn", "mlflow-artifacts:/models/churn")
    registry.create_model_version(people.ctx("mo"), "churn", "mlflow-artifacts:/models/churn")
    registry.set_registered_model_alias(people.ctx("mo"), "churn", "prod", 1)
    registry.set_registered_model_alias(people.ctx("mo"), "churn", "prod", 2)
    registry.delete_registered_model_alias(people.ctx("mo"), "churn", "prod")
    registry.delete_registered_model_alias(people.ctx("mo"), "churn", "prod")  # gone: no event
    registered = _all(events, people, EventKind.MODEL_VERSION_REGISTERED)
    assert [(e.subject, e.team) for e in registered] == [
        ("models:/churn/1", "red"),
        ("models:/churn/2", "red"),
    ]
    assert registered[0].payload == {
        "name": "churn",
        "version": 1,
        "run_id": None,
        "source": "mlflow-artifacts:/models/churn",
    }
    moved = _all(events, people, EventKind.MODEL_ALIAS_MOVED)
    assert [(e.payload["version"], e.payload["previous"]) for e in moved] == [
        (1, None),
        (2, 1),
        (None, 2),
    ]
    assert {e.subject for e in moved} == {"models:/churn@prod"}


def test_a_registry_change_that_fails_leaves_no_event(
    registry: RegistryService, events: EventService, people: People
) -> None:
    registry.create_registered_model(people.ctx("mo"), "churn", tags={TEAM_TAG: "red"})
    with pytest.raises(NotFound):
        registry.set_registered_model_alias(people.ctx("mo"), "churn", "prod", 7)
    with pytest.raises(NotFound):
        registry.create_model_version(people.ctx("mo"), "nope", "mlflow-artifacts:/models/x")
    assert _all(events, people) == []


# ------------------------------------------------------------------------------- jobs
def test_a_job_that_ends_for_good_is_announced_a_retried_one_is_not(
    platform: Platform, events: EventService, people: People
) -> None:
    life = JobLifecycle(platform.db, platform.audit, "s1")
    retried = _run(life, _submit(platform, retries=1))
    again = life.ended(retried, JobState.FAILED, reason="exit 3", exit_code=3)
    assert again is not None
    assert again.state is JobState.QUEUED
    assert _all(events, people, EventKind.JOB_FINISHED) == []
    last = life.ended(_run(life, again), JobState.FAILED, reason="exit 3", exit_code=3)
    assert last is not None
    assert last.state is JobState.FAILED
    (finished,) = _all(events, people, EventKind.JOB_FINISHED)
    assert finished.subject == f"jobs:/{last.id}"
    assert finished.actor == "scheduler:s1"
    assert {k: finished.payload[k] for k in ("job_id", "state", "exit_code")} == {
        "job_id": last.id,
        "state": "failed",
        "exit_code": 3,
    }


def test_a_queued_job_cancelled_is_announced_once(
    platform: Platform, events: EventService, people: People
) -> None:
    job = _submit(platform)
    admin = people.principals["admin"]
    from shamal.security import AuditContext

    ctx = AuditContext(action="job.cancel", actor=admin.name, principal=admin)
    assert platform.jobs.cancel(ctx, job.id).state is JobState.CANCELLED
    (finished,) = _all(events, people, EventKind.JOB_FINISHED)
    assert (finished.payload["state"], finished.payload["job_id"]) == ("cancelled", job.id)


def test_a_job_ended_twice_is_announced_once(
    platform: Platform, events: EventService, people: People
) -> None:
    life = JobLifecycle(platform.db, platform.audit, "s1")
    running = _run(life, _submit(platform))
    assert life.ended(running, JobState.SUCCEEDED, reason="exit 0", exit_code=0) is not None
    assert life.ended(running, JobState.LOST, reason="late") is None  # ended already
    (finished,) = _all(events, people, EventKind.JOB_FINISHED)
    assert finished.payload["state"] == "succeeded"
