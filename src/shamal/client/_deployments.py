"""Client calls about deployments (``shamal deploy``, ``shamal deployments ...``, serve processes).

Answers are the server's JSON (see ``shamal.deployments.api``): a deployment is a dict with
``name``, ``team``, ``revision``, ``routes`` (``model``, ``version``, ``role``, ``weight``,
``share``, ``uri``), ``slo``, ``rollout``, ``state``, ``sticky_header`` and ``sample_rate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from shamal.client._calls import ClientCalls


def _path(name: str, *rest: str) -> str:
    return "/".join(("/api/v1/deployments", quote(name, safe=""), *rest))


class DeploymentCalls(ClientCalls):
    """Calls of the deployments API."""

    def deploy(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create the deployment or replace its spec; ``spec`` is the API's DeployIn
        (``primary``, ``canary``, ``shadows``, ``rollout``, ``slo``, ``sticky_header``,
        ``sample_rate``, ``team``)."""
        result: dict[str, Any] = self.request("PUT", _path(name), json=dict(spec))
        return result

    def list_deployments(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return self.list_pages("/api/v1/deployments", limit=limit)

    def get_deployment(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", _path(name))
        return result

    def delete_deployment(self, name: str) -> None:
        self.request("DELETE", _path(name))

    def create_deployment_token(
        self, name: str, token_name: str, *, expires_in_s: int | None = None
    ) -> dict[str, Any]:
        """A token of yours that may call deployment ``name``'s models and nothing else;
        its ``secret`` is in the answer, once."""
        body = {"name": token_name, "expires_in_s": expires_in_s}
        result: dict[str, Any] = self.request("POST", f"{_path(name)}/tokens", json=body)
        return result

    def set_canary(
        self,
        name: str,
        model: str,
        percent: int,
        *,
        rollout: Mapping[str, Any] | None = None,
        revision: int | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "percent": percent}
        if rollout is not None:
            body["rollout"] = dict(rollout)
        if revision is not None:
            body["revision"] = revision
        result: dict[str, Any] = self.request("PUT", _path(name, "canary"), json=body)
        return result

    def set_shadows(self, name: str, shadows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``shadows``: ``{"model": uri, "percent": 1..100}`` each; empty removes them."""
        body = {"shadows": [dict(s) for s in shadows]}
        result: dict[str, Any] = self.request("PUT", _path(name, "shadows"), json=body)
        return result

    def set_weights(self, name: str, primary: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``primary``: ``{"model": uri, "weight": n}`` each (relative weights, A/B)."""
        body = {"primary": [dict(p) for p in primary]}
        result: dict[str, Any] = self.request("PUT", _path(name, "weights"), json=body)
        return result

    def promote_deployment(self, name: str, *, revision: int | None = None) -> dict[str, Any]:
        body = {"revision": revision} if revision is not None else None
        result: dict[str, Any] = self.request("POST", _path(name, "promote"), json=body)
        return result

    def rollback_deployment(
        self, name: str, *, reason: str = "", revision: int | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"reason": reason}
        if revision is not None:
            body["revision"] = revision
        result: dict[str, Any] = self.request("POST", _path(name, "rollback"), json=body)
        return result

    def deployment_events(self, name: str, *, limit: int = 100) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request(
            "GET", _path(name, "events"), params={"limit": limit}
        )
        return result

    def deployment_stats(self, name: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", _path(name, "stats"))
        return result

    def report_deployment(
        self,
        name: str,
        revision: int,
        versions: Sequence[Mapping[str, Any]],
        *,
        loading: Sequence[str] = (),
        failed: Sequence[Mapping[str, str]] = (),
    ) -> dict[str, Any]:
        """Send per-version statistics (``version``, ``ok``, ``errors``, ``latency_counts``)
        gathered under ``revision``, with the versions this server is still loading and those
        it could not load (``version``, ``reason``); the answer holds the controller's decision
        and the deployment's revision after it."""
        body = {
            "revision": revision,
            "versions": [dict(v) for v in versions],
            "loading": list(loading),
            "failed": [dict(f) for f in failed],
        }
        result: dict[str, Any] = self.request("POST", _path(name, "reports"), json=body)
        return result

    def push_deployment_samples(self, name: str, samples: Sequence[Mapping[str, Any]]) -> int:
        """Send sampled requests; returns how many the server kept."""
        body = {"samples": [dict(s) for s in samples]}
        result: dict[str, Any] = self.request("POST", _path(name, "samples"), json=body)
        return int(result["accepted"])

    def post_deployment_labels(
        self, name: str, labels: Mapping[str, Any], *, batch: int = 1000
    ) -> dict[str, Any]:
        """Post true outcomes by request id (``{request_id: label}``), ``batch`` at a time;
        returns ``{"stored": n, "unmatched": [request ids no kept sample has yet]}``."""
        items = [{"request_id": k, "label": v} for k, v in labels.items()]
        stored, unmatched = 0, []
        for start in range(0, len(items), batch):
            body = {"labels": items[start : start + batch]}
            result: dict[str, Any] = self.request("POST", _path(name, "labels"), json=body)
            stored += int(result["stored"])
            unmatched.extend(result["unmatched"])
        return {"stored": stored, "unmatched": unmatched}

    def deployment_samples(self, name: str, *, limit: int = 100) -> list[dict[str, Any]]:
        return self.list_pages(_path(name, "samples"), limit=limit)
