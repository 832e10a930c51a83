"""Client calls of the feature store (``shamal features ...``, the SDK).

Definitions travel as the registry's JSON; entity rows go up and training sets come back as
Arrow IPC streams; online reads are JSON (see ``shamal.features.api``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from shamal.client._calls import ClientCalls, raise_for

ARROW_STREAM = "application/vnd.apache.arrow.stream"


class FeatureCalls(ClientCalls):
    """Calls of the feature-store API."""

    def feature_registry(self) -> dict[str, Any]:
        """The registry's ``number`` and its live ``definitions``."""
        result: dict[str, Any] = self.request("GET", "/api/v1/features/registry")
        return result

    def plan_features(
        self, definitions: Mapping[str, Any], *, prune: bool = False
    ) -> dict[str, Any]:
        """What applying ``definitions`` (their JSON form) would change: ``changes`` and
        ``breaking`` (reasons the server would refuse)."""
        body = {"definitions": dict(definitions), "prune": prune}
        result: dict[str, Any] = self.request("POST", "/api/v1/features/plan", json=body)
        return result

    def apply_features(
        self, definitions: Mapping[str, Any], *, prune: bool = False
    ) -> dict[str, Any]:
        """Apply ``definitions``: the registry ``number`` and the ``changes`` written."""
        body = {"definitions": dict(definitions), "prune": prune}
        result: dict[str, Any] = self.request("POST", "/api/v1/features/apply", json=body)
        return result

    def feature_objects(self, kind: str | None = None) -> list[dict[str, Any]]:
        params = {"kind": kind} if kind else None
        result: list[dict[str, Any]] = self.request(
            "GET", "/api/v1/features/objects", params=params
        )
        return result

    def feature_object_versions(self, kind: str, name: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request(
            "GET", f"/api/v1/features/objects/{kind}/{name}/versions"
        )
        return result

    def historical_features(
        self,
        entities: Any,
        *,
        features: Sequence[str] | None = None,
        feature_service: str | None = None,
        timestamp: str = "event_timestamp",
        full_names: bool = False,
        save_as: str | None = None,
        sql: str | None = None,
    ) -> tuple[Any, dict[str, str]]:
        """A point-in-time-correct training set: (an Arrow table, the response's headers:
        ``x-shamal-rows``, ``x-shamal-views`` and ``x-shamal-saved-as``).

        ``entities``: a ``pyarrow.Table`` (or anything with ``to_arrow``/a pandas DataFrame),
        uploaded as an Arrow stream; or a dataset reference (``orders@prod``) whose rows the
        server reads itself (``sql``: a SELECT over it, named ``source``).
        """
        import pyarrow as pa
        import pyarrow.ipc as paipc

        timeout = httpx.Timeout(self._http.timeout.connect, read=None, write=None)
        if isinstance(entities, str):
            body = {
                "dataset": entities,
                "sql": sql,
                "timestamp": timestamp,
                "features": list(features) if features is not None else None,
                "feature_service": feature_service,
                "full_names": full_names,
                "save_as": save_as,
            }
            request = self._http.build_request(
                "POST", "/api/v1/features/historical", json=body, timeout=timeout
            )
        else:
            table = _as_arrow(entities)
            sink = pa.BufferOutputStream()
            with paipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            params: list[tuple[str, Any]] = [("timestamp", timestamp)]
            params += [("features", f) for f in features or ()]
            if feature_service:
                params.append(("feature_service", feature_service))
            if full_names:
                params.append(("full_names", "true"))
            if save_as:
                params.append(("save_as", save_as))
            request = self._http.build_request(
                "POST",
                "/api/v1/feature-uploads/historical",
                params=params,
                content=sink.getvalue().to_pybytes(),
                headers={"Content-Type": ARROW_STREAM},
                timeout=timeout,
            )
        answer = self._http.send(request, stream=True)
        try:
            raise_for(answer)
            data = b"".join(answer.iter_bytes())
        finally:
            answer.close()
        table = paipc.open_stream(pa.py_buffer(data)).read_all()
        headers = {k: v for k, v in answer.headers.items() if k.startswith("x-shamal-")}
        return table, headers

    def materialize_features(
        self,
        views: Sequence[str] | None = None,
        *,
        end: str | None = None,
        incremental: bool = False,
    ) -> list[dict[str, Any]]:
        """Materialize views (default: every online one) into the online store."""
        body = {"views": list(views) if views else None, "end": end, "incremental": incremental}
        result: list[dict[str, Any]] = self.request(
            "POST",
            "/api/v1/features/materializations",
            json=body,
            timeout=httpx.Timeout(self._http.timeout.connect, read=None, write=None),
        )
        return result

    def feature_materializations(
        self, view: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if view:
            params["view"] = view
        result: list[dict[str, Any]] = self.request(
            "GET", "/api/v1/features/materializations", params=params
        )
        return result

    def online_features(
        self,
        entities: Mapping[str, Sequence[Any]],
        *,
        features: Sequence[str] | None = None,
        feature_service: str | None = None,
        full_names: bool = False,
    ) -> dict[str, Any]:
        """Online values: ``features`` (name -> one value per entity), ``views`` (name -> the
        view it was read from), per view ``status`` and ``event_timestamps`` (one per entity),
        and the ``entities`` asked for."""
        body = {
            "entities": {k: list(v) for k, v in entities.items()},
            "features": list(features) if features is not None else None,
            "feature_service": feature_service,
            "full_names": full_names,
        }
        result: dict[str, Any] = self.request("POST", "/api/v1/features/online", json=body)
        return result

    def push_features(
        self, view: str, rows: Sequence[Mapping[str, Any]], *, offline: bool = True
    ) -> int:
        """Write fresh rows of ``view`` online and (``offline``) to its dataset."""
        body = {"rows": [dict(r) for r in rows], "offline": offline}
        result: dict[str, int] = self.request(
            "POST", f"/api/v1/features/views/{view}/push", json=body
        )
        return result["written"]


def _as_arrow(rows: Any) -> Any:
    import pyarrow as pa

    if isinstance(rows, pa.Table):
        return rows
    if hasattr(rows, "to_arrow"):
        return rows.to_arrow()
    return pa.Table.from_pandas(rows, preserve_index=False)
