"""How the server picks the model version that answers a request.

The OIP server asks a :class:`TrafficRouter` which version of a model answers a request that does
not name one, tells it how each call went, and hands it a sample of what went in and out. The
default router serves the newest loaded version; a deployment's router
(:mod:`shamal.serving._deployment`) splits traffic by weight (A/B, canary), mirrors to shadows and
reports to the control plane.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shamal.errors import NotFound


@dataclass(frozen=True)
class RouteChoice:
    """Where one request goes.

    Attributes:
        version: the version whose answer is returned to the caller.
        shadows: versions that get a copy of the request; their answers are recorded and never
            returned.
    """

    version: str
    shadows: tuple[str, ...] = ()


class TrafficRouter(Protocol):
    """Chooses versions and hears how they did. Thread-safe; must never block for long.

    ``choose`` runs on the request path: it may read only in-memory state (no I/O).
    ``observe`` and ``sample`` only record; shipping records anywhere happens off the request path.
    """

    def choose(self, model: str, headers: Mapping[str, str]) -> RouteChoice:
        """The version for a request to ``model`` that named none.

        Args:
            model: the model name in the request path.
            headers: request headers (HTTP) or metadata (gRPC), names lower-cased; a router
                that keeps callers sticky reads its request key from here.

        Raises:
            NotFound: the router knows no version of ``model``.
        """
        ...

    def observe(
        self, model: str, version: str, *, latency_s: float, ok: bool, shadow: bool
    ) -> None:
        """One finished call: its latency and whether it succeeded (client errors count as ok)."""
        ...

    def sample(
        self,
        model: str,
        version: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
        request_id: str | None = None,
    ) -> None:
        """Offer one request's inputs and outputs (and the caller's request id, which labels
        posted later name) for monitoring; the router keeps a sample."""
        ...


class LatestVersionRouter:
    """Without a deployment: every request goes to the highest version loaded for its model."""

    def __init__(self, versions: Mapping[str, Sequence[str]]) -> None:
        self._latest = {model: max(found, key=_version_order) for model, found in versions.items()}

    def choose(self, model: str, headers: Mapping[str, str]) -> RouteChoice:
        try:
            return RouteChoice(self._latest[model])
        except KeyError:
            raise NotFound(f"Model '{model}' is not served here.") from None

    def observe(
        self, model: str, version: str, *, latency_s: float, ok: bool, shadow: bool
    ) -> None:
        """Nothing to do: the server's own metrics count calls."""

    def sample(
        self,
        model: str,
        version: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
        request_id: str | None = None,
    ) -> None:
        """Nothing to do: without a deployment there is no monitor to feed."""


def _version_order(version: str) -> tuple[int, str]:
    """Numeric versions by number, others after them by name."""
    return (int(version), "") if version.isdigit() else (1 << 62, version)
