"""Client calls about lineage (``shamal lineage URI``).

The answer is the server's JSON (see ``shamal.lineage.api``): ``start`` (the URI of the node
the walk began at), ``nodes`` (``id``, ``kind``, ``label``, ``attributes``, ``redacted``),
``edges`` (``source`` -> ``target``, pointing downstream, with a ``relation``) and
``truncated``.
"""

from __future__ import annotations

from typing import Any

from shamal.client._calls import ClientCalls


class LineageCalls(ClientCalls):
    """Calls of the lineage API."""

    def lineage(
        self, uri: str, *, direction: str = "both", depth: int = 6, max_nodes: int = 200
    ) -> dict[str, Any]:
        """The lineage graph around ``uri`` (``data:/NAME/N``, ``runs:/ID``, ``models:/NAME/N``,
        ``models:/<logged model id>``, ``deployments:/NAME``), ``depth`` hops ``up``,
        ``down`` or ``both``."""
        params = {"uri": uri, "direction": direction, "depth": depth, "max_nodes": max_nodes}
        result: dict[str, Any] = self.request("GET", "/api/v1/lineage", params=params)
        return result
