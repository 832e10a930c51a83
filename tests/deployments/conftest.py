"""Deployment fixtures: people with roles, a registry with versions to deploy, a manual clock.

The registry is built with the registry tests' real :class:`ArtifactSources` (it accepts
``mlflow-artifacts:/`` paths), so versions exist without logging model files; the deployments
service resolves ``models:/`` URIs through the registry's public API as in production.
"""

from __future__ import annotations

import pytest

from shamal.deployments._service import DeploymentService
from shamal.registry import TEAM_TAG, RegistryService
from shamal.server import Platform
from tests.clock import ManualClock
from tests.registry.conftest import ArtifactSources, People, people

__all__ = ["ManualClock", "People", "people"]

MODEL = "fraud"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def registry(platform: Platform, people: People) -> RegistryService:
    """Team red's model ``fraud`` (versions 1-3, ``@champion`` = 1) and team blue's ``blues``."""
    svc = RegistryService(platform.db, platform.audit, ArtifactSources())
    svc.create_registered_model(people.ctx("mo"), MODEL, tags={TEAM_TAG: "red"})
    for _ in range(3):
        svc.create_model_version(people.ctx("mo"), MODEL, "mlflow-artifacts:/models/fraud")
    svc.set_registered_model_alias(people.ctx("mo"), MODEL, "champion", 1)
    svc.create_registered_model(people.ctx("bo"), "blues", tags={TEAM_TAG: "blue"})
    svc.create_model_version(people.ctx("bo"), "blues", "mlflow-artifacts:/models/blues")
    return svc


@pytest.fixture
def service(platform: Platform, registry: RegistryService, clock: ManualClock) -> DeploymentService:
    return DeploymentService(
        platform.db, platform.audit, platform.security, registry, clock, keep_samples=5
    )
