"""ORM rows. Only domain ``_store`` modules import these; rows never leave a store."""

from __future__ import annotations

from shamal.db.models._base import Base, UTCDateTime
from shamal.db.models.artifacts import ArtifactFileRow
from shamal.db.models.audit import AuditEntryRow, AuditHeadRow
from shamal.db.models.security import ApiTokenRow, TeamMemberRow, TeamRow, UserRow

__all__ = [
    "ApiTokenRow",
    "ArtifactFileRow",
    "AuditEntryRow",
    "AuditHeadRow",
    "Base",
    "TeamMemberRow",
    "TeamRow",
    "UTCDateTime",
    "UserRow",
]
