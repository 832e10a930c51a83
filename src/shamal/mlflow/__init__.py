"""The MLflow dialect: Shamal's tracking, registry and artifacts as the stock client speaks them.

One home for everything MLflow-shaped, so the domains keep only their rules:

* request fields as the dialect sends them, and protobuf-style JSON answers (:mod:`._fields`);
* the JSON shapes of tracking's and the registry's entities (:mod:`._tracking_json`,
  :mod:`._registry_json`);
* the routers: tracking (with the artifacts proxy), the model registry and its webhooks,
  and MLflow 3's traces with OTLP span ingestion (:mod:`.traces_api`);
* what MLflow's own UI calls beyond those (GraphQL, bulk histories, dataset summaries,
  artifact files for its viewers): :mod:`.ui_api`, with :mod:`._graphql`.
"""

from __future__ import annotations

from shamal.mlflow._fields import MLFLOW_PREFIXES, MLFLOW_VERSION, is_mlflow_path, mlflow_status
from shamal.mlflow.registry_api import PREFIXES as REGISTRY_PREFIXES
from shamal.mlflow.registry_api import router as registry_router
from shamal.mlflow.traces_api import router as traces_router
from shamal.mlflow.tracking_api import router as tracking_router
from shamal.mlflow.ui_api import router as ui_router
from shamal.mlflow.webhooks_api import router as webhooks_router

__all__ = [
    "MLFLOW_PREFIXES",
    "MLFLOW_VERSION",
    "REGISTRY_PREFIXES",
    "is_mlflow_path",
    "mlflow_status",
    "registry_router",
    "tracking_router",
    "traces_router",
    "ui_router",
    "webhooks_router",
]
