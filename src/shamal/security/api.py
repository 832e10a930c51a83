"""HTTP API of the security domain, and the auth and audit dependencies every router uses.

Every route of every domain depends on :func:`require_principal` (the route
inventory test enforces it), and every state-changing route on :func:`audited`.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Self, TypeVar, cast

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from shamal.api import (
    ERROR_RESPONSES,
    ListPage,
    PageBytes,
    PageToken,
    bounded_list,
    decode_cursor,
    encode_cursor,
    keyset_page,
    model_json,
)
from shamal.errors import InvalidParameter, PermissionDenied, ShamalError, Unauthenticated
from shamal.security._audit import AuditContext, AuditLog
from shamal.security._entities import (
    AccountKind,
    Invitation,
    Principal,
    Role,
)
from shamal.security._service import NAME_PATTERN, SecurityService
from shamal.security._watch import AuditWatch

logger = logging.getLogger(__name__)

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ShamalToken",
    description="An API token, sent as `Authorization: Bearer shm_...`",
)
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_security(request: Request) -> SecurityService:
    service: SecurityService = request.app.state.security
    return service


def get_audit_log(request: Request) -> AuditLog:
    audit: AuditLog = request.app.state.audit
    return audit


def get_audit_watch(request: Request) -> AuditWatch:
    watch: AuditWatch = request.app.state.audit_watch
    return watch


async def require_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Authenticate the caller from its bearer token.

    A token this process resolved within the principal cache's lifetime is answered on
    the event loop; anything else (a database lookup, an audit write) runs in a worker
    thread.

    Raises:
        Unauthenticated: no token, or a token that is malformed, unknown,
            expired or revoked. Rejected state-changing calls are audited.
    """
    principal = None
    if credentials is not None and credentials.credentials:
        principal = get_security(request).cached_principal(credentials.credentials)
    if principal is None:
        principal = await run_in_threadpool(_authenticate, request, credentials)
    if principal.deployment is not None:
        _within_deployment(request, principal.deployment)
    request.state.principal = principal
    return principal


_DEPLOYMENT_READ = "/api/v1/deployments/{name}"


def _within_deployment(request: Request, deployment: str) -> None:
    """A deployment token reads its own deployment (what ``shamal serve`` asks the control
    plane before it lets the caller in) and says whose it is; nothing else.

    Raises:
        PermissionDenied: any other call.
    """
    route = getattr(request.scope.get("route"), "path", "")
    if request.method in _SAFE_METHODS and (
        route == "/api/v1/whoami"
        or (route == _DEPLOYMENT_READ and request.path_params.get("name") == deployment)
    ):
        return
    raise PermissionDenied(
        f"this token may only call the models of deployment {deployment!r}; use your own token"
    )


