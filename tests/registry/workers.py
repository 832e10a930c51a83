"""Code run in child processes by the concurrency tests (importable by ``spawn``)."""

from __future__ import annotations

from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

from shamal.db import open_database
from shamal.registry import RegistryService
from shamal.security import AuditContext, AuditLog, SecurityService, load_or_create_key
from tests.registry.conftest import ArtifactSources


def create_versions(
    url: str,
    key_file: str,
    secret: str,
    model: str,
    count: int,
    barrier: Barrier,
    results: Queue[list[int] | str],
) -> None:
    """Open the database like a server process would, wait for the others, then register."""
    db = open_database(url)
    try:
        audit = AuditLog(db, load_or_create_key(Path(key_file), None))
        principal = SecurityService(db, audit).authenticate(secret)
        registry = RegistryService(db, audit, ArtifactSources())
        barrier.wait(timeout=120)
        made = []
        for i in range(count):
            ctx = AuditContext("model_version.create", principal.name, principal)
            made.append(
                registry.create_model_version(ctx, model, f"mlflow-artifacts:/p/{i}").version
            )
        results.put(made)
    except Exception as exc:  # noqa: BLE001 - reported to the parent test, which fails
        results.put(f"{type(exc).__name__}: {exc}")
    finally:
        db.dispose()
