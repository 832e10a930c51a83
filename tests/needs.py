"""What a test needs that a laptop may lack: with CI=true it is required, never skipped.

CI installs every dev dependency and has ``shared/traces`` beside the clone, so a missing
one there is a broken set-up, and the test must fail rather than skip.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

IN_CI = os.environ.get("CI") == "true"


def module(name: str) -> ModuleType:
    """Import ``name``; outside CI skip the test module if it is not installed."""
    if IN_CI:
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} is not installed (pip install -e '.[dev]')")


def root(why: str) -> None:
    """Fail (CI, which runs as root) or skip (elsewhere) unless this process is root."""
    if os.geteuid() == 0:
        return
    if IN_CI:
        pytest.fail(f"{why}: CI runs as root, and this test must run there")
    pytest.skip(f"{why}: run the suite as root")


def path(required: Path, what: str) -> None:
    """Fail (CI) or skip (elsewhere) when ``required`` does not exist."""
    if required.exists():
        return
    if IN_CI:
        pytest.fail(f"{what} are missing at {required}; CI must have them")
    pytest.skip(f"{what} are not at {required}")
