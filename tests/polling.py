"""Waiting for an effect in tests: poll a predicate with a deadline, never sleep to synchronise."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)  # the poll's interval, bounded by the deadline
        delay = min(delay * 2, 0.1)
