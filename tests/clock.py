"""A clock for services that take one (``clock=``): it moves only when a test says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
