"""Monitoring fixtures: team red's model ``fraud`` deployed as ``fraud-api``, its training
dataset ``txns``, the reference built from it, and monitor services of two "servers" that
share one database and one manual clock.

Everything is the real service over the real database (both backends); samples reach the
deployment through ``record_samples``, as a serve process's reports do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shamal.deployments import SampledRequest
from shamal.deployments._entities import DeploymentSpec, WeightedUri
from shamal.deployments._service import DeploymentService
from shamal.monitoring import MonitorService, MonitorServices, ReferenceService
from shamal.monitoring.core import SketchBuilder
from shamal.registry import TEAM_TAG, RegistryService
from shamal.server import Platform
from tests.clock import ManualClock
from tests.registry.conftest import ArtifactSources, People, people

__all__ = ["ManualClock", "People", "people"]

MODEL = "fraud"
DEPLOYMENT = "fraud-api"
ROWS = 2000


def training_table(rows: int = ROWS, seed: int = 1) -> pa.Table:
    """The training set: amount ~ N(100, 10), country among four, the label."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "amount": rng.normal(100, 10, rows),
            "country": rng.choice(["nl", "de", "fr", "be"], rows).astype(object),
            "is_fraud": rng.integers(0, 2, rows),
        }
    )


def scores(rows: int = ROWS, seed: int = 2, shift: float = 0.0) -> np.ndarray:
    return np.clip(np.random.default_rng(seed).beta(2, 5, rows) + shift, 0, 1)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def registry(platform: Platform, people: People) -> RegistryService:
    """Team red's model ``fraud`` (versions 1 and 2) and team blue's ``blues``."""
    svc = RegistryService(platform.db, platform.audit, ArtifactSources())
    svc.create_registered_model(people.ctx("mo"), MODEL, tags={TEAM_TAG: "red"})
    for _ in range(2):
        svc.create_model_version(people.ctx("mo"), MODEL, "mlflow-artifacts:/models/fraud")
    svc.create_registered_model(people.ctx("bo"), "blues", tags={TEAM_TAG: "blue"})
    svc.create_model_version(people.ctx("bo"), "blues", "mlflow-artifacts:/models/blues")
    return svc


@pytest.fixture
def deployments(
    platform: Platform, registry: RegistryService, clock: ManualClock, people: People
) -> DeploymentService:
    svc = DeploymentService(
        platform.db, platform.audit, platform.security, registry, clock, keep_samples=500
    )
    svc.deploy(
        people.ctx("mo"),
        DEPLOYMENT,
        DeploymentSpec(primaries=(WeightedUri(f"models:/{MODEL}/1"),), team="red"),
    )
    return svc


@pytest.fixture
def references(
    platform: Platform,
    registry: RegistryService,
    clock: ManualClock,
    people: People,
    tmp_path: Path,
) -> ReferenceService:
    """References over a training dataset ``txns`` (version 1) of team red, read in
    batches of 300 rows."""
    platform.datasets.create(people.ctx("mo"), "txns", "red")
    platform.datasets.ingest_batches(
        people.ctx("mo"), "txns", training_table().to_batches(), source={"kind": "test"}
    )
    return ReferenceService(
        platform.db,
        platform.audit,
        registry,
        platform.datasets,
        tmp_path / "spool",
        clock,
        batch_rows=300,
    )


def _services(
    platform: Platform,
    deployments: DeploymentService,
    registry: RegistryService,
    references: ReferenceService,
) -> MonitorServices:
    return MonitorServices(
        db=platform.db,
        audit=platform.audit,
        security=platform.security,
        deployments=deployments,
        registry=registry,
        references=references,
        pipelines=platform.pipelines,
        events=platform.events,
    )


@pytest.fixture
def monitors(
    platform: Platform,
    deployments: DeploymentService,
    registry: RegistryService,
    references: ReferenceService,
    clock: ManualClock,
) -> MonitorService:
    """Server A's monitor service."""
    return MonitorService(
        _services(platform, deployments, registry, references), clock, owner="server-a"
    )


@pytest.fixture
def other_server(
    platform: Platform,
    deployments: DeploymentService,
    registry: RegistryService,
    references: ReferenceService,
    clock: ManualClock,
) -> MonitorService:
    """Server B's: the same database and clock, another lease owner."""
    return MonitorService(
        _services(platform, deployments, registry, references), clock, owner="server-b"
    )


def build_reference(references: ReferenceService, people: People, version: int) -> None:
    """``fraud/VERSION``'s reference: built from ``txns/1`` plus the uploaded score sketch."""
    references.build(people.ctx("mo"), MODEL, version, "txns/1", label="is_fraud")
    builder = SketchBuilder({"score": "numeric"})
    builder.update({"score": scores()})
    sketch = builder.result()["score"].to_json()
    references.upload(people.ctx("mo"), MODEL, version, {"score": sketch})


@pytest.fixture
def reference(references: ReferenceService, people: People) -> None:
    """``fraud/1``'s reference."""
    build_reference(references, people, 1)


def excerpt(values: Sequence[object], datatype: str = "FP64") -> dict[str, object]:
    return {"shape": [len(values)], "datatype": datatype, "data": list(values)}


def send(
    deployments: DeploymentService,
    people: People,
    *,
    samples: int = 20,
    per_sample: int = 40,
    amount_shift: float = 0.0,
    seed: int = 5,
    amounts: Sequence[object] | None = None,
    version: str = "1",
) -> int:
    """Record ``samples`` sampled requests of ``per_sample`` rows each (the training
    distribution; with ``amount_shift``, ``amount`` moves by it and the model's scores rise
    with it); returns how many were kept."""
    score_shift = 0.3 if amount_shift else 0.0
    rng = np.random.default_rng(seed)
    principal = people.principals["mo"]
    revision = deployments.get(principal, DEPLOYMENT).revision
    batch = []
    for _ in range(samples):
        amount = (
            list(amounts)
            if amounts is not None
            else (rng.normal(100, 10, per_sample) + amount_shift).tolist()
        )
        batch.append(
            SampledRequest(
                revision=revision,
                version=version,
                shadow=False,
                inputs={
                    "amount": excerpt(amount),
                    "country": excerpt(
                        rng.choice(["nl", "de", "fr", "be"], len(amount)).tolist(), "BYTES"
                    ),
                },
                outputs={
                    "score": excerpt(
                        scores(len(amount), int(rng.integers(1e6)), score_shift).tolist()
                    )
                },
            )
        )
    return deployments.record_samples(principal, DEPLOYMENT, batch)
