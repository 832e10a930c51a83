"""Rules of experiment tracking."""

from __future__ import annotations

import logging

from shamal.artifacts import ArtifactService
from shamal.db import Database
from shamal.errors import InvalidParameter
from shamal.security import AuditLog, Principal, SecurityService, utc_now
from shamal.security._audit import Clock

logger = logging.getLogger(__name__)


class TrackingService:
    """Experiments, runs and their data; shared by the MLflow-dialect and native routers."""

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        security: SecurityService,
        artifacts: ArtifactService,
        clock: Clock = utc_now,
    ) -> None:
        self._db = db
        self._audit = audit
        self._security = security
        self._artifacts = artifacts
        self._clock = clock

    def resolve_model_source(self, principal: Principal, source: str) -> str:
        """See :class:`shamal.registry.ModelSources`."""
        raise InvalidParameter("model version sources are not supported yet")