def _authenticate(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    try:
        if credentials is None or not credentials.credentials:
            raise Unauthenticated(
                "this endpoint needs a bearer token: send 'Authorization: Bearer <token>'"
            )
        principal = get_security(request).authenticate(credentials.credentials)
    except Unauthenticated:
        if request.method not in _SAFE_METHODS:
            route = request.scope.get("route")
            target = getattr(route, "path", "") or "unrouted"
            ctx = AuditContext(
                action=f"auth.{request.method.lower()}", actor="anonymous", target=target
            )
            get_audit_log(request).record_outcome(ctx, "unauthenticated")
        raise
    return principal


CurrentPrincipal = Annotated[Principal, Depends(require_principal)]


def audited(action: str) -> Callable[..., Iterator[AuditContext]]:
    """A dependency that audits one state-changing call named ``action``.

    Services record success inside their own transaction; whatever they did not
    record (rejections, failures) is recorded here with the error code as outcome.
    """

    def dependency(request: Request, principal: CurrentPrincipal) -> Iterator[AuditContext]:
        ctx = AuditContext(action=action, actor=principal.name, principal=principal)
        audit = get_audit_log(request)
        try:
            yield ctx
        except ShamalError as exc:
            if not ctx.recorded:
                audit.record_outcome(ctx, exc.code.lower())
            raise
        except RequestValidationError:
            if not ctx.recorded:
                audit.record_outcome(ctx, InvalidParameter.code.lower())
            raise
        except Exception:
            if not ctx.recorded:
                audit.record_outcome(ctx, "internal_error")
            raise
        if not ctx.recorded:
            logger.warning("action %s finished without an audit record; recording it", action)
            audit.record_outcome(ctx, "ok")

    dependency.shamal_audit_action = action  # type: ignore[attr-defined]
    return dependency


class ReadAudit:
    """Records reads of sensitive objects (artifact and model downloads) in the audit log,
    where the operator turned it on (``SHAMAL_AUDIT_READS=true``); off, it records nothing.

    A route calls :meth:`granted` once access is decided and before the bytes stream, so the
    entry exists even when the client stops reading halfway; a refusal (404, 403, 400) is
    recorded by the dependency with the error code as outcome.
    """

    def __init__(self, audit: AuditLog | None, ctx: AuditContext) -> None:
        self._audit = audit
        self.ctx = ctx

    @property
    def enabled(self) -> bool:
        return self._audit is not None

    def granted(self, target: str, **detail: Any) -> None:
        if self._audit is None:
            return
        self.ctx.target = target
        self.ctx.detail.update(detail)
        self._audit.record_outcome(self.ctx, "ok")


def audited_read(action: str) -> Callable[..., Iterator[ReadAudit]]:
    """A dependency that audits a read named ``action`` (e.g. ``artifact.read``) when
    ``Settings.audit_reads`` is on; see :class:`ReadAudit`."""

    def dependency(request: Request, principal: CurrentPrincipal) -> Iterator[ReadAudit]:
        ctx = AuditContext(action=action, actor=principal.name, principal=principal)
        enabled = bool(getattr(request.app.state.settings, "audit_reads", False))
        audit = get_audit_log(request) if enabled else None
        try:
            yield ReadAudit(audit, ctx)
        except ShamalError as exc:
            if audit is not None and not ctx.recorded:
                ctx.target = ctx.target or request.url.path
                audit.record_outcome(ctx, exc.code.lower())
            raise

    return dependency


async def data_plane_write(principal: CurrentPrincipal) -> Principal:
    """Marks a high-volume write into an object whose creation was audited (metrics, params,
    tags logged to a run). Authenticated like everything else, but not one audit entry per
    call: that would serialize every logger on the audit chain's head. The route inventory
    accepts a mutating route without :func:`audited` only with this marker. (``async``, as
    the marker below: FastAPI runs a plain-def dependency in a worker thread.)"""
    return principal


data_plane_write.shamal_data_plane = True  # type: ignore[attr-defined]


async def read_only_post(principal: CurrentPrincipal) -> Principal:
    """Marks a POST that changes nothing (searches sent with a body, as MLflow does)."""
    return principal


read_only_post.shamal_read_only = True  # type: ignore[attr-defined]


def audit_exemption_of(dependency: Callable[..., Any]) -> str | None:
    """'data-plane' or 'read-only' for the two markers above, else None."""
    if getattr(dependency, "shamal_data_plane", False):
        return "data-plane"
    if getattr(dependency, "shamal_read_only", False):
        return "read-only"
    return None


def audit_action_of(dependency: Callable[..., Any]) -> str | None:
    """The action a dependency made by :func:`audited` records, else None."""
    return getattr(dependency, "shamal_audit_action", None)


# ---------------------------------------------------------------------- schemas
Name = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64)]
TokenId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]
RoleName = Literal["admin", "maintainer", "member", "viewer"]


