"""Security domain: accounts, teams and roles, API tokens, the audit log, pseudonymization keys.

Public surface for the rest of Shamal; other packages never reach into the
private modules.
"""

from __future__ import annotations

from shamal.security._audit import AuditContext, AuditLog, load_or_create_key
from shamal.security._entities import (
    AccountKind,
    ApiToken,
    AuditEntry,
    ChainReport,
    Invitation,
    IssuedToken,
    Membership,
    Principal,
    Role,
    Team,
    User,
)
from shamal.security._pseudonyms import (
    PURPOSE_PATTERN,
    KeyUse,
    PseudonymKeys,
    PurposeKey,
    SecretRing,
    check_purpose,
)
from shamal.security._service import (
    BOOTSTRAP_ADMIN,
    NAME_PATTERN,
    SecurityService,
    TeamDetail,
    check_name,
)
from shamal.security._tokens import job_of_token_name, job_token_name
from shamal.security._watch import AuditWatch, WitnessFile

__all__ = [
    "BOOTSTRAP_ADMIN",
    "NAME_PATTERN",
    "PURPOSE_PATTERN",
    "AccountKind",
    "ApiToken",
    "AuditContext",
    "AuditEntry",
    "AuditLog",
    "AuditWatch",
    "ChainReport",
    "Invitation",
    "IssuedToken",
    "KeyUse",
    "Membership",
    "Principal",
    "PseudonymKeys",
    "PurposeKey",
    "Role",
    "SecretRing",
    "SecurityService",
    "Team",
    "TeamDetail",
    "User",
    "WitnessFile",
    "check_name",
    "check_purpose",
    "job_of_token_name",
    "job_token_name",
    "load_or_create_key",
]
