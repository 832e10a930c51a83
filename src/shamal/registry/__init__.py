"""Model registry: registered models, versions, aliases, tags, lineage to runs."""

from __future__ import annotations

from shamal.registry._service import ModelSources, RegistryService

__all__ = ["ModelSources", "RegistryService"]
