"""Time, in one place: what a clock is, and the real one.

Services take a :data:`Clock` (default :func:`utc_now`) so that tests and the trace
simulator can run time at their own pace.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["Clock", "utc_now"]

#: A source of the current time: an aware datetime in UTC.
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)
