"""HTTP API of the artifact store: streaming upload and download of a team's files."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, status
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from shamal.api import (
    BINARY_BODY,
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
from shamal.artifacts._service import ArtifactService
from shamal.artifacts._streaming import consume_body, download_headers, download_slot
from shamal.security import NAME_PATTERN, AuditContext
from shamal.security.api import CurrentPrincipal, ReadAudit, audited, audited_read


def get_artifacts(request: Request) -> ArtifactService:
    service: ArtifactService = request.app.state.artifacts
    return service


Artifacts = Annotated[ArtifactService, Depends(get_artifacts)]
Team = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64)]
# Any string reaches the one path validator, which decides (400 for hostile paths).
FilePath = Annotated[str, Path(min_length=1, max_length=8192)]


class ArtifactOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    path: str
    digest: str
    size: int
    created_at: datetime
    created_by: str


#: A download holds one of the caller's ``max_downloads_per_principal`` slots until its
#: last byte is sent (429 beyond).
DOWNLOAD_SLOT = [Depends(download_slot, scope="request")]

router = APIRouter(prefix="/api/v1/artifacts", tags=["artifacts"], responses=ERROR_RESPONSES)


def _artifact_cursor(found: ArtifactOut) -> str:
    return encode_cursor(found.path)


@router.get(
    "/{team}",
    summary="List a team's artifacts by path (viewer; a page stops early past max_page_bytes)",
    response_model=list[ArtifactOut],
)
def list_artifacts(
    team: Team,
    svc: Artifacts,
    principal: CurrentPrincipal,
    page_bytes: PageBytes,
    prefix: Annotated[str, Query(max_length=1024)] = "",
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    page_token: PageToken = None,
) -> Response:
    def fetch(count: int, token: str | None) -> ListPage[ArtifactOut]:
        after = decode_cursor(token, str)
        found = svc.list(principal, team, prefix, count, None if after is None else after[0])
        return keyset_page([ArtifactOut.model_validate(f) for f in found], count, _artifact_cursor)

    return bounded_list(
        fetch,
        model_json,
        max_results=limit,
        page_token=page_token,
        max_bytes=page_bytes,
        cursor_of=_artifact_cursor,
    )


@router.put(
    "/{team}/{path:path}",
    status_code=status.HTTP_201_CREATED,
    summary="Upload a file (member); the body is streamed, never buffered whole",
    openapi_extra=BINARY_BODY,
)
async def put_artifact(
    team: Team,
    path: FilePath,
    request: Request,
    svc: Artifacts,
    ctx: Annotated[AuditContext, Depends(audited("artifact.put"))],
) -> ArtifactOut:
    stored = await consume_body(request, lambda chunks: svc.put(ctx, team, path, chunks))
    return ArtifactOut.model_validate(stored)


@router.get(
    "/{team}/{path:path}",
    summary="Download a file (viewer); verified against its sha256 as it streams",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
    dependencies=DOWNLOAD_SLOT,
)
def get_artifact(
    team: Team,
    path: FilePath,
    svc: Artifacts,
    principal: CurrentPrincipal,
    reads: Annotated[ReadAudit, Depends(audited_read("artifact.read"))],
) -> StreamingResponse:
    found, data = svc.open(principal, team, path)
    reads.granted(f"artifact:{team}/{found.path}", digest=found.digest, size=found.size)
    return StreamingResponse(
        data, media_type="application/octet-stream", headers=download_headers(found)
    )


@router.delete(
    "/{team}/{path:path}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete a file (maintainer)",
)
def delete_artifact(
    team: Team,
    path: FilePath,
    svc: Artifacts,
    ctx: Annotated[AuditContext, Depends(audited("artifact.delete"))],
) -> None:
    svc.delete(ctx, team, path)
