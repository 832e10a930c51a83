"""What the security domain hands to callers: frozen values, never ORM rows."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shamal.errors import NotFound, PermissionDenied

TokenScope = str
"""``full``: an account's own token. ``job``: issued by the scheduler to one job attempt;
it reads and writes as the submitter but takes no admin action, cannot manage tokens,
accounts or teams, and is revoked when the attempt ends. ``deployment:<name>``: it may call
the models of that one deployment (read it, which is what ``shamal serve`` asks the control
plane) and nothing else."""

DEPLOYMENT_SCOPE = "deployment:"
"""The prefix of a deployment token's scope; the deployment's name follows."""


class Role(enum.IntEnum):
    """Roles within a team, ordered: each role can do what the ones below it can."""

    VIEWER = 1
    MEMBER = 2
    MAINTAINER = 3
    ADMIN = 4

    @classmethod
    def parse(cls, name: str) -> Role:
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown role {name!r}") from None

    @property
    def label(self) -> str:
        return self.name.lower()


class AccountKind(enum.StrEnum):
    USER = "user"
    SERVICE = "service"


@dataclass(frozen=True, slots=True)
class User:
    id: str
    name: str
    kind: AccountKind
    is_admin: bool
    disabled: bool
    created_at: datetime
    #: The platform-level grant that reveals reversible pseudonyms (tokenized values).
    privacy_officer: bool = False


@dataclass(frozen=True, slots=True)
class Team:
    id: str
    name: str
    description: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Membership:
    team: str
    user: str
    role: Role


@dataclass(frozen=True, slots=True)
class Invitation:
    """A team admin's offer of ``role`` in ``team`` to ``user``, who joins by accepting it."""

    team: str
    user: str
    role: Role
    invited_by: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ApiToken:
    """A token's record; the secret is never part of it."""

    id: str
    user_id: str
    user_name: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    scope: TokenScope = "full"

    def is_active(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A freshly created token: the only moment the secret exists outside the caller."""

    token: ApiToken
    secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the user behind a token, and their role in each team."""

    user: User
    token_id: str | None
    roles: Mapping[str, Role]
    team_ids: Mapping[str, str] = field(default_factory=dict)  # team name -> team id
    scope: TokenScope = "full"  # the token's
    #: For a job's token (scope ``job``): the prefix of the id of the job it was issued to
    #: (its first 12 characters), read from the token's stored name, never from the caller.
    job: str | None = None

    @property
    def name(self) -> str:
        return self.user.name

    @property
    def deployment(self) -> str | None:
        """The one deployment a deployment token may call; ``None`` for other tokens."""
        if self.scope.startswith(DEPLOYMENT_SCOPE):
            return self.scope.removeprefix(DEPLOYMENT_SCOPE)
        return None

    def require_own_token(self, what: str) -> None:
        """Raises PermissionDenied for a job's token (scope ``job``): ``what`` (managing
        tokens, accounts, teams) needs the person's or service's own token.
        """
        if self.scope != "full":
            raise PermissionDenied(f"a job's token cannot {what}; use your own token")

    def require_admin(self) -> None:
        """Raises PermissionDenied unless the principal is a platform admin acting with
        their own token (an admin's job reaches every team's objects, as its submitter
        does, but takes no admin action)."""
        if not self.user.is_admin:
            raise PermissionDenied("this action needs the platform admin role")
        self.require_own_token("take admin actions")

    def require_privacy_officer(self, what: str) -> None:
        """Raises PermissionDenied unless the principal holds the ``privacy-officer`` grant
        and acts with their own token (a job's token never reveals personal data)."""
        if not self.user.privacy_officer:
            raise PermissionDenied(
                f"{what} needs the privacy-officer grant; a platform admin gives it with "
                "`shamal user grant privacy-officer NAME`"
            )
        self.require_own_token(what)

    def role_in_team_id(self, team_id: str) -> Role | None:
        for name, tid in self.team_ids.items():
            if tid == team_id:
                return self.roles.get(name)
        return None

    def require_owner_role(
        self, team_id: str | None, needed: Role, what: str, *, missing: str | None = None
    ) -> None:
        """Access to an object owned by the team ``team_id`` (None: open to every account).

        Args:
            missing: the message a caller gets for such an object that does not exist; a
                hidden one then reads the same (else "<what> does not exist").

        Raises:
            NotFound: the object's team is not one of the principal's (existence hidden).
            PermissionDenied: in the team, with a role below ``needed``.
        """
        if team_id is None or self.user.is_admin:
            return
        role = self.role_in_team_id(team_id)
        if role is None:
            raise NotFound(missing or f"{what} does not exist")
        if role < needed:
            raise PermissionDenied(f"this action on {what} needs the {needed.label} role")

    def require_team_role(self, team: str, needed: Role) -> None:
        """Check the principal's role in ``team``.

        Raises:
            NotFound: the principal is not in the team (its existence is not revealed).
            PermissionDenied: in the team, but with a role below ``needed``.
        """
        if self.user.is_admin:
            return
        role = self.roles.get(team)
        if role is None:
            raise NotFound(f"team {team!r} does not exist")
        if role < needed:
            raise PermissionDenied(
                f"this action needs the {needed.label} role in team {team!r}; you are {role.label}"
            )


@dataclass(frozen=True, slots=True)
class AuditEntry:
    seq: int
    ts: datetime
    actor: str
    action: str
    target: str
    outcome: str
    detail: Mapping[str, Any]
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class ChainReport:
    """Result of verifying the audit chain.

    ``first_broken_seq`` is the sequence number of the first entry that fails
    (edited, deleted before it, reordered, or a truncated tail), else None.
    ``head_seq``/``head_hash`` name the newest verified entry: kept outside the
    database (the CLI does), they are a witness for the next verification.
    """

    ok: bool
    entries_checked: int
    first_broken_seq: int | None = None
    reason: str = ""
    head_seq: int = 0
    head_hash: str = ""
