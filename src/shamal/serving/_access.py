"""Who may call `shamal serve`: the Host allow-list and bearer tokens.

The probes (``/v2/health/live``, ``/v2/health/ready``, ``/metrics``; gRPC ``ServerLive`` and
``ServerReady``) stay open, as orchestrators call them without credentials. Every other route
(inference, server and model metadata, model readiness) asks the :class:`Access` in force:

* :class:`OpenAccess`: anyone (a standalone server on a laptop's loopback).
* :class:`StaticToken`: one shared secret (``shamal serve --auth`` without a platform).
* :class:`PlatformAccess`: the caller's own Shamal token, checked by asking the control plane
  whether it may read the deployment (or registered model) served. Positive answers are kept
  for ``ttl_s``; a revoked token works at most that long. Refusals are not kept.

The ``Host`` check (the control plane's, see ``shamal.server``) keeps a page in a browser from
reaching a loopback server through DNS rebinding.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol
from urllib.parse import quote

import httpx

from shamal.errors import PermissionDenied, ServiceUnavailable, Unauthenticated

__all__ = [
    "Access",
    "OpenAccess",
    "PlatformAccess",
    "StaticToken",
    "bearer_token",
    "host_allowed",
    "loopback_hosts",
]

logger = logging.getLogger(__name__)

_MAX_TOKEN = 512
_CACHE_MAX = 10_000


def loopback_hosts(bound: str) -> frozenset[str]:
    """The names a server bound to ``bound`` answers to by default (as the control plane)."""
    return frozenset({"localhost", "127.0.0.1", "::1", "[::1]", bound.lower()})


def host_allowed(raw: str | None, allowed: frozenset[str] | None) -> bool:
    """Whether a ``Host`` header names this server (``allowed`` None: any name)."""
    if allowed is None:
        return True
    if raw is None:
        return False
    host = raw.strip().lower()
    if host.startswith("["):
        host = host[: host.find("]") + 1]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host in allowed


def bearer_token(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value, None when absent or malformed."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN:
        return None
    if not token.isascii() or not token.isprintable() or " " in token:
        return None
    return token


class Access(Protocol):
    """Decides whether a caller holding ``token`` may use ``model`` (None: the server itself).

    ``check`` raises :class:`Unauthenticated` (no or bad token), :class:`PermissionDenied` (a
    good token without access) or :class:`ServiceUnavailable` (the decision could not be made);
    it never lets a call through on doubt.
    """

    async def check(self, token: str | None, model: str | None) -> None: ...

    async def close(self) -> None: ...


class OpenAccess:
    """Everyone may call."""

    async def check(self, token: str | None, model: str | None) -> None:
        return None

    async def close(self) -> None:
        return None


class StaticToken:
    """One shared secret, compared in constant time."""

    def __init__(self, secret: str) -> None:
        self._digest = hashlib.sha256(secret.encode()).digest()

    async def check(self, token: str | None, model: str | None) -> None:
        if token is None:
            raise Unauthenticated("This server needs 'Authorization: Bearer <token>'.")
        given = hashlib.sha256(token.encode()).digest()
        if not hmac.compare_digest(given, self._digest):
            raise Unauthenticated("The bearer token is not valid here.")

    async def close(self) -> None:
        return None


class PlatformAccess:
    """The caller's Shamal token, checked against the control plane.

    Args:
        url: the control plane's base URL.
        resources: served name -> the API path (under ``url``) whose GET answers 200 to a
            token that may use it (a deployment's or a registered model's).
        ttl_s: how long a positive answer is kept.
        transport: an httpx transport (tests).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        url: str,
        resources: Mapping[str, str],
        *,
        ttl_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resources = dict(resources)
        self._ttl_s = ttl_s
        self._clock = clock
        self._allowed: dict[tuple[bytes, str], float] = {}
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=10.0, transport=transport)

    async def check(self, token: str | None, model: str | None) -> None:
        if token is None:
            raise Unauthenticated("This server needs 'Authorization: Bearer <your Shamal token>'.")
        # A name not served here is checked against everything served: the caller learns
        # that it is unknown (404) only with a token good for this server.
        paths: Iterable[str] = (
            [self._resources[model]] if model in self._resources else self._resources.values()
        )
        key = hashlib.sha256(token.encode()).digest()
        denied = False
        for path in paths:
            if await self._may_read(key, token, path):
                return
            denied = True
        if denied:
            raise PermissionDenied("This token may not use this model.")
        raise PermissionDenied("Nothing is served here.")

    async def _may_read(self, key: bytes, token: str, path: str) -> bool:
        now = self._clock()
        until = self._allowed.get((key, path))
        if until is not None and now < until:
            return True
        try:
            answer = await self._http.get(path, headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            logger.warning(
                "The control plane did not answer a token check (%s)", type(exc).__name__
            )
            raise ServiceUnavailable("Cannot check the token now; try again.") from None
        if answer.status_code == 401:
            raise Unauthenticated("The bearer token is not valid.")
        if answer.status_code in (403, 404):
            return False
        if answer.status_code != 200:
            logger.warning("The control plane answered a token check with %s", answer.status_code)
            raise ServiceUnavailable("Cannot check the token now; try again.")
        if len(self._allowed) >= _CACHE_MAX:
            self._allowed.clear()
        self._allowed[(key, path)] = now + self._ttl_s
        return True

    async def close(self) -> None:
        await self._http.aclose()


def deployment_path(name: str) -> str:
    """The API path a token must read to use the deployment ``name``."""
    return f"/api/v1/deployments/{quote(name, safe='')}"


def registered_model_path(name: str) -> str:
    """The API path a token must read to use a version of the registered model ``name``."""
    return f"/api/2.0/mlflow/registered-models/get?name={quote(name, safe='')}"
