"""What a group of client calls needs from :class:`shamal.client.ShamalClient`.

Each group of calls (models for ``shamal optimize``, deployments for ``shamal deploy``) is a
mixin in its own module, so the client stays one class without one module growing without end.
"""

from __future__ import annotations

from typing import Any

import httpx


class ClientCalls:
    """Base of the call groups: they reach the server only through :meth:`request` and ``_http``."""

    _http: httpx.Client
    url: str

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send one request and decode the answer; implemented by ``ShamalClient``."""
        raise NotImplementedError
