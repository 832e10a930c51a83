"""Client calls of pipelines (``shamal pipeline ...``, the SDK)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shamal.client._calls import ClientCalls


class PipelineCalls(ClientCalls):
    """Calls of the pipelines API (``/api/v1/pipelines``, ``/api/v1/pipeline-runs``)."""

    def register_pipeline(
        self, spec: Mapping[str, Any], snapshot: str | None = None
    ) -> dict[str, Any]:
        """Register ``spec`` (its JSON form) with the code ``snapshot`` its steps run:
        ``{"pipeline": ..., "created": bool}``."""
        body = {"spec": dict(spec), "snapshot": snapshot}
        result: dict[str, Any] = self.request("POST", "/api/v1/pipelines", json=body)
        return result

    def pipelines(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", "/api/v1/pipelines")["pipelines"]
        return result

    def pipeline(self, name: str, version: int | None = None) -> dict[str, Any]:
        params = {"version": version} if version else None
        result: dict[str, Any] = self.request("GET", f"/api/v1/pipelines/{name}", params=params)
        return result

    def start_pipeline(self, name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Start a run of the pipeline's newest version: the run, with its first steps."""
        body = {"params": dict(params or {})}
        result: dict[str, Any] = self.request("POST", f"/api/v1/pipelines/{name}/runs", json=body)
        return result

    def pipeline_runs(
        self, pipeline: str | None = None, states: list[str] | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if pipeline:
            params["pipeline"] = pipeline
        if states:
            params["state"] = states
        result: list[dict[str, Any]] = self.request("GET", "/api/v1/pipeline-runs", params=params)[
            "runs"
        ]
        return result

    def pipeline_run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/api/v1/pipeline-runs/{run_id}")
        return result

    def cancel_pipeline_run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"/api/v1/pipeline-runs/{run_id}/cancel")
        return result

    def retry_pipeline_run(self, run_id: str, from_step: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", f"/api/v1/pipeline-runs/{run_id}/retry", json={"from_step": from_step}
        )
        return result

    def pipeline_step_log(self, run_id: str, key: str, offset: int = 0) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "GET", f"/api/v1/pipeline-runs/{run_id}/steps/{key}/logs", params={"offset": offset}
        )
        return result
