"""Fixtures of the tune tests: the app with the tune router mounted as the integrator will."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

import pytest
from fastapi.testclient import TestClient

from shamal.server import Platform, create_app
from shamal.tune._service import JobStatus, TuneService


class FakeJobs:
    """A job lookup the test fills in: job id -> status (absent: vanished)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobStatus] = {}

    def __call__(self, ids: Collection[str]) -> Mapping[str, JobStatus]:
        return {i: self.jobs[i] for i in ids if i in self.jobs}


@pytest.fixture
def fake_jobs() -> FakeJobs:
    return FakeJobs()


@pytest.fixture
def tune(platform: Platform, fake_jobs: FakeJobs) -> Iterator[TuneService]:
    service = TuneService(
        platform.db, platform.audit, platform.settings.resolved_database_url, jobs=fake_jobs
    )
    yield service
    service.close()


@pytest.fixture
def tapi(platform: Platform, admin_token: str, tune: TuneService) -> Iterator[TestClient]:
    """An in-process client (as the bootstrap admin) of the app, its tune service looking
    jobs up in :class:`FakeJobs`."""
    real, platform.tune = platform.tune, tune
    try:
        app = create_app(platform.settings, platform)
        with TestClient(app, raise_server_exceptions=False) as client:
            client.headers["Authorization"] = f"Bearer {admin_token}"
            yield client
    finally:
        platform.tune = real
