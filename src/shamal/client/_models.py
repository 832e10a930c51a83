"""Client calls about model files: fetching a registry version's files, registering variants."""

from __future__ import annotations

from shamal.client._calls import ClientCalls


class ModelCalls(ClientCalls):
    """Calls used by ``shamal optimize`` and ``shamal serve``."""
