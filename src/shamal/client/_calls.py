"""What a group of client calls needs from :class:`shamal.client.ShamalClient`.

Each group of calls (models for ``shamal optimize``, deployments for ``shamal deploy``) is a
mixin in its own module, so the client stays one class without one module growing without end.
"""

from __future__ import annotations

from typing import Any

import httpx

from shamal.errors import error_for_code

#: Bytes per read or write when files stream to or from the server.
CHUNK = 1024 * 1024
#: The answer header of a list page that stops before the end: the next page's token.
NEXT_PAGE_HEADER = "X-Shamal-Next-Page-Token"


def raise_for(response: httpx.Response) -> None:
    """Raise the :class:`shamal.errors.ShamalError` a failed answer carries (its body is read
    first when it was streamed); nothing for a success."""
    if response.is_success:
        return
    response.read()
    try:
        body = response.json()
        code, message = str(body["error_code"]), str(body["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "INTERNAL_ERROR", f"HTTP {response.status_code} from the server"
    raise error_for_code(code, message)


class ClientCalls:
    """Base of the call groups: they reach the server only through :meth:`request` and ``_http``."""

    _http: httpx.Client
    url: str

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send one request and decode the answer; implemented by ``ShamalClient``."""
        raise NotImplementedError

    def list_pages(
        self, path: str, params: dict[str, Any] | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a native list, page after page; implemented by ``ShamalClient``."""
        raise NotImplementedError
