"""The one exception hierarchy of Shamal.

Every error a caller can see is a :class:`ShamalError` subclass carrying an HTTP
status and a stable, machine-readable ``code``. The codes follow the MLflow REST
dialect (``INVALID_PARAMETER_VALUE``, ``RESOURCE_DOES_NOT_EXIST`` ...) so that the
same error path serves the native API and the MLflow-compatible one.

Messages are written for the caller: they never contain stack traces, SQL,
filesystem paths of the server or secrets. Anything else that escapes a handler
becomes a generic :class:`InternalError` whose detail stays in the server log.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AlreadyExists",
    "Conflict",
    "EndpointNotFound",
    "IntegrityCheckFailed",
    "InternalError",
    "InvalidParameter",
    "NotFound",
    "NotImplementedFeature",
    "PayloadTooLarge",
    "PermissionDenied",
    "ServiceUnavailable",
    "ShamalError",
    "TooManyRequests",
    "Unauthenticated",
    "error_for_code",
]


class ShamalError(Exception):
    """Root of every error Shamal raises on purpose.

    Attributes:
        status: the HTTP status the server answers with.
        code: a stable error code; clients switch on it, never on the message.
        message: a human-readable explanation that is safe to show to the caller.
    """

    status: ClassVar[int] = 500
    code: ClassVar[str] = "INTERNAL_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_body(self) -> dict[str, str]:
        """The JSON body sent to the caller."""
        return {"error_code": self.code, "message": self.message}


class InvalidParameter(ShamalError):
    """A request parameter is malformed, out of range or hostile."""

    status = 400
    code = "INVALID_PARAMETER_VALUE"


class Unauthenticated(ShamalError):
    """No valid credentials: missing, malformed, expired or revoked token."""

    status = 401
    code = "UNAUTHENTICATED"


class PermissionDenied(ShamalError):
    """Authenticated, but the principal's role does not allow the action."""

    status = 403
    code = "PERMISSION_DENIED"


class NotFound(ShamalError):
    """The object does not exist, or the caller may not know that it exists."""

    status = 404
    code = "RESOURCE_DOES_NOT_EXIST"


class EndpointNotFound(ShamalError):
    """No route matches the request."""

    status = 404
    code = "ENDPOINT_NOT_FOUND"


class AlreadyExists(ShamalError):
    """An object with the same unique key exists already."""

    status = 409
    code = "RESOURCE_ALREADY_EXISTS"


class Conflict(ShamalError):
    """The object is in a state that does not allow the operation."""

    status = 409
    code = "INVALID_STATE"


class PayloadTooLarge(ShamalError):
    """The request body exceeds the configured limit."""

    status = 413
    code = "REQUEST_TOO_LARGE"


class NotImplementedFeature(ShamalError):
    """The feature exists in the protocol but this server does not offer it."""

    status = 501
    code = "NOT_IMPLEMENTED"


class TooManyRequests(ShamalError):
    """A rate limit or a bounded queue is full; retry later.

    Attributes:
        retry_after_s: seconds after which a retry may succeed (sent as ``Retry-After``), or
            None when the server has no estimate.
    """

    status = 429
    code = "REQUEST_LIMIT_EXCEEDED"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServiceUnavailable(ShamalError):
    """The service is starting, draining or a backend is unreachable.

    Attributes:
        retry_after_s: seconds after which a retry may succeed (sent as ``Retry-After``), or
            None when the server has no estimate.
    """

    status = 503
    code = "TEMPORARILY_UNAVAILABLE"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class IntegrityCheckFailed(ShamalError):
    """Stored data failed verification (hash mismatch, failed authentication tag)."""

    status = 500
    code = "DATA_INTEGRITY_ERROR"


class InternalError(ShamalError):
    """An unexpected failure; the detail is logged server-side only."""

    status = 500
    code = "INTERNAL_ERROR"


_BY_CODE: dict[str, type[ShamalError]] = {
    cls.code: cls
    for cls in (
        InvalidParameter,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        EndpointNotFound,
        AlreadyExists,
        Conflict,
        PayloadTooLarge,
        NotImplementedFeature,
        TooManyRequests,
        ServiceUnavailable,
        IntegrityCheckFailed,
        InternalError,
    )
}


def error_for_code(code: str, message: str) -> ShamalError:
    """Rebuild the exception a server sent, for the client side.

    Unknown codes become :class:`ShamalError` with the code kept in the message.
    """
    cls = _BY_CODE.get(code)
    if cls is None:
        return ShamalError(f"{code}: {message}")
    return cls(message)
