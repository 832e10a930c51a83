"""Waiting for an effect in tests: poll with a deadline, never sleep to synchronise."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_for(check: Callable[[], Any], what: str, deadline_s: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy and return that; fail with
    ``what`` after ``deadline_s`` seconds. The interval grows from 5 ms to 100 ms."""
    deadline = time.monotonic() + deadline_s
    delay = 0.005
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {deadline_s}s waiting for {what}")
        time.sleep(delay)  # the poll's interval, bounded by the deadline
        delay = min(delay * 2, 0.1)
    return value


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    wait_for(predicate, what, timeout)
