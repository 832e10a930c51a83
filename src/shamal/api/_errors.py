"""Pieces every domain's HTTP API shares: the error body and the documented statuses."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorBody(BaseModel):
    """Every error answer: a stable code to switch on and a message for people."""

    error_code: str = Field(examples=["RESOURCE_DOES_NOT_EXIST"])
    message: str


def _doc(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


#: Statuses any authenticated route may answer besides its success status.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _doc("Invalid parameter (INVALID_PARAMETER_VALUE)"),
    401: _doc("Missing or invalid bearer token (UNAUTHENTICATED)"),
    403: _doc("The caller's role does not allow this (PERMISSION_DENIED)"),
    404: _doc("No such object, or not visible to the caller (RESOURCE_DOES_NOT_EXIST)"),
    409: _doc("Conflicts with existing state (RESOURCE_ALREADY_EXISTS, INVALID_STATE)"),
    413: _doc("Request body too large (REQUEST_TOO_LARGE)"),
    429: _doc("Too many requests (REQUEST_LIMIT_EXCEEDED)"),
    503: _doc("Temporarily unavailable (TEMPORARILY_UNAVAILABLE)"),
}


#: The OpenAPI ``openapi_extra`` of a route whose body is a raw file streamed to disk.
BINARY_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