class _Model(BaseModel):
    """Request bodies reject unknown keys; responses are read off the domain's frozen values."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    @classmethod
    def of(cls, value: object) -> Self:
        return cls.model_validate(value, from_attributes=True)


class UserOut(_Model):
    name: str
    kind: Literal["user", "service"]
    is_admin: bool
    disabled: bool
    created_at: datetime
    privacy_officer: bool = Field(
        default=False, description="holds the privacy-officer grant (reveals pseudonyms)"
    )


class UserIn(_Model):
    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    kind: Literal["user", "service"] = "user"
    is_admin: bool = False


class WhoAmI(_Model):
    user: UserOut
    teams: dict[str, RoleName]
    scope: str = Field(default="full", description="the token's: full, or job (a job's own)")


class TeamIn(_Model):
    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    description: str = Field(default="", max_length=512)


class MemberOut(_Model):
    user: str
    role: RoleName
    status: Literal["member", "invited"] = Field(
        default="member",
        description="invited: the account joins when it accepts (a team admin's addition)",
    )


class InvitationOut(_Model):
    team: str
    role: RoleName
    invited_by: str
    created_at: datetime


class TeamOut(_Model):
    name: str
    description: str
    created_at: datetime
    members: list[MemberOut] | None = None


class MemberIn(_Model):
    role: RoleName


class TokenIn(_Model):
    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    expires_in_s: int | None = Field(default=None, ge=1, le=366 * 86400)
    user: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        max_length=64,
        description="Issue for another account (admins only)",
    )


class TokenOut(_Model):
    id: str
    user: str = Field(validation_alias=AliasChoices("user_name", "user"))
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    scope: str = Field(
        default="full",
        description="full: an account's own; job: issued to one job attempt; "
        "deployment:<name>: may call that deployment's models and nothing else",
    )


class IssuedTokenOut(TokenOut):
    secret: str = Field(description="Shown once; store it now.")


class AuditEntryOut(_Model):
    seq: int
    ts: datetime
    actor: str
    action: str
    target: str
    outcome: str
    detail: dict[str, Any]
    hash: str


class ChainReportOut(_Model):
    ok: bool
    entries_checked: int
    first_broken_seq: int | None
    reason: str
    head_seq: int
    head_hash: str


# ---------------------------------------------------------------------- routes
#: The most items one page of a list of accounts, teams, invitations or tokens holds.
LIST_MAX = 10_000
LIST_DEFAULT = 1000
ListLimit = Annotated[int, Query(ge=1, le=LIST_MAX)]
M = TypeVar("M", bound=BaseModel)


def _listed(
    items: list[M],
    key: Callable[[M], tuple[str, ...]],
    limit: int,
    page_token: str | None,
    page_bytes: int,
) -> Response:
    """A bounded list (see :func:`bounded_list`) of ``items`` read whole: these tables hold
    a row per account, team or token, so it is the answer that needs bounding, not the read.
    Pages follow ``key`` order; a token holds the key of the last item its page held."""
    ordered = sorted(items, key=key)
    arity = len(key(ordered[0])) if ordered else 1

    def cursor_of(item: M) -> str:
        return encode_cursor(*key(item))

    def fetch(count: int, token: str | None) -> ListPage[M]:
        after = decode_cursor(token, *([str] * arity))
        start = 0 if after is None else bisect.bisect_right(ordered, after, key=key)
        return keyset_page(ordered[start : start + count], count, cursor_of)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=cursor_of,
    )


router = APIRouter(prefix="/api/v1", responses=ERROR_RESPONSES)
Security = Annotated[SecurityService, Depends(get_security)]
Audit = Annotated[AuditLog, Depends(get_audit_log)]
Watch = Annotated[AuditWatch, Depends(get_audit_watch)]


@router.get("/whoami", tags=["security"], summary="Who the token belongs to")
def whoami(principal: CurrentPrincipal) -> WhoAmI:
    teams: dict[str, Any] = {t: r.label for t, r in principal.roles.items()}
    return WhoAmI(user=UserOut.of(principal.user), teams=teams, scope=principal.scope)


@router.post(
    "/users",
    status_code=status.HTTP_201_CREATED,
    tags=["security"],
    summary="Create a user or service account (platform admin)",
)
def create_user(
    body: UserIn, svc: Security, ctx: Annotated[AuditContext, Depends(audited("user.create"))]
) -> UserOut:
    return UserOut.of(svc.create_user(ctx, body.name, AccountKind(body.kind), body.is_admin))


@router.get(
    "/users",
    tags=["security"],
    summary="List accounts by name (platform admin; a page stops early past max_page_bytes)",
    response_model=list[UserOut],
)
def list_users(
    svc: Security,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: ListLimit = LIST_DEFAULT,
    page_token: PageToken = None,
) -> Response:
    users = [UserOut.of(u) for u in svc.list_users(principal)]
    return _listed(users, lambda u: (u.name,), limit, page_token, page_bytes)


@router.post(
    "/users/{name}/disable",
    tags=["security"],
    summary="Disable an account: its tokens stop working (platform admin)",
)
def disable_user(
    name: Name, svc: Security, ctx: Annotated[AuditContext, Depends(audited("user.disable"))]
) -> UserOut:
    return UserOut.of(svc.set_user_disabled(ctx, name, True))


@router.post("/users/{name}/enable", tags=["security"], summary="Enable an account again")
def enable_user(
    name: Name, svc: Security, ctx: Annotated[AuditContext, Depends(audited("user.enable"))]
) -> UserOut:
    return UserOut.of(svc.set_user_disabled(ctx, name, False))


Grant = Annotated[Literal["privacy-officer"], Path(description="a platform-level grant")]


@router.put(
    "/users/{name}/grants/{grant}",
    tags=["security"],
    summary="Give an account a platform-level grant, e.g. privacy-officer (platform admin)",
)
def grant_user(
    name: Name,
    grant: Grant,
    svc: Security,
    ctx: Annotated[AuditContext, Depends(audited("user.grant"))],
) -> UserOut:
    return UserOut.of(svc.set_privacy_officer(ctx, name, True))


@router.delete(
    "/users/{name}/grants/{grant}",
    tags=["security"],
    summary="Take a platform-level grant back (platform admin)",
)
def revoke_grant(
    name: Name,
    grant: Grant,
    svc: Security,
    ctx: Annotated[AuditContext, Depends(audited("user.grant.revoke"))],
) -> UserOut:
    return UserOut.of(svc.set_privacy_officer(ctx, name, False))


@router.post(
    "/teams",
    status_code=status.HTTP_201_CREATED,
    tags=["teams"],
    summary="Create a team (platform admin)",
)
def create_team(
    body: TeamIn, svc: Security, ctx: Annotated[AuditContext, Depends(audited("team.create"))]
) -> TeamOut:
    return TeamOut.of(svc.create_team(ctx, body.name, body.description))


@router.get(
    "/teams",
    tags=["teams"],
    summary="List the teams visible to the caller by name (a page stops early past max_page_bytes)",
    response_model=list[TeamOut],
)
def list_teams(
    svc: Security,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: ListLimit = LIST_DEFAULT,
    page_token: PageToken = None,
) -> Response:
    teams = [TeamOut.of(t) for t in svc.list_teams(principal)]
    return _listed(teams, lambda t: (t.name,), limit, page_token, page_bytes)


@router.get("/teams/{team}", tags=["teams"], summary="A team and its members")
def get_team(team: Name, svc: Security, principal: CurrentPrincipal) -> TeamOut:
    detail = svc.get_team(principal, team)
    team_out = TeamOut.of(detail.team)
    team_out.members = [MemberOut(user=m.user, role=m.role.label) for m in detail.members]
    return team_out


@router.delete(
    "/teams/{team}",
    status_code=status.HTTP_204_NO_CONTENT,
    tags=["teams"],
    summary="Delete a team (platform admin)",
)
def delete_team(
    team: Name, svc: Security, ctx: Annotated[AuditContext, Depends(audited("team.delete"))]
) -> None:
    svc.delete_team(ctx, team)


@router.put(
    "/teams/{team}/members/{user}",
    tags=["teams"],
    summary="Add a member or change their role (team admin)",
)
def set_member(
    team: Name,
    user: Name,
    body: MemberIn,
    svc: Security,
    ctx: Annotated[AuditContext, Depends(audited("team.member.set"))],
    response: Response,
) -> MemberOut:
    done = svc.set_member(ctx, team, user, Role.parse(body.role))
    if isinstance(done, Invitation):
        response.status_code = status.HTTP_202_ACCEPTED
        return MemberOut(user=done.user, role=body.role, status="invited")
    return MemberOut(user=done.user, role=body.role)


@router.get(
    "/invitations",
    tags=["teams"],
    summary="Your invitations to teams, waiting for your answer, by team (a page stops "
    "early past max_page_bytes)",
    response_model=list[InvitationOut],
)
def list_invitations(
    svc: Security,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: ListLimit = LIST_DEFAULT,
    page_token: PageToken = None,
) -> Response:
    invitations = [
        InvitationOut(
            team=i.team,
            role=cast(RoleName, i.role.label),
            invited_by=i.invited_by,
            created_at=i.created_at,
        )  # fmt: skip
        for i in svc.invitations(principal)
    ]
    return _listed(invitations, lambda i: (i.team,), limit, page_token, page_bytes)


@router.post(
    "/invitations/{team}/accept",
    tags=["teams"],
    summary="Accept an invitation: join the team with the role it offers",
)
def accept_invitation(
    team: Name,
    svc: Security,
    ctx: Annotated[AuditContext, Depends(audited("team.invitation.accept"))],
) -> MemberOut:
    membership = svc.accept_invitation(ctx, team)
    return MemberOut(user=membership.user, role=cast(RoleName, membership.role.label))


@router.delete(
    "/invitations/{team}",
    status_code=status.HTTP_204_NO_CONTENT,
    tags=["teams"],
    summary="Decline an invitation",
)
def decline_invitation(
    team: Name,
    svc: Security,
    ctx: Annotated[AuditContext, Depends(audited("team.invitation.decline"))],
) -> None:
    svc.decline_invitation(ctx, team)


@router.delete(
    "/teams/{team}/members/{user}",
    status_code=status.HTTP_204_NO_CONTENT,
    tags=["teams"],
    summary="Remove a member (team admin)",
)
def remove_member(
    team: Name,
    user: Name,
    svc: Security,
    ctx: Annotated[AuditContext, Depends(audited("team.member.remove"))],
) -> None:
    svc.remove_member(ctx, team, user)


@router.post(
    "/tokens",
    status_code=status.HTTP_201_CREATED,
    tags=["tokens"],
    summary="Issue an API token; the secret is shown once",
)
def create_token(
    body: TokenIn, svc: Security, ctx: Annotated[AuditContext, Depends(audited("token.create"))]
) -> IssuedTokenOut:
    expires = timedelta(seconds=body.expires_in_s) if body.expires_in_s else None
    issued = svc.create_token(ctx, body.name, expires, body.user)
    return IssuedTokenOut(**TokenOut.of(issued.token).model_dump(), secret=issued.secret)


@router.get(
    "/tokens",
    tags=["tokens"],
    summary="List your tokens (admins: everybody's), oldest first (a page stops early past "
    "max_page_bytes)",
    response_model=list[TokenOut],
)
def list_tokens(
    svc: Security,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    all_users: Annotated[bool, Query(alias="all")] = False,
    limit: ListLimit = LIST_DEFAULT,
    page_token: PageToken = None,
) -> Response:
    tokens = [TokenOut.of(t) for t in svc.list_tokens(principal, all_users)]
    return _listed(
        tokens, lambda t: (t.created_at.isoformat(), t.id), limit, page_token, page_bytes
    )


@router.delete("/tokens/{token_id}", tags=["tokens"], summary="Revoke a token")
def revoke_token(
    token_id: TokenId,
    svc: Security,
    ctx: Annotated[AuditContext, Depends(audited("token.revoke"))],
) -> TokenOut:
    return TokenOut.of(svc.revoke_token(ctx, token_id))


def _audit_cursor(entry: AuditEntryOut) -> str:
    return encode_cursor(entry.seq)


@router.get(
    "/audit",
    tags=["audit"],
    summary="Audit entries, newest first (platform admin; a page stops early past max_page_bytes)",
    response_model=list[AuditEntryOut],
)
def list_audit(
    audit: Audit,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    action: Annotated[str | None, Query(max_length=128)] = None,
    actor: Annotated[str | None, Query(max_length=128)] = None,
    page_token: PageToken = None,
) -> Response:
    principal.require_admin()

    def fetch(count: int, token: str | None) -> ListPage[AuditEntryOut]:
        after = decode_cursor(token, int)
        entries = audit.entries(
            limit=count,
            before=before if after is None else after[0],
            action=action,
            actor=actor,
        )
        return keyset_page([AuditEntryOut.of(e) for e in entries], count, _audit_cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=_audit_cursor,
    )


@router.get(
    "/audit/verify",
    tags=["audit"],
    summary="Verify the audit hash chain; reports the first broken link (platform admin)",
)
def verify_audit(
    watch: Watch,
    principal: CurrentPrincipal,
    witness: Annotated[
        str | None,
        Query(
            pattern=r"^[1-9][0-9]{0,17}:[0-9a-f]{64}$",
            description="`<head_seq>:<head_hash>` of an earlier report, kept outside the "
            "database: also catches a tail cut off together with a rewound head",
        ),
    ] = None,
) -> ChainReportOut:
    principal.require_admin()
    seen = None
    if witness:
        seq, _, digest = witness.partition(":")
        seen = (int(seq), digest)
    # The server's own witness (kept outside the database) is checked too.
    return ChainReportOut.of(watch.verify(seen))


class AuditStatusOut(_Model):
    checked: bool = Field(description="false until the server's first check")
    ok: bool | None = None
    checked_at: datetime | None = None
    report: ChainReportOut | None = None


@router.get(
    "/audit/status",
    tags=["audit"],
    summary="The server's last check of the audit chain against its own witness (platform admin)",
)
def audit_status(watch: Watch, principal: CurrentPrincipal) -> AuditStatusOut:
    principal.require_admin()
    last = watch.last()
    if last is None:
        return AuditStatusOut(checked=False)
    report = ChainReportOut.model_validate(last["report"])
    at = last.get("checked_at")
    when = None if at is None else datetime.fromtimestamp(float(at), UTC)
    return AuditStatusOut(checked=True, ok=bool(last["ok"]), checked_at=when, report=report)
