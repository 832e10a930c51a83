"""OTLP requests built the way an OpenTelemetry exporter builds them, for the trace tests."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

HEADER = "x-mlflow-experiment-id"
PROTOBUF = {"Content-Type": "application/x-protobuf"}


@dataclass
class SpanSpec:
    name: str
    trace_id: bytes
    span_id: bytes = field(default_factory=lambda: secrets.token_bytes(8))
    parent: bytes = b""
    start_ns: int = 1_700_000_000_000_000_000
    end_ns: int = 1_700_000_000_500_000_000
    error: bool = False
    attributes: Mapping[str, str] = field(default_factory=dict)


def new_trace_id() -> bytes:
    return secrets.token_bytes(16)


def mlflow_id(trace_id: bytes) -> str:
    return f"tr-{trace_id.hex()}"


def request_of(*spans: SpanSpec) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for spec in spans:
        span = scope.spans.add()
        span.trace_id = spec.trace_id
        span.span_id = spec.span_id
        span.parent_span_id = spec.parent
        span.name = spec.name
        span.kind = Span.SPAN_KIND_INTERNAL
        span.start_time_unix_nano = spec.start_ns
        span.end_time_unix_nano = spec.end_ns
        span.status.code = Status.STATUS_CODE_ERROR if spec.error else Status.STATUS_CODE_OK
        for key, value in spec.attributes.items():
            attribute = span.attributes.add()
            attribute.key = key
            attribute.value.string_value = value
    return request


def protobuf_of(*spans: SpanSpec) -> bytes:
    body: bytes = request_of(*spans).SerializeToString()
    return body


def json_of(*spans: SpanSpec) -> bytes:
    """OTLP JSON as the specification writes it: ids in hex, enums as numbers."""
    items: list[dict[str, Any]] = [
        {
            "traceId": spec.trace_id.hex(),
            "spanId": spec.span_id.hex(),
            "parentSpanId": spec.parent.hex(),
            "name": spec.name,
            "kind": 1,
            "startTimeUnixNano": str(spec.start_ns),
            "endTimeUnixNano": str(spec.end_ns),
            "status": {"code": 2 if spec.error else 1},
            "attributes": [
                {"key": k, "value": {"stringValue": v}} for k, v in spec.attributes.items()
            ],
        }
        for spec in spans
    ]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": items}]}]}).encode()
