"""Event fixtures: people with roles (the registry tests'), a manual clock, the service with
a key ring of its own (webhook secrets sealed as in production)."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from shamal.artifacts import Keyring
from shamal.events import EventKind, EventService, NewEvent, RetryPolicy, emit
from shamal.security import PseudonymKeys
from shamal.server import Platform
from tests.clock import ManualClock
from tests.registry.conftest import People, people

__all__ = ["ManualClock", "People", "people", "record"]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def events(platform: Platform, clock: ManualClock) -> EventService:
    return EventService(
        platform.db,
        platform.audit,
        platform.security,
        clock=clock,
        keys=PseudonymKeys(Keyring.generate()),
        retry=RetryPolicy(base_s=10, cap_s=60, max_attempts=4),
        # The receivers are local (127.0.0.1), as an operator allows for a private network;
        # the guard against private targets is tested in test_targets.py.
        allow_private=True,
    )


def record(
    platform: Platform,
    kind: EventKind = EventKind.JOB_FINISHED,
    team: str | None = "red",
    **payload: object,
) -> int:
    """Emit one event in a transaction of its own; returns its id."""

    def work(s: Session) -> int:
        return emit(s, NewEvent(kind, f"jobs:/{len(payload)}", team, "mo", payload))

    return platform.db.run(work)
