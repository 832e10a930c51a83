"""A peer's own virtual environment for a benchmark: made when missing or stale, and its
versions as one line.

A peer (GX, pandera, Feast) runs in its own interpreter, never in Shamal's: their pins would
fight Shamal's, and the comparison is of each tool as its users install it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path


def ensure_venv(
    venv: Path,
    packages: Sequence[str],
    probe: str,
    say: Callable[[str], None],
    first: Sequence[str] = (),
) -> Path:
    """The venv's interpreter; the venv is made (and ``packages`` installed) unless its
    interpreter runs ``probe`` (Python code that fails on a missing or wrong peer).

    ``first`` is installed by a pip run of its own before ``packages`` (torch's CPU build, say,
    so that the peer's own requirements find it in place)."""
    python = venv / "bin" / "python"
    if (
        python.exists()
        and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0
    ):
        return python
    base = shutil.which("python3") or "python3"
    say(f"creating the peer venv: {base} -m venv {venv} (a minute or more)")
    subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    if first:
        subprocess.run([python, "-m", "pip", "install", "-q", *first], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *packages], check=True)
    return python


def versions(python: Path, code: str) -> str:
    """What ``code`` (which prints the peers' versions) prints in the venv."""
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "unknown versions"
