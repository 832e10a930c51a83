"""MLflow 3 traces in the dialect's JSON: ``TraceInfoV3`` and ``Trace`` out, a
``StartTraceV3`` body in.

``request_time`` and ``execution_duration`` travel as protobuf's JSON spellings of a
``Timestamp`` (RFC 3339) and a ``Duration`` (``"1.5s"``); the traces domain keeps
milliseconds. A trace's spans are answered as OTLP ``Span`` messages in protobuf JSON,
exactly as they were stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from shamal.errors import InvalidParameter
from shamal.mlflow._spans import span_dict
from shamal.traces import Trace, TraceInfo

__all__ = [
    "legacy_status",
    "legacy_trace_info_json",
    "trace_data_json",
    "trace_info_json",
    "trace_info_of",
    "trace_json",
]

#: What protobuf's JSON parsers of times raise for text they cannot read.
_UNPARSED = (ValueError, TypeError, IndexError, OverflowError, AttributeError)
_STATES = {0: "STATE_UNSPECIFIED", 1: "OK", 2: "ERROR", 3: "IN_PROGRESS"}


def _timestamp_ms(value: Any) -> int:
    if not isinstance(value, str):
        raise InvalidParameter("trace_info.request_time must be an RFC 3339 timestamp.")
    stamp = Timestamp()
    try:
        stamp.FromJsonString(value)
        millis: int = stamp.ToMilliseconds()
    except _UNPARSED:
        raise InvalidParameter("trace_info.request_time must be an RFC 3339 timestamp.") from None
    return millis


def _duration_ms(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidParameter("trace_info.execution_duration must be a duration such as '1.5s'.")
    duration = Duration()
    try:
        duration.FromJsonString(value)
        millis: int = duration.ToMilliseconds()
    except _UNPARSED:
        raise InvalidParameter(
            "trace_info.execution_duration must be a duration such as '1.5s'."
        ) from None
    if millis < 0:
        raise InvalidParameter("trace_info.execution_duration may not be negative.")
    return millis


def _pairs(value: Any, what: str) -> dict[str, str]:
    """A ``map<string, string>`` as protobuf JSON writes it: an object of strings."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidParameter(f"trace_info.{what} must be an object of strings.")
    return dict(value)


def _optional_text(info: Mapping[str, Any], name: str) -> str | None:
    value = info.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidParameter(f"trace_info.{name} must be a string.")
    if "\x00" in value:
        raise InvalidParameter(f"trace_info.{name} holds a NUL character.")
    return value


def _state(value: Any) -> str:
    if value is None:
        return "STATE_UNSPECIFIED"
    if isinstance(value, int) and not isinstance(value, bool):
        value = _STATES.get(value, "")
    if value not in _STATES.values():
        raise InvalidParameter(f"Invalid trace state; one of {', '.join(_STATES.values())}.")
    return str(value)


def _experiment_id(info: Mapping[str, Any]) -> str:
    location = info.get("trace_location")
    where = location.get("mlflow_experiment") if isinstance(location, dict) else None
    experiment_id = where.get("experiment_id") if isinstance(where, dict) else None
    if not isinstance(experiment_id, str) or not experiment_id:
        raise InvalidParameter(
            "trace_info.trace_location must name an MLflow experiment "
            "(mlflow_experiment.experiment_id); Shamal keeps traces in experiments only."
        )
    return experiment_id


def trace_info_of(trace: Any) -> TraceInfo:
    """The info of a ``StartTraceV3`` body's ``trace``.

    Raises:
        InvalidParameter: a missing or malformed field.
    """
    info = trace.get("trace_info") if isinstance(trace, dict) else None
    if not isinstance(info, dict):
        raise InvalidParameter("Missing value for required parameter 'trace.trace_info'.")
    trace_id = info.get("trace_id")
    if not isinstance(trace_id, str) or not trace_id:
        raise InvalidParameter("Missing value for required parameter 'trace_info.trace_id'.")
    return TraceInfo(
        trace_id=trace_id,
        experiment_id=_experiment_id(info),
        request_time=_timestamp_ms(info.get("request_time")),
        execution_duration=_duration_ms(info.get("execution_duration")),
        state=_state(info.get("state")),
        client_request_id=_optional_text(info, "client_request_id"),
        request_preview=_optional_text(info, "request_preview"),
        response_preview=_optional_text(info, "response_preview"),
        metadata=_pairs(info.get("trace_metadata"), "trace_metadata"),
        tags=_pairs(info.get("tags"), "tags"),
    )


def _time_json(millis: int) -> str:
    stamp = Timestamp()
    stamp.FromMilliseconds(millis)
    text: str = stamp.ToJsonString()
    return text


def _duration_json(millis: int) -> str:
    duration = Duration()
    duration.FromMilliseconds(millis)
    text: str = duration.ToJsonString()
    return text


def trace_info_json(info: TraceInfo) -> dict[str, Any]:
    """A ``TraceInfoV3`` message (unset fields left out)."""
    return {
        "trace_id": info.trace_id,
        "client_request_id": info.client_request_id,
        "trace_location": {
            "type": "MLFLOW_EXPERIMENT",
            "mlflow_experiment": {"experiment_id": info.experiment_id},
        },
        "request_preview": info.request_preview,
        "response_preview": info.response_preview,
        "request_time": _time_json(info.request_time),
        "execution_duration": (
            None if info.execution_duration is None else _duration_json(info.execution_duration)
        ),
        "state": info.state,
        "trace_metadata": dict(info.metadata),
        "tags": dict(info.tags),
    }


def trace_json(trace: Trace) -> dict[str, Any]:
    """A ``Trace`` message: the info, and the spans as the OTLP JSON they were stored as."""
    return {
        "trace_info": trace_info_json(trace.info),
        "spans": [orjson.loads(span.content) for span in trace.spans],
    }


# ---------------------------------------------------------------------- MLflow 2's TraceInfo
#: MLflow 2's ``TraceStatus`` names for the states (the unset one is spelled differently).
_LEGACY = {"STATE_UNSPECIFIED": "TRACE_STATUS_UNSPECIFIED"}
_LEGACY_NUMBERS = {0: "TRACE_STATUS_UNSPECIFIED", 1: "OK", 2: "ERROR", 3: "IN_PROGRESS"}


def legacy_status(value: Any) -> str:
    """A ``TraceStatus`` (name or number) as the state the traces domain keeps."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = _LEGACY_NUMBERS.get(value, "")
    if value == "TRACE_STATUS_UNSPECIFIED":
        return "STATE_UNSPECIFIED"
    if value not in ("OK", "ERROR", "IN_PROGRESS"):
        raise InvalidParameter("Invalid trace status; one of OK, ERROR, IN_PROGRESS.")
    return str(value)


def legacy_trace_info_json(info: TraceInfo) -> dict[str, Any]:
    """MLflow 2's ``TraceInfo`` (``request_id``, epoch milliseconds, key-value lists)."""
    return {
        "request_id": info.trace_id,
        "experiment_id": info.experiment_id,
        "timestamp_ms": info.request_time,
        "execution_time_ms": info.execution_duration,
        "status": _LEGACY.get(info.state, info.state),
        "request_metadata": [{"key": k, "value": v} for k, v in info.metadata.items()],
        "tags": [{"key": k, "value": v} for k, v in info.tags.items()],
    }


def trace_data_json(trace: Trace) -> bytes:
    """A trace's spans as MLflow's ``traces.json`` artifact: ``{"spans": [...]}``."""
    spans = [span_dict(orjson.loads(span.content)) for span in trace.spans]
    return json.dumps({"spans": spans}, ensure_ascii=False).encode()
