"""The quickstart `make run` shows: each capability adds its step here."""

from __future__ import annotations

import io
import time

from rich.console import Console
from rich.panel import Panel

from shamal.client import ShamalClient
from shamal.errors import AlreadyExists, ServiceUnavailable

QUICKSTART_TEAM = "quickstart"


def wait_until_up(client: ShamalClient, deadline_s: float = 60.0) -> None:
    """Poll /health until the server answers or the deadline passes."""
    end = time.monotonic() + deadline_s
    while not client.health():
        if time.monotonic() > end:
            raise ServiceUnavailable(f"the server at {client.url} did not come up")
        time.sleep(0.1)


def run_quickstart(client: ShamalClient, console: Console) -> None:
    """Create a team, store an artifact, read it back and verify the audit chain."""
    steps: list[str] = []
    try:
        client.create_team(QUICKSTART_TEAM, "made by the quickstart")
        steps.append(f"created team [bold]{QUICKSTART_TEAM}[/]")
    except AlreadyExists:
        steps.append(f"team [bold]{QUICKSTART_TEAM}[/] exists already")
    payload = b"Hello from the Shamal quickstart.\n"
    stored = client.upload_artifact(QUICKSTART_TEAM, "hello/greeting.txt", io.BytesIO(payload))
    echoed = b"".join(client.download_artifact(QUICKSTART_TEAM, "hello/greeting.txt"))
    assert echoed == payload, "the artifact store returned different bytes"
    steps.append(
        f"stored artifact hello/greeting.txt (sha256 {stored['digest'][:12]}...) and read it back"
    )
    report = client.verify_audit()
    steps.append(
        f"audit chain verified: {report['entries_checked']} entries, intact={report['ok']}"
    )
    console.print(Panel("\n".join(f"- {s}" for s in steps), title="quickstart", title_align="left"))
