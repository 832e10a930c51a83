"""Model registry: registered models, versions, stages, aliases and tags.

* :class:`RegistryService` holds the rules (team ownership, roles, validation)
  and audits every change in the transaction that makes it.
* :class:`ModelSources` is what it asks to vet a new version's ``source``
  (the tracking service implements it): only URIs Shamal minted pass.
* The entities it returns are frozen: :class:`RegisteredModel`,
  :class:`ModelVersion`, :class:`ModelAlias`, one :class:`Page` of a search.
* ``shamal.mlflow.registry_api.router`` serves it in the MLflow REST dialect;
  ``shamal.registry.api.router`` is the native read API under ``/api/v1/models``.
"""

from __future__ import annotations

from shamal.registry._entities import (
    TEAM_TAG,
    ModelAlias,
    ModelVersion,
    Page,
    RegisteredModel,
    Stage,
    VersionStatus,
)
from shamal.registry._rules import LATEST_ALIAS, is_prompt, parse_stage, parse_version
from shamal.registry._service import (
    MODELS_PAGE_DEFAULT,
    MODELS_PAGE_MAX,
    VERSIONS_PAGE_DEFAULT,
    VERSIONS_PAGE_MAX,
    ModelSources,
    RegistryService,
    check_max_results,
)

__all__ = [
    "LATEST_ALIAS",
    "MODELS_PAGE_DEFAULT",
    "MODELS_PAGE_MAX",
    "TEAM_TAG",
    "VERSIONS_PAGE_DEFAULT",
    "VERSIONS_PAGE_MAX",
    "ModelAlias",
    "ModelSources",
    "ModelVersion",
    "Page",
    "RegisteredModel",
    "RegistryService",
    "Stage",
    "VersionStatus",
    "check_max_results",
    "is_prompt",
    "parse_stage",
    "parse_version",
]
