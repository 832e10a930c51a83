"""Client calls of monitoring (``shamal monitor ...``, training jobs uploading sketches)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from shamal.client._calls import ClientCalls

_MONITORS = "/api/v1/monitors"
_REFERENCES = "/api/v1/monitor-references"


def _version_path(model: str, version: int) -> str:
    return f"{_REFERENCES}/{quote(model, safe='')}/versions/{int(version)}"


class MonitorCalls(ClientCalls):
    """Calls of the monitoring API (``/api/v1/monitors``, ``/api/v1/monitor-references``)."""

    # ------------------------------------------------------------------ references
    def build_reference(
        self,
        model: str,
        version: int,
        dataset: str,
        *,
        label: str | None = None,
        columns: list[str] | None = None,
    ) -> dict[str, Any]:
        """Profile the dataset version ``dataset`` (``NAME/3``) as the reference of
        ``model``'s ``version``; the profile."""
        body: dict[str, Any] = {"dataset": dataset, "label": label, "columns": columns}
        result: dict[str, Any] = self.request(
            "POST", f"{_version_path(model, version)}/build", json=body
        )
        return result

    def upload_sketches(
        self,
        model: str,
        version: int,
        sketches: Mapping[str, Mapping[str, Any]],
        *,
        role: str = "prediction",
    ) -> dict[str, Any]:
        """Add column sketches (``ColumnSketch.to_json()`` by column) to the reference of
        ``model``'s ``version``: what a training job posts for its predictions."""
        body = {"role": role, "sketches": {k: dict(v) for k, v in sketches.items()}}
        result: dict[str, Any] = self.request(
            "POST", f"{_version_path(model, version)}/sketches", json=body
        )
        return result

    def reference(self, model: str, version: int) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", _version_path(model, version))
        return result

    # ------------------------------------------------------------------ monitors
    def create_monitor(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Attach a monitor (the body of ``POST /api/v1/monitors``); the monitor."""
        result: dict[str, Any] = self.request("POST", _MONITORS, json=dict(spec))
        return result

    def monitors(self, deployment: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if deployment:
            params["deployment"] = deployment
        result: list[dict[str, Any]] = self.request("GET", _MONITORS, params=params)["monitors"]
        return result

    def monitor(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"{_MONITORS}/{name}")
        return result

    def monitor_results(self, name: str, limit: int = 20) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request(
            "GET", f"{_MONITORS}/{name}/results", params={"limit": limit}
        )["results"]
        return result

    def monitor_series(
        self, name: str, column: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if column:
            params["column"] = column
        result: list[dict[str, Any]] = self.request(
            "GET", f"{_MONITORS}/{name}/series", params=params
        )["points"]
        return result

    def run_monitor(self, name: str) -> dict[str, Any]:
        """Run the monitor now: ``{"monitor", "result", "reason"}``."""
        result: dict[str, Any] = self.request("POST", f"{_MONITORS}/{name}/run")
        return result

    def pause_monitor(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"{_MONITORS}/{name}/pause")
        return result

    def resume_monitor(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"{_MONITORS}/{name}/resume")
        return result

    def delete_monitor(self, name: str) -> None:
        self.request("DELETE", f"{_MONITORS}/{name}")
