"""Model serving: an Open Inference Protocol server (REST + gRPC) with dynamic batching.

Run it with ``shamal serve``. The pieces: model files checked
without trusting them (:mod:`._modelfiles`), runtimes behind one interface (:mod:`._backends`), the
repository of loaded versions (:mod:`._repository`), per-version dynamic batching
(:mod:`._batching`), the protocol-independent inference core (:mod:`._core`), the REST front end
(:mod:`._rest`, :mod:`._rest_codec`), metrics (:mod:`._metrics`) and the process (:mod:`._server`).

The names below load on first use (PEP 562): importing this package loads no runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy

if TYPE_CHECKING:
    from shamal.serving._access import (
        OpenAccess,
        PlatformAccess,
        StaticToken,
        deployment_path,
        loopback_hosts,
        registered_model_path,
    )
    from shamal.serving._backends import BackendOptions
    from shamal.serving._core import CoreOptions, InferenceCore
    from shamal.serving._deployment import DeploymentRouter
    from shamal.serving._features import FeatureLookup, OnlineFeatureLookup
    from shamal.serving._repository import (
        VersionLoader,
        discard_download,
        load_repository,
        load_version,
        open_model,
        parse_model_option,
    )
    from shamal.serving._routing import LatestVersionRouter
    from shamal.serving._server import ServerOptions, run_server

_WHERE: dict[str, tuple[str, str | None]] = {
    "BackendOptions": ("_backends", "BackendOptions"),
    "CoreOptions": ("_core", "CoreOptions"),
    "DeploymentRouter": ("_deployment", "DeploymentRouter"),
    "FeatureLookup": ("_features", "FeatureLookup"),
    "OnlineFeatureLookup": ("_features", "OnlineFeatureLookup"),
    "InferenceCore": ("_core", "InferenceCore"),
    "LatestVersionRouter": ("_routing", "LatestVersionRouter"),
    "OpenAccess": ("_access", "OpenAccess"),
    "PlatformAccess": ("_access", "PlatformAccess"),
    "ServerOptions": ("_server", "ServerOptions"),
    "StaticToken": ("_access", "StaticToken"),
    "VersionLoader": ("_repository", "VersionLoader"),
    "deployment_path": ("_access", "deployment_path"),
    "discard_download": ("_repository", "discard_download"),
    "load_repository": ("_repository", "load_repository"),
    "load_version": ("_repository", "load_version"),
    "loopback_hosts": ("_access", "loopback_hosts"),
    "open_model": ("_repository", "open_model"),
    "parse_model_option": ("_repository", "parse_model_option"),
    "registered_model_path": ("_access", "registered_model_path"),
    "run_server": ("_server", "run_server"),
}

__all__ = [
    "BackendOptions",
    "CoreOptions",
    "DeploymentRouter",
    "FeatureLookup",
    "OnlineFeatureLookup",
    "InferenceCore",
    "LatestVersionRouter",
    "OpenAccess",
    "PlatformAccess",
    "ServerOptions",
    "StaticToken",
    "VersionLoader",
    "deployment_path",
    "discard_download",
    "load_repository",
    "load_version",
    "loopback_hosts",
    "open_model",
    "parse_model_option",
    "registered_model_path",
    "run_server",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
