"""Registry fixtures: a real source resolver for tests, people with roles, services and clients.

``ArtifactSources`` is a small, real :class:`~shamal.registry.ModelSources`: it
accepts ``mlflow-artifacts:/<path>`` whose path passes the one path validator,
resolves ``models:/<id>`` of the logged models a test put in ``logged_models``,
and refuses everything else. The platform's own resolver lives in tracking;
these tests build the registry with this one so that they do not wait on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from shamal.artifacts import safe_relpath
from shamal.errors import InvalidParameter
from shamal.registry import RegistryService
from shamal.security import AccountKind, AuditContext, Principal, Role
from shamal.server import Platform, create_app

ARTIFACTS = "mlflow-artifacts:/"
MODELS = "models:/"


class ArtifactSources:
    """Accepts ``mlflow-artifacts:/<safe relative path>``; everything else is InvalidParameter."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        #: Logged models a test made: id -> where their files are.
        self.logged_models: dict[str, str] = {}
        #: Logged models a test made: id -> the run that produced each (if any).
        self.logged_model_runs: dict[str, str] = {}

    def resolve_model_source(self, principal: Principal, source: str) -> str:
        self.calls.append(source)
        if source.removeprefix(MODELS) in self.logged_models:
            return self.logged_models[source.removeprefix(MODELS)]
        if not source.startswith(ARTIFACTS) or source.startswith(ARTIFACTS + "/"):
            raise InvalidParameter("model version sources must be mlflow-artifacts:/ paths")
        return ARTIFACTS + safe_relpath(source[len(ARTIFACTS) :])

    def logged_model_run(self, principal: Principal, model_id: str) -> str | None:
        self.calls.append(f"run-of:{model_id}")
        return self.logged_model_runs.get(model_id)


@dataclass
class People:
    """Principals and API secrets: team ``red`` with one account per role, ``blue``, an outsider."""

    principals: dict[str, Principal]
    secrets: dict[str, str]

    def ctx(self, who: str, action: str = "test") -> AuditContext:
        principal = self.principals[who]
        return AuditContext(action=action, actor=principal.name, principal=principal)

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[who]}"}


_ROLES = {
    "rita": ("red", Role.MAINTAINER),
    "mo": ("red", Role.MEMBER),
    "vi": ("red", Role.VIEWER),
    "bo": ("blue", Role.MEMBER),
}


@pytest.fixture
def people(platform: Platform) -> People:
    security = platform.security
    admin_secret = platform.admin_secret
    assert admin_secret is not None
    admin = security.authenticate(admin_secret)

    def as_admin(action: str) -> AuditContext:
        return AuditContext(action=action, actor=admin.name, principal=admin)

    for team in ("red", "blue"):
        security.create_team(as_admin("team.create"), team)
    secrets = {"admin": admin_secret}
    for user in (*_ROLES, "otto"):
        security.create_user(as_admin("user.create"), user, AccountKind.USER, False)
        secrets[user] = security.create_token(as_admin("token.create"), "t", None, user).secret
    for user, (team, role) in _ROLES.items():
        security.set_member(as_admin("team.member.set"), team, user, role)
    principals = {who: security.authenticate(secret) for who, secret in secrets.items()}
    return People(principals, secrets)


@pytest.fixture
def sources() -> ArtifactSources:
    return ArtifactSources()


@pytest.fixture
def registry(platform: Platform, sources: ArtifactSources) -> RegistryService:
    """The registry service on the test's database (SQLite and PostgreSQL)."""
    return RegistryService(platform.db, platform.audit, sources)


@pytest.fixture
def client(platform: Platform, registry: RegistryService) -> Iterator[TestClient]:
    """The app in-process, its registry built with :class:`ArtifactSources`, as the admin."""
    platform.registry = registry
    app = create_app(platform.settings, platform)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        test_client.headers["Authorization"] = f"Bearer {platform.admin_secret}"
        yield test_client
