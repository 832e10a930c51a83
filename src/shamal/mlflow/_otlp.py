"""OTLP/HTTP span ingestion: an ``ExportTraceServiceRequest`` (binary protobuf or OTLP JSON)
read into the spans the traces domain stores.

Each span keeps, beside its searchable fields, the whole span as protobuf JSON (the shape in
which MLflow's ``GetTrace`` answers it: ids in base64, as protobuf's JSON mapping writes
bytes), and the span as MLflow's own span dict in JSON, the text ``trace.text`` searches
(:mod:`shamal.mlflow._spans`). The MLflow trace id of a span is ``tr-`` and its
OpenTelemetry trace id in hex, as a stock server derives it: a client-sent
``mlflow.traceRequestId`` is not trusted.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import zlib
from collections.abc import Iterator
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan

from shamal.errors import InvalidParameter, PayloadTooLarge
from shamal.mlflow._spans import search_text
from shamal.traces import MAX_SPANS_PER_REQUEST, Span

__all__ = ["decode_export_request", "inflate"]

_INT64_MAX = 2**63 - 1
#: Span status codes as a stock server stores them (``span.status`` searches compare these).
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}
_SPAN_TYPE = "mlflow.spanType"
_INPUTS = "mlflow.spanInputs"
_OUTPUTS = "mlflow.spanOutputs"
_BAD_BODY = "The request body is not a valid OTLP ExportTraceServiceRequest."
#: Past this many bytes inflated, a gzip body is refused (a small body can inflate to GBs).
MAX_INFLATED_BYTES = 64 * 1024 * 1024


def inflate(body: bytes, encoding: str) -> bytes:
    """The body as sent before its ``Content-Encoding`` (``gzip``, ``deflate`` or none).

    Raises:
        InvalidParameter: an unknown encoding, or a body that does not inflate.
        PayloadTooLarge: it inflates past ``MAX_INFLATED_BYTES``.
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise InvalidParameter("Content-Encoding must be gzip, deflate or identity.")
    # wbits: 16+ reads gzip's header, 0 + zlib's (deflate as HTTP sends it).
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, MAX_INFLATED_BYTES)
    except zlib.error:
        raise InvalidParameter(f"The body is not valid {encoding} data.") from None
    if inflater.unconsumed_tail:
        raise PayloadTooLarge(f"The body inflates past {MAX_INFLATED_BYTES} bytes.")
    return out


# ---------------------------------------------------------------------- reading the request
def _hex_to_base64(value: Any) -> Any:
    """An id as OTLP JSON writes it (hex) in protobuf JSON's spelling of bytes (base64)."""
    if not isinstance(value, str):
        return value
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except ValueError:
        raise InvalidParameter("OTLP JSON ids (traceId, spanId) must be hex strings.") from None


def _fix_ids(item: Any, keys: tuple[str, ...]) -> None:
    if isinstance(item, dict):
        for key in keys:
            if key in item:
                item[key] = _hex_to_base64(item[key])


def _children(item: Any, *names: str) -> Iterator[Any]:
    if not isinstance(item, dict):
        return
    for name in names:
        values = item.get(name)
        if isinstance(values, list):
            yield from values


def _spans_of_json(data: Any) -> Iterator[Any]:
    for resource_spans in _children(data, "resourceSpans", "resource_spans"):
        for scope_spans in _children(resource_spans, "scopeSpans", "scope_spans"):
            yield from _children(scope_spans, "spans")


def _parse_json(body: bytes) -> ExportTraceServiceRequest:
    """OTLP JSON: ids in hex (not protobuf JSON's base64), enums as numbers."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidParameter("The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise InvalidParameter(_BAD_BODY)
    ids = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")
    for span in _spans_of_json(data):
        _fix_ids(span, ids)
        for link in _children(span, "links"):
            _fix_ids(link, ids)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(data, request, ignore_unknown_fields=True, max_recursion_depth=64)
    except (json_format.ParseError, ValueError, TypeError, RecursionError):
        raise InvalidParameter(_BAD_BODY) from None
    return request


def _parse(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    media = content_type.split(";")[0].strip().lower()
    if media == "application/json":
        return _parse_json(body)
    if media not in ("application/x-protobuf", "application/protobuf"):
        raise InvalidParameter(
            "Content-Type must be application/x-protobuf or application/json (OTLP/HTTP)."
        )
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError):
        raise InvalidParameter(_BAD_BODY) from None
    return request


# ---------------------------------------------------------------------- one span
def _text(value: str, what: str) -> str:
    if "\x00" in value:  # no database text column holds NUL
        raise InvalidParameter(f"A span's {what} holds a NUL character.")
    return value


def _plain(value: Any) -> Any:
    """An OTLP ``AnyValue`` as a JSON-able value (bytes in base64)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


def _attribute(attributes: Any, key: str) -> Any:
    for item in attributes:
        kv: KeyValue = item
        if kv.key == key:
            return _plain(kv.value)
    return None


def _as_text(value: Any) -> str | None:
    """An attribute as preview text: a string as it is (MLflow writes inputs and outputs
    as JSON text), anything else as JSON."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text.replace("\x00", "\ufffd")


def _span_type(attributes: Any) -> str | None:
    value = _attribute(attributes, _SPAN_TYPE)
    if isinstance(value, str) and value.startswith('"'):
        with contextlib.suppress(ValueError):  # MLflow's exporter writes JSON text: '"LLM"'
            value = json.loads(value)
    text = _as_text(value)
    return None if text is None else text[:250]


def _id(value: bytes, size: int, what: str) -> str:
    if len(value) != size or not any(value):
        raise InvalidParameter(f"A span's {what} must be {size} bytes, not all zero.")
    return value.hex()


def _nanos(value: int, what: str) -> int:
    if value > _INT64_MAX:
        raise InvalidParameter(f"A span's {what} is out of range.")
    return value


def _span(otlp: OtlpSpan) -> Span:
    trace_hex = _id(otlp.trace_id, 16, "trace id")
    parent = _id(otlp.parent_span_id, 8, "parent span id") if otlp.parent_span_id else None
    as_json = json_format.MessageToDict(otlp, preserving_proto_field_name=True)
    content = json.dumps(as_json, ensure_ascii=False, separators=(",", ":"))
    return Span(
        trace_id=f"tr-{trace_hex}",
        span_id=_id(otlp.span_id, 8, "span id"),
        parent_span_id=parent,
        name=_text(otlp.name, "name"),
        span_type=_span_type(otlp.attributes),
        status=_STATUS.get(otlp.status.code, "UNSET"),
        start_time_ns=_nanos(otlp.start_time_unix_nano, "start time"),
        end_time_ns=_nanos(otlp.end_time_unix_nano, "end time") or None,
        content=content,
        search_text=search_text(as_json),
        inputs=_as_text(_attribute(otlp.attributes, _INPUTS)),
        outputs=_as_text(_attribute(otlp.attributes, _OUTPUTS)),
    )


def decode_export_request(body: bytes, content_type: str) -> list[Span]:
    """The spans of an OTLP ``ExportTraceServiceRequest``.

    Raises:
        InvalidParameter: another content type, a body that does not parse, a span without
            valid ids or times, more than ``MAX_SPANS_PER_REQUEST`` spans.
    """
    request = _parse(body, content_type)
    count = sum(
        len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans
    )
    if count > MAX_SPANS_PER_REQUEST:
        raise InvalidParameter(
            f"A request may carry at most {MAX_SPANS_PER_REQUEST} spans; got {count}."
        )
    try:
        return [
            _span(span)
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
    except (binascii.Error, UnicodeError):
        raise InvalidParameter(_BAD_BODY) from None
