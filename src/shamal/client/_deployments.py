"""Client calls about deployments (``shamal deploy``, ``shamal deployments ...``)."""

from __future__ import annotations

from shamal.client._calls import ClientCalls


class DeploymentCalls(ClientCalls):
    """Calls of the deployments API."""
