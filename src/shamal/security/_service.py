"""Rules of the security domain: accounts, teams, roles, tokens, authentication."""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from shamal.clock import Clock, utc_now
from shamal.db import Database
from shamal.errors import Conflict, InvalidParameter, NotFound, PermissionDenied, Unauthenticated
from shamal.security import _store
from shamal.security._audit import AuditContext, AuditLog
from shamal.security._entities import (
    DEPLOYMENT_SCOPE,
    AccountKind,
    ApiToken,
    Invitation,
    IssuedToken,
    Membership,
    Principal,
    Role,
    Team,
    TokenScope,
    User,
)
from shamal.security._tokens import (
    display_prefix,
    hash_secret,
    job_of_token_name,
    looks_like_token,
    new_secret,
)

logger = logging.getLogger(__name__)

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)
MAX_TOKEN_LIFETIME = timedelta(days=366)
#: How long a one-time sign-in link printed at start-up stays usable.
SIGN_IN_LINK_LIFETIME = timedelta(minutes=15)
# last_used_at is bookkeeping, not security: write it at most this often per token.
_TOUCH_INTERVAL = timedelta(minutes=1)
BOOTSTRAP_ADMIN = "admin"
# Authentication is two queries on every request; a principal is reused for at most this
# long. Changes made through this process drop the cache at once; other processes of the
# same deployment see a revoked token or a changed role within this window.
PRINCIPAL_CACHE_TTL = timedelta(seconds=2)
_PRINCIPAL_CACHE_MAX = 10_000


def check_name(kind: str, name: str) -> str:
    """Names of users, teams and tokens: lowercase, digits, ``.-_``; at most 64 characters."""
    if not _NAME_RE.fullmatch(name):
        raise InvalidParameter(
            f"{kind} names use lowercase letters, digits, '.', '-' and '_' (1-64 characters)"
        )
    return name


@dataclass(frozen=True, slots=True)
class TeamDetail:
    team: Team
    members: list[Membership]


