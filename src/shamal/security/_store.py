"""SQL access for the security domain. ORM rows never leave this module."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from shamal.db.models import (
    ApiTokenRow,
    AuditEntryRow,
    AuditHeadRow,
    SignInLinkRow,
    TeamInvitationRow,
    TeamMemberRow,
    TeamRow,
    UserRow,
)
from shamal.errors import NotFound
from shamal.security._entities import (
    AccountKind,
    ApiToken,
    AuditEntry,
    Invitation,
    Membership,
    Role,
    Team,
    TokenScope,
    User,
)


def new_id() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------------- users
def _user(row: UserRow) -> User:
    return User(
        id=row.id,
        name=row.name,
        kind=AccountKind(row.kind),
        is_admin=row.is_admin,
        disabled=row.disabled,
        created_at=row.created_at,
        privacy_officer=row.privacy_officer,
    )


def insert_user(s: Session, name: str, kind: AccountKind, *, is_admin: bool, now: datetime) -> User:
    row = UserRow(
        id=new_id(), name=name, kind=kind.value, is_admin=is_admin, disabled=False, created_at=now
    )
    s.add(row)
    s.flush()
    return _user(row)


def get_user(s: Session, name: str) -> User:
    row = s.scalar(select(UserRow).where(UserRow.name == name))
    if row is None:
        raise NotFound(f"user {name!r} does not exist")
    return _user(row)


def list_users(s: Session) -> list[User]:
    return [_user(r) for r in s.scalars(select(UserRow).order_by(UserRow.name))]


def set_user_disabled(s: Session, name: str, disabled: bool) -> User:
    row = s.scalar(select(UserRow).where(UserRow.name == name))
    if row is None:
        raise NotFound(f"user {name!r} does not exist")
    row.disabled = disabled
    s.flush()
    return _user(row)


def set_privacy_officer(s: Session, name: str, granted: bool) -> User:
    row = s.scalar(select(UserRow).where(UserRow.name == name))
    if row is None:
        raise NotFound(f"user {name!r} does not exist")
    row.privacy_officer = granted
    s.flush()
    return _user(row)


def count_admins(s: Session) -> int:
    return s.scalar(select(func.count()).select_from(UserRow).where(UserRow.is_admin)) or 0


# ---------------------------------------------------------------------- teams
def _team(row: TeamRow) -> Team:
    return Team(id=row.id, name=row.name, description=row.description, created_at=row.created_at)


def insert_team(s: Session, name: str, description: str, now: datetime) -> Team:
    row = TeamRow(id=new_id(), name=name, description=description, created_at=now)
    s.add(row)
    s.flush()
    return _team(row)


def _team_row(s: Session, name: str) -> TeamRow:
    row = s.scalar(select(TeamRow).where(TeamRow.name == name))
    if row is None:
        raise NotFound(f"team {name!r} does not exist")
    return row


def get_team(s: Session, name: str) -> Team:
    return _team(_team_row(s, name))


def list_teams(s: Session, only: Sequence[str] | None = None) -> list[Team]:
    query = select(TeamRow).order_by(TeamRow.name)
    if only is not None:
        query = query.where(TeamRow.name.in_(list(only)))
    return [_team(r) for r in s.scalars(query)]


def delete_team(s: Session, name: str) -> None:
    row = _team_row(s, name)
    s.execute(delete(TeamMemberRow).where(TeamMemberRow.team_id == row.id))
    s.execute(delete(TeamInvitationRow).where(TeamInvitationRow.team_id == row.id))
    s.delete(row)
    s.flush()


def upsert_member(s: Session, team: str, user: str, role: Role, now: datetime) -> Membership:
    team_row = _team_row(s, team)
    user_row = s.scalar(select(UserRow).where(UserRow.name == user))
    if user_row is None:
        raise NotFound(f"user {user!r} does not exist")
    row = s.get(TeamMemberRow, (team_row.id, user_row.id))
    if row is None:
        s.add(
            TeamMemberRow(team_id=team_row.id, user_id=user_row.id, role=role.label, created_at=now)
        )
    else:
        row.role = role.label
    s.flush()
    return Membership(team=team, user=user, role=role)


def remove_member(s: Session, team: str, user: str) -> None:
    team_row = _team_row(s, team)
    user_id = s.scalar(select(UserRow.id).where(UserRow.name == user))
    result = s.execute(
        delete(TeamMemberRow).where(
            TeamMemberRow.team_id == team_row.id, TeamMemberRow.user_id == user_id
        )
    )
    if getattr(result, "rowcount", 0) == 0:
        raise NotFound(f"user {user!r} is not a member of team {team!r}")


def is_member(s: Session, team: str, user: str) -> bool:
    team_row = _team_row(s, team)
    user_id = s.scalar(select(UserRow.id).where(UserRow.name == user))
    return user_id is not None and s.get(TeamMemberRow, (team_row.id, user_id)) is not None


def upsert_invitation(
    s: Session, team: str, user: str, role: Role, invited_by: str, now: datetime
) -> Invitation:
    """Offer ``role`` in ``team`` to ``user`` (a new offer replaces an older one)."""
    team_row = _team_row(s, team)
    user_row = s.scalar(select(UserRow).where(UserRow.name == user))
    if user_row is None:
        raise NotFound(f"user {user!r} does not exist")
    row = s.get(TeamInvitationRow, (team_row.id, user_row.id))
    if row is None:
        row = TeamInvitationRow(
            team_id=team_row.id, user_id=user_row.id, role=role.label, invited_by=invited_by,
            created_at=now,
        )  # fmt: skip
        s.add(row)
    else:
        row.role, row.invited_by, row.created_at = role.label, invited_by, now
    s.flush()
    return Invitation(team=team, user=user, role=role, invited_by=invited_by, created_at=now)


def invitations_of(s: Session, user: str) -> list[Invitation]:
    """The invitations ``user`` has not answered, by team."""
    rows = s.execute(
        select(TeamRow.name, TeamInvitationRow)
        .join(TeamRow, TeamRow.id == TeamInvitationRow.team_id)
        .join(UserRow, UserRow.id == TeamInvitationRow.user_id)
        .where(UserRow.name == user)
        .order_by(TeamRow.name)
    ).all()
    return [
        Invitation(
            team=team,
            user=user,
            role=Role.parse(row.role),
            invited_by=row.invited_by,
            created_at=row.created_at,
        )  # fmt: skip
        for team, row in rows
    ]


def take_invitation(s: Session, team: str, user: str) -> Invitation:
    """Remove and return ``user``'s invitation to ``team``.

    Raises:
        NotFound: there is none (or the team is gone).
    """
    for invitation in invitations_of(s, user):
        if invitation.team == team:
            team_id = _team_row(s, team).id
            user_id = s.scalar(select(UserRow.id).where(UserRow.name == user))
            s.execute(
                delete(TeamInvitationRow).where(
                    TeamInvitationRow.team_id == team_id, TeamInvitationRow.user_id == user_id
                )
            )
            return invitation
    raise NotFound(f"no invitation to team {team!r}")


def list_members(s: Session, team: str) -> list[Membership]:
    team_row = _team_row(s, team)
    rows = s.execute(
        select(UserRow.name, TeamMemberRow.role)
        .join(UserRow, UserRow.id == TeamMemberRow.user_id)
        .where(TeamMemberRow.team_id == team_row.id)
        .order_by(UserRow.name)
    )
    return [Membership(team=team, user=name, role=Role.parse(role)) for name, role in rows]


def roles_of(s: Session, user_id: str) -> tuple[dict[str, Role], dict[str, str]]:
    """(team name -> role, team name -> team id) for one user."""
    rows = s.execute(
        select(TeamRow.name, TeamRow.id, TeamMemberRow.role)
        .join(TeamRow, TeamRow.id == TeamMemberRow.team_id)
        .where(TeamMemberRow.user_id == user_id)
    ).all()
    return {name: Role.parse(role) for name, _, role in rows}, {name: tid for name, tid, _ in rows}


# ---------------------------------------------------------------------- tokens
def _token(row: ApiTokenRow, user_name: str) -> ApiToken:
    return ApiToken(
        id=row.id,
        user_id=row.user_id,
        user_name=user_name,
        name=row.name,
        prefix=row.prefix,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
        scope=row.scope,
    )


def insert_token(
    s: Session,
    user: User,
    name: str,
    token_hash: str,
    prefix: str,
    now: datetime,
    expires_at: datetime | None,
    scope: TokenScope = "full",
) -> ApiToken:
    row = ApiTokenRow(
        id=new_id(),
        user_id=user.id,
        name=name,
        token_hash=token_hash,
        prefix=prefix,
        created_at=now,
        expires_at=expires_at,
        scope=scope,
    )
    s.add(row)
    s.flush()
    return _token(row, user.name)


def find_token(s: Session, token_hash: str) -> tuple[ApiToken, User] | None:
    found = s.execute(
        select(ApiTokenRow, UserRow)
        .join(UserRow, UserRow.id == ApiTokenRow.user_id)
        .where(ApiTokenRow.token_hash == token_hash)
    ).first()
    if found is None:
        return None
    token_row, user_row = found
    return _token(token_row, user_row.name), _user(user_row)


def list_tokens(s: Session, user_name: str | None) -> list[ApiToken]:
    query = (
        select(ApiTokenRow, UserRow.name)
        .join(UserRow, UserRow.id == ApiTokenRow.user_id)
        .order_by(ApiTokenRow.created_at)
    )
    if user_name is not None:
        query = query.where(UserRow.name == user_name)
    return [_token(row, name) for row, name in s.execute(query)]


def get_token(s: Session, token_id: str) -> ApiToken:
    found = s.execute(
        select(ApiTokenRow, UserRow.name)
        .join(UserRow, UserRow.id == ApiTokenRow.user_id)
        .where(ApiTokenRow.id == token_id)
    ).first()
    if found is None:
        raise NotFound(f"token {token_id!r} does not exist")
    return _token(found[0], found[1])


def revoke_token(s: Session, token_id: str, now: datetime) -> None:
    s.execute(
        update(ApiTokenRow)
        .where(ApiTokenRow.id == token_id, ApiTokenRow.revoked_at.is_(None))
        .values(revoked_at=now)
    )


def revoke_job_tokens(s: Session, user_name: str, name: str, now: datetime) -> list[str]:
    """Revoke the active job-scoped tokens of ``user_name`` called ``name``; their ids."""
    ids = list(
        s.scalars(
            select(ApiTokenRow.id)
            .join(UserRow, UserRow.id == ApiTokenRow.user_id)
            .where(
                UserRow.name == user_name,
                ApiTokenRow.name == name,
                ApiTokenRow.scope == "job",
                ApiTokenRow.revoked_at.is_(None),
            )
        )
    )
    if ids:
        s.execute(update(ApiTokenRow).where(ApiTokenRow.id.in_(ids)).values(revoked_at=now))
    return ids


def touch_token(s: Session, token_id: str, now: datetime) -> None:
    s.execute(update(ApiTokenRow).where(ApiTokenRow.id == token_id).values(last_used_at=now))


# ---------------------------------------------------------------------- audit
def _entry(row: AuditEntryRow) -> AuditEntry:
    return AuditEntry(
        seq=row.seq,
        ts=row.ts,
        actor=row.actor,
        action=row.action,
        target=row.target,
        outcome=row.outcome,
        detail=json.loads(row.detail),
        prev_hash=row.prev_hash,
        hash=row.hash,
    )


def lock_audit_head(s: Session) -> tuple[int, str]:
    """Lock the chain head for this transaction and return (seq, hash)."""
    row = s.scalar(select(AuditHeadRow).where(AuditHeadRow.id == 1).with_for_update())
    if row is None:
        raise NotFound("the audit chain head is missing; run `shamal db upgrade`")
    return row.seq, row.hash


def read_audit_head(s: Session) -> tuple[int, str]:
    row = s.get(AuditHeadRow, 1)
    if row is None:
        return 0, ""
    return row.seq, row.hash


def append_audit(s: Session, entry: AuditEntry) -> None:
    s.add(
        AuditEntryRow(
            seq=entry.seq,
            ts=entry.ts,
            actor=entry.actor,
            action=entry.action,
            target=entry.target,
            outcome=entry.outcome,
            detail=json.dumps(dict(entry.detail), sort_keys=True),
            prev_hash=entry.prev_hash,
            hash=entry.hash,
        )
    )
    s.execute(
        update(AuditHeadRow).where(AuditHeadRow.id == 1).values(seq=entry.seq, hash=entry.hash)
    )


def iter_audit(s: Session, batch: int = 1000) -> Iterator[AuditEntry]:
    """All entries in ``seq`` order, read in keyset-paginated batches."""
    after = 0
    while True:
        rows = s.scalars(
            select(AuditEntryRow)
            .where(AuditEntryRow.seq > after)
            .order_by(AuditEntryRow.seq)
            .limit(batch)
        ).all()
        if not rows:
            return
        for row in rows:
            yield _entry(row)
        after = rows[-1].seq


def list_audit(
    s: Session, *, limit: int, before: int | None, action: str | None, actor: str | None
) -> list[AuditEntry]:
    query = select(AuditEntryRow).order_by(AuditEntryRow.seq.desc()).limit(limit)
    filters: list[Any] = []
    if before is not None:
        filters.append(AuditEntryRow.seq < before)
    if action is not None:
        filters.append(AuditEntryRow.action == action)
    if actor is not None:
        filters.append(AuditEntryRow.actor == actor)
    if filters:
        query = query.where(*filters)
    return [_entry(r) for r in s.scalars(query)]


# ------------------------------------------------------------------ sign-in links
def insert_sign_in_link(
    s: Session, user: User, code_hash: str, now: datetime, expires_at: datetime
) -> None:
    """Store a one-time link's code (its hash); links expired a day ago are swept."""
    s.execute(delete(SignInLinkRow).where(SignInLinkRow.expires_at < now - timedelta(days=1)))
    s.add(
        SignInLinkRow(code_hash=code_hash, user_id=user.id, created_at=now, expires_at=expires_at)
    )
    s.flush()


def use_sign_in_link(s: Session, code_hash: str, now: datetime) -> str | None:
    """Mark the link used, once: the name of the user it signs in, or None when there is
    no such link, it expired, or it was used before (one UPDATE, so two concurrent uses
    cannot both win)."""
    used = s.execute(
        update(SignInLinkRow)
        .where(
            SignInLinkRow.code_hash == code_hash,
            SignInLinkRow.used_at.is_(None),
            SignInLinkRow.expires_at > now,
        )
        .values(used_at=now)
    )
    if getattr(used, "rowcount", 0) != 1:
        return None
    return s.scalar(
        select(UserRow.name)
        .join(SignInLinkRow, SignInLinkRow.user_id == UserRow.id)
        .where(SignInLinkRow.code_hash == code_hash)
    )
