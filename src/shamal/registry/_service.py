"""Rules of the model registry (filled in by the registry work)."""

from __future__ import annotations

from typing import Protocol

from shamal.db import Database
from shamal.security import AuditLog, Principal, utc_now
from shamal.security._audit import Clock


class ModelSources(Protocol):
    """Resolves the ``source`` of a new model version to where its files are.

    Accepts only URIs Shamal minted (``runs:/<run_id>/<path>``, ``models:/<logged model id>``,
    ``mlflow-artifacts:/<path>`` inside the artifact store) that the principal may read.

    Raises:
        InvalidParameter: any other URI (hostile-inputs.md §2), a malformed path.
        NotFound: the run / logged model does not exist or is not visible.
    """

    def resolve_model_source(self, principal: Principal, source: str) -> str: ...


class RegistryService:
    def __init__(
        self, db: Database, audit: AuditLog, sources: ModelSources, clock: Clock = utc_now
    ) -> None:
        self._db = db
        self._audit = audit
        self._sources = sources
        self._clock = clock