class SecurityService:
    """Accounts, teams, memberships and tokens, with every change audited.

    Thread-safe; one instance per process.
    """

    def __init__(self, db: Database, audit: AuditLog, clock: Clock = utc_now) -> None:
        self._db = db
        self._audit = audit
        self._clock = clock
        self._principals: dict[str, tuple[Principal, datetime]] = {}
        self._cache_lock = threading.Lock()

    # ------------------------------------------------------------------ authentication
    def cached_principal(self, secret: str) -> Principal | None:
        """The principal :meth:`authenticate` resolved for ``secret`` within the cache's
        lifetime, or None when it has to look (unknown, expired, malformed: never raises).

        Touches no database: the request path calls it first and goes to a worker thread
        for :meth:`authenticate` only when it answers None.
        """
        if not looks_like_token(secret):
            return None
        cached = self._principals.get(hash_secret(secret))
        if cached is not None and self._clock() < cached[1]:
            return cached[0]
        return None

    def authenticate(self, secret: str) -> Principal:
        """Resolve a bearer secret to its principal.

        Raises:
            Unauthenticated: malformed, unknown, revoked or expired token, or a disabled account.
        """
        if not looks_like_token(secret):
            raise Unauthenticated("the bearer token is malformed")
        token_hash = hash_secret(secret)
        now = self._clock()
        cached = self._principals.get(token_hash)
        if cached is not None and now < cached[1]:
            return cached[0]
        with self._db.unit_of_work(write=False) as s:
            found = _store.find_token(s, token_hash)
            if found is None:
                raise Unauthenticated("the bearer token is not valid")
            token, user = found
            if not token.is_active(now):
                raise Unauthenticated("the bearer token has expired or was revoked")
            if user.disabled:
                raise Unauthenticated("the account of this token is disabled")
            roles, team_ids = _store.roles_of(s, user.id)
        if token.last_used_at is None or now - token.last_used_at > _TOUCH_INTERVAL:
            self._db.run(lambda s: _store.touch_token(s, token.id, now))
        principal = Principal(
            user=user,
            token_id=token.id,
            roles=roles,
            team_ids=team_ids,
            scope=token.scope,
            # Only the scheduler issues job tokens, so only their names say which job.
            job=job_of_token_name(token.name) if token.scope == "job" else None,
        )
        until = now + PRINCIPAL_CACHE_TTL
        if token.expires_at is not None:
            until = min(until, token.expires_at)
        with self._cache_lock:
            if len(self._principals) >= _PRINCIPAL_CACHE_MAX:
                self._principals.clear()
            self._principals[token_hash] = (principal, until)
        return principal

    def principal_of(self, user: str) -> Principal:
        """The account ``user`` as work the platform does on their behalf sees it (a
        pipeline's triggered run): their teams and roles, with the ``job`` scope, so it
        takes no admin action and manages no tokens, accounts or teams.

        Raises:
            NotFound: no such account. PermissionDenied: the account is disabled.
        """
        with self._db.unit_of_work(write=False) as s:
            account = _store.get_user(s, user)
            if account.disabled:
                raise PermissionDenied(f"the account {user!r} is disabled")
            roles, team_ids = _store.roles_of(s, account.id)
        return Principal(user=account, token_id=None, roles=roles, team_ids=team_ids, scope="job")

    def forget_principals(self) -> None:
        """Drop cached principals: called after every change to accounts, teams or tokens."""
        with self._cache_lock:
            self._principals.clear()

    def bootstrap(self, token_file: Path) -> str | None:
        """On first start, create the ``admin`` account and write its token to ``token_file``.

        Returns the new secret, or None when an admin exists already. The file
        is created with mode 0600; its directory with 0700.
        """
        now = self._clock()
        secret = new_secret()

        def work(s: Session) -> bool:
            if _store.count_admins(s) > 0:
                return False
            user = _store.insert_user(s, BOOTSTRAP_ADMIN, AccountKind.USER, is_admin=True, now=now)
            _store.insert_token(
                s, user, "bootstrap", hash_secret(secret), display_prefix(secret), now, None
            )
            self._audit.append(
                s,
                actor="system",
                action="user.bootstrap",
                target=f"user:{BOOTSTRAP_ADMIN}",
                outcome="ok",
            )
            return True

        if not self._db.run(work, retry_unique=True):
            return None
        token_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = token_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secret + "\n")
        os.replace(tmp, token_file)
        return secret

    # ------------------------------------------------------------------ users
    def create_user(self, ctx: AuditContext, name: str, kind: AccountKind, is_admin: bool) -> User:
        ctx.require_principal().require_admin()
        check_name("user", name)
        ctx.target = f"user:{name}"

        def work(s: Session) -> User:
            user = _store.insert_user(s, name, kind, is_admin=is_admin, now=self._clock())
            self._audit.record(s, ctx, ctx.target, kind=kind.value, is_admin=is_admin)
            return user

        return self._db.run(work)

    def list_users(self, principal: Principal) -> list[User]:
        principal.require_admin()
        with self._db.unit_of_work(write=False) as s:
            return _store.list_users(s)

    def set_user_disabled(self, ctx: AuditContext, name: str, disabled: bool) -> User:
        principal = ctx.require_principal()
        principal.require_admin()
        ctx.target = f"user:{name}"
        if disabled and name == principal.name:
            # A state of the request, not a malformed one: 409, as any refusal of its kind.
            raise Conflict("you cannot disable your own account; another platform admin can")

        def work(s: Session) -> User:
            user = _store.set_user_disabled(s, name, disabled)
            self._audit.record(s, ctx, ctx.target, disabled=disabled)
            return user

        try:
            return self._db.run(work)
        finally:
            self.forget_principals()

    def set_privacy_officer(self, ctx: AuditContext, name: str, granted: bool) -> User:
        """Give or take the ``privacy-officer`` grant (platform admins): who holds it may
        reveal tokenized personal values and erase a data subject from any dataset."""
        ctx.require_principal().require_admin()
        check_name("user", name)
        ctx.target = f"user:{name}"

        def work(s: Session) -> User:
            user = _store.set_privacy_officer(s, name, granted)
            self._audit.record(s, ctx, ctx.target, grant="privacy-officer", granted=granted)
            return user

        try:
            return self._db.run(work)
        finally:
            self.forget_principals()

    # ------------------------------------------------------------------ teams
    def create_team(self, ctx: AuditContext, name: str, description: str = "") -> Team:
        ctx.require_principal().require_admin()
        check_name("team", name)
        ctx.target = f"team:{name}"

        def work(s: Session) -> Team:
            team = _store.insert_team(s, name, description, self._clock())
            self._audit.record(s, ctx, ctx.target)
            return team

        return self._db.run(work)

    def list_teams(self, principal: Principal) -> list[Team]:
        """Every team for admins; one's own teams for everybody else."""
        only = None if principal.user.is_admin else list(principal.roles)
        with self._db.unit_of_work(write=False) as s:
            return _store.list_teams(s, only)

    def authorize_team(self, principal: Principal, name: str, needed: Role) -> Team:
        """The team, if ``principal`` holds at least ``needed`` in it (admins: any team).

        Other domains call this before touching a team's objects.

        Raises:
            NotFound: no such team, or the principal is not in it.
            PermissionDenied: in the team with a lower role.
        """
        principal.require_team_role(name, needed)
        with self._db.unit_of_work(write=False) as s:
            return _store.get_team(s, name)

    def owning_team(
        self, principal: Principal, team: str | None, what: str
    ) -> tuple[str, str | None]:
        """(name, id) of the team a new object belongs to: ``team`` when given (the principal
        must be a member), else the principal's only team; an admin in no team creates
        platform-wide objects (``("", None)``).

        Args:
            what: how the error names the choice, e.g. "owns this deployment".

        Raises:
            InvalidParameter: no team given and the principal has several (or none).
            NotFound, PermissionDenied: as :meth:`authorize_team`.
        """
        if team is None:
            if len(principal.roles) == 1:
                team = next(iter(principal.roles))
            elif principal.user.is_admin and not principal.roles:
                return "", None
            else:
                names = ", ".join(sorted(principal.roles)) or "none"
                raise InvalidParameter(f"say which team {what} (yours: {names})")
        found = self.authorize_team(principal, team, Role.MEMBER)
        return found.name, found.id

    def get_team(self, principal: Principal, name: str) -> TeamDetail:
        principal.require_team_role(name, Role.VIEWER)
        with self._db.unit_of_work(write=False) as s:
            return TeamDetail(_store.get_team(s, name), _store.list_members(s, name))

    def delete_team(self, ctx: AuditContext, name: str) -> None:
        ctx.require_principal().require_admin()
        ctx.target = f"team:{name}"

        def work(s: Session) -> None:
            _store.delete_team(s, name)
            self._audit.record(s, ctx, ctx.target)

        try:
            self._db.run(work)
        finally:
            self.forget_principals()

    def set_member(
        self, ctx: AuditContext, team: str, user: str, role: Role
    ) -> Membership | Invitation:
        """Add ``user`` to ``team`` or change their role. Needs team admin.

        Joining a team takes the account's consent (a team's jobs, tokens and audit trail
        would act in its name): a platform admin adds the account at once, a team admin
        changes a member's role at once but only invites an account that is not a member
        yet, which joins by :meth:`accept_invitation`.

        Returns:
            The membership, or the invitation that waits for the account.
        """
        principal = ctx.require_principal()
        principal.require_own_token("change team members")
        principal.require_team_role(team, Role.ADMIN)
        ctx.target = f"team:{team}/user:{user}"

        def work(s: Session) -> Membership | Invitation:
            if principal.user.is_admin or _store.is_member(s, team, user):
                done: Membership | Invitation = _store.upsert_member(
                    s, team, user, role, self._clock()
                )
                self._audit.record(s, ctx, ctx.target, role=role.label)
            else:
                done = _store.upsert_invitation(s, team, user, role, principal.name, self._clock())
                self._audit.record(s, ctx, ctx.target, role=role.label, invited=True)
            return done

        try:
            return self._db.run(work, retry_unique=True)
        finally:
            self.forget_principals()

    def invitations(self, principal: Principal) -> list[Invitation]:
        """The caller's own invitations that wait for an answer."""
        with self._db.unit_of_work(write=False) as s:
            return _store.invitations_of(s, principal.name)

    def accept_invitation(self, ctx: AuditContext, team: str) -> Membership:
        """Join ``team`` with the role the invitation offers.

        Raises:
            NotFound: the caller has no invitation to ``team``.
            PermissionDenied: a job's token (an account accepts with its own).
        """
        principal = ctx.require_principal()
        principal.require_own_token("accept an invitation")
        ctx.target = f"team:{team}/user:{principal.name}"

        def work(s: Session) -> Membership:
            invitation = _store.take_invitation(s, team, principal.name)
            membership = _store.upsert_member(
                s, team, principal.name, invitation.role, self._clock()
            )
            self._audit.record(
                s, ctx, ctx.target, role=invitation.role.label, invited_by=invitation.invited_by
            )
            return membership

        try:
            return self._db.run(work, retry_unique=True)
        finally:
            self.forget_principals()

    def decline_invitation(self, ctx: AuditContext, team: str) -> None:
        """Drop the caller's invitation to ``team``.

        Raises:
            NotFound: the caller has no invitation to ``team``.
        """
        principal = ctx.require_principal()
        principal.require_own_token("decline an invitation")
        ctx.target = f"team:{team}/user:{principal.name}"

        def work(s: Session) -> None:
            _store.take_invitation(s, team, principal.name)
            self._audit.record(s, ctx, ctx.target)

        self._db.run(work)

    def remove_member(self, ctx: AuditContext, team: str, user: str) -> None:
        principal = ctx.require_principal()
        principal.require_own_token("change team members")
        principal.require_team_role(team, Role.ADMIN)
        ctx.target = f"team:{team}/user:{user}"

        def work(s: Session) -> None:
            _store.remove_member(s, team, user)
            self._audit.record(s, ctx, ctx.target)

        try:
            self._db.run(work)
        finally:
            self.forget_principals()

    # ------------------------------------------------------------------ tokens
    def create_token(
        self,
        ctx: AuditContext,
        name: str,
        expires_in: timedelta | None,
        for_user: str | None = None,
    ) -> IssuedToken:
        """Issue a token for the caller, or (admins only) for another account.

        The secret is returned once and stored only as its SHA-256.
        """
        principal = ctx.require_principal()
        principal.require_own_token("create tokens")
        check_name("token", name)
        owner = for_user or principal.name
        if owner != principal.name:
            principal.require_admin()
        return self._issue_token(ctx, owner, name, expires_in)

    def issue_job_token(self, user: str, name: str, expires_in: timedelta) -> IssuedToken:
        """A short-lived token the scheduler hands a job attempt, acting as its submitter
        with the ``job`` scope (reads and writes as the submitter, but no admin actions and
        no token, account or team management).

        Audited with the scheduler as actor. The job sees it only in its environment; the
        scheduler revokes it when the attempt ends (:meth:`revoke_job_tokens`), and it
        expires on its own in any case (the lifetime follows the time limit).
        """
        check_name("token", name)
        ctx = AuditContext(action="token.create", actor="scheduler")
        return self._issue_token(ctx, user, name, expires_in, scope="job")

    def issue_deployment_token(
        self, ctx: AuditContext, deployment: str, name: str, expires_in: timedelta | None
    ) -> IssuedToken:
        """A token of the caller's that may call the models of ``deployment`` and nothing
        else (scope ``deployment:<name>``): what a deployment's callers hold.

        The caller must be allowed to read the deployment; the deployments service checks
        that before it asks for the token.
        """
        principal = ctx.require_principal()
        principal.require_own_token("create tokens")
        check_name("token", name)
        return self._issue_token(
            ctx, principal.name, name, expires_in, scope=f"{DEPLOYMENT_SCOPE}{deployment}"
        )

    def revoke_job_tokens(self, user: str, name: str) -> int:
        """Revoke the job tokens ``name`` of ``user`` (an attempt ended); how many were active.

        Audited with the scheduler as actor; idempotent.
        """
        ctx = AuditContext(action="token.revoke", actor="scheduler")
        ctx.target = f"user:{user}/token:{name}"

        def work(s: Session) -> int:
            ids = _store.revoke_job_tokens(s, user, name, self._clock())
            for token_id in ids:
                self._audit.record(s, ctx, f"{ctx.target}/{token_id}")
            return len(ids)

        try:
            return self._db.run(work)
        finally:
            self.forget_principals()

    def _issue_token(
        self,
        ctx: AuditContext,
        owner: str,
        name: str,
        expires_in: timedelta | None,
        scope: TokenScope = "full",
    ) -> IssuedToken:
        if expires_in is not None and not timedelta(0) < expires_in <= MAX_TOKEN_LIFETIME:
            raise InvalidParameter("token lifetime must be between 1 second and 366 days")
        ctx.target = f"user:{owner}/token:{name}"
        secret = new_secret()
        now = self._clock()

        def work(s: Session) -> ApiToken:
            user = _store.get_user(s, owner)
            if user.disabled:
                raise InvalidParameter(f"user {owner!r} is disabled")
            expires_at = now + expires_in if expires_in is not None else None
            token = _store.insert_token(
                s, user, name, hash_secret(secret), display_prefix(secret), now, expires_at, scope
            )
            self._audit.record(s, ctx, f"{ctx.target}/{token.id}")
            return token

        return IssuedToken(token=self._db.run(work), secret=secret)

    # ------------------------------------------------------------------ sign-in links
    def issue_sign_in_link(self, user: str, expires_in: timedelta = SIGN_IN_LINK_LIFETIME) -> str:
        """A one-time code that signs ``user`` into the web UI once, within ``expires_in``
        (what ``shamal server --quickstart`` prints for the admin, so a laptop's owner need
        not paste a token). Only its SHA-256 is stored. Audited with the server as actor.

        Raises:
            NotFound: no such user.
        """
        code = new_secret()
        now = self._clock()
        ctx = AuditContext(action="ui.sign_in_link", actor="server", target=f"user:{user}")

        def work(s: Session) -> None:
            account = _store.get_user(s, user)
            _store.insert_sign_in_link(s, account, hash_secret(code), now, now + expires_in)
            self._audit.record(s, ctx, ctx.target)

        self._db.run(work)
        return code

    def redeem_sign_in_link(self, code: str, session_lifetime: timedelta) -> IssuedToken:
        """Use a sign-in link's code, once: a new token of its user (named ``web-ui``,
        expiring with the session it opens), in the same transaction that marks the link
        used. Audited as the user's ``token.create``.

        Raises:
            Unauthenticated: no such code, expired, used before, or the user is disabled.
        """
        now = self._clock()
        secret = new_secret()
        refused = Unauthenticated(
            "this sign-in link was used already or has expired: sign in with a token "
            "(the admin's is in SHAMAL_HOME/token), or restart with --quickstart for a new link"
        )

        def work(s: Session) -> ApiToken:
            name = _store.use_sign_in_link(s, hash_secret(code), now)
            if name is None:
                raise refused
            user = _store.get_user(s, name)
            if user.disabled:
                raise refused
            token = _store.insert_token(
                s,
                user,
                "web-ui",
                hash_secret(secret),
                display_prefix(secret),
                now,
                now + session_lifetime,
            )
            ctx = AuditContext(
                action="token.create", actor=name, target=f"user:{name}/token:web-ui"
            )
            self._audit.record(s, ctx, f"{ctx.target}/{token.id}")
            return token

        return IssuedToken(token=self._db.run(work), secret=secret)

    def list_tokens(self, principal: Principal, all_users: bool = False) -> list[ApiToken]:
        if all_users:
            principal.require_admin()
        with self._db.unit_of_work(write=False) as s:
            return _store.list_tokens(s, None if all_users else principal.name)

    def revoke_token(self, ctx: AuditContext, token_id: str) -> ApiToken:
        """Revoke one of the caller's tokens (admins: anybody's). Idempotent."""
        principal = ctx.require_principal()
        principal.require_own_token("revoke tokens")
        ctx.target = f"token:{token_id}"

        def work(s: Session) -> ApiToken:
            token = _store.get_token(s, token_id)
            if token.user_name != principal.name and not principal.user.is_admin:
                # Other people's tokens do not exist, as far as this caller can tell.
                raise NotFound(f"token {token_id!r} does not exist")
            _store.revoke_token(s, token_id, self._clock())
            self._audit.record(s, ctx, f"user:{token.user_name}/token:{token_id}")
            return _store.get_token(s, token_id)

        try:
            return self._db.run(work)
        finally:
            self.forget_principals()
