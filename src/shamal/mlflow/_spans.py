"""A stored span (OTLP protobuf JSON) in MLflow's own span form: the dict ``Span.to_dict``
writes, which a stock server stores and its ``trace.text`` search reads.

Two readers: the ``traces.json`` artifact (:mod:`shamal.mlflow._trace_json`) answers spans in
this form, and OTLP ingestion (:mod:`shamal.mlflow._otlp`) stores this form's JSON text as the
span's search text, so that ``trace.text LIKE '%value%'`` matches what a stock server matches
(the span's names, attributes and events) and not the key names of OTLP's own JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["search_text", "span_dict"]


def _plain(value: Any) -> Any:
    """An OTLP ``AnyValue`` in protobuf JSON as the plain value it holds."""
    if not isinstance(value, dict) or not value:
        return None
    kind, held = next(iter(value.items()))
    if kind == "int_value":
        return int(held)
    if kind == "array_value":
        return [_plain(v) for v in held.get("values", [])]
    if kind == "kvlist_value":
        return {kv.get("key"): _plain(kv.get("value")) for kv in held.get("values", [])}
    return held


def span_dict(span: Mapping[str, Any]) -> dict[str, Any]:
    """A stored span (OTLP protobuf JSON) as MLflow writes a span in ``traces.json``:
    attributes as JSON text, as MLflow keeps them."""
    status = span.get("status", {})
    return {
        "trace_id": span.get("trace_id"),
        "span_id": span.get("span_id"),
        "parent_span_id": span.get("parent_span_id") or None,
        "name": span.get("name", ""),
        "start_time_unix_nano": int(span.get("start_time_unix_nano", 0)),
        "end_time_unix_nano": int(span.get("end_time_unix_nano", 0)) or None,
        "events": [
            {
                "name": event.get("name", ""),
                "time_unix_nano": int(event.get("time_unix_nano", 0)),
                "attributes": {
                    kv.get("key"): _plain(kv.get("value")) for kv in event.get("attributes", [])
                },
            }
            for event in span.get("events", [])
        ],
        "status": {
            "code": status.get("code", "STATUS_CODE_UNSET"),
            "message": status.get("message", ""),
        },
        "attributes": {
            kv.get("key"): json.dumps(_plain(kv.get("value")), ensure_ascii=False)
            for kv in span.get("attributes", [])
        },
        "links": [],
    }


def search_text(span: Mapping[str, Any]) -> str:
    """The text ``trace.text`` searches for this span: its MLflow span dict as JSON, spelled
    as a stock server stores it (``json.dumps``'s separators), with text other than ASCII
    kept as it is so that a search for it finds it."""
    return json.dumps(span_dict(span), ensure_ascii=False)
