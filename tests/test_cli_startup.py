"""`shamal` answers quickly: a command that talks to the API loads neither the server,
the database layer nor the optimizer; each is imported by the command that needs it."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "shamal.server",
    "shamal.db",
    "shamal.jobs._service",
    "shamal.scheduler.live._lifecycle",
    "shamal.jobs.api",
    "shamal.optimize",
    "fastapi",
    "sqlalchemy",
    "alembic",
    "torch",
    "sklearn",
    "onnxruntime",
    "numpy",
)


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_cli_loads_no_server_database_or_optimizer_to_start() -> None:
    loaded = _loaded_after("import shamal.cli")
    assert "shamal.cli.job" in loaded  # the commands are all there
    assert "shamal.jobs._schemas" in loaded  # with what `job submit` checks a job with
    assert "shamal.client" in loaded
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(f"{h}.") for h in HEAVY))
    assert heavy == []
