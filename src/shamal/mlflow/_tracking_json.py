"""Tracking entities as MLflow's protobuf JSON, and back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from shamal.errors import InvalidParameter
from shamal.mlflow._fields import INT64_MAX, INT64_MIN, Fields, parse_double
from shamal.tracking import (
    Dataset,
    DatasetInput,
    Experiment,
    HistoryRow,
    LoggedModel,
    Metric,
    Run,
    RunInfo,
)


def key_values(pairs: Mapping[str, str] | Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return [{"key": k, "value": v} for k, v in items]


def pairs_of(items: Sequence[Mapping[str, Any]], what: str) -> list[tuple[str, str]]:
    """``[{key, value}]`` from a request, checked."""
    out = []
    for item in items:
        key, value = item.get("key"), item.get("value", "")
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidParameter(f"Each {what} needs a string 'key' and a string 'value'.")
        out.append((key, value))
    return out


def experiment_json(e: Experiment) -> dict[str, Any]:
    return {
        "experiment_id": e.experiment_id,
        "name": e.name,
        "artifact_location": e.artifact_location,
        "lifecycle_stage": e.lifecycle_stage,
        "creation_time": e.creation_time,
        "last_update_time": e.last_update_time,
        "tags": key_values(e.tags),
    }


def run_info_json(i: RunInfo) -> dict[str, Any]:
    return {
        "run_id": i.run_id,
        "run_uuid": i.run_id,
        "run_name": i.run_name,
        "experiment_id": i.experiment_id,
        "user_id": i.user_id,
        "status": i.status,
        "start_time": i.start_time,
        "end_time": i.end_time,
        "artifact_uri": i.artifact_uri,
        "lifecycle_stage": i.lifecycle_stage,
    }


def metric_json(m: Metric) -> dict[str, Any]:
    return {
        "key": m.key,
        "value": m.value,
        "timestamp": m.timestamp,
        "step": m.step,
        "run_id": m.run_id,
        "model_id": m.model_id,
        "dataset_name": m.dataset_name,
        "dataset_digest": m.dataset_digest,
    }


def special_value(value: float, nan: Any) -> str:
    """Protobuf's JSON spelling of a stored NaN (flag set) or an infinity."""
    if nan or value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def history_page_json(key: str, rows: Sequence[HistoryRow], next_page_token: str | None) -> bytes:
    """A page of a metric's history as the stock server answers it, as JSON text.

    Each point carries what the stock server sends (key, value, timestamp, step; the run is
    the request's). ``v - v`` is 0.0 for every finite value and NaN (truthy) for the
    infinities, so one cheap test per point finds the values JSON has no number for. A page
    holds up to 25,000 points: orjson writes it several times faster than ``json``.
    """
    points = [
        {
            "key": key,
            "value": special_value(v, nan) if nan or v - v else v,
            "timestamp": t,
            "step": step,
        }
        for step, t, v, nan in rows
    ]
    body: dict[str, Any] = {"metrics": points}
    if next_page_token:
        body["next_page_token"] = next_page_token
    return orjson.dumps(body)


def _dataset_input_json(d: DatasetInput) -> dict[str, Any]:
    ds = d.dataset
    return {
        "tags": key_values(d.tags),
        "dataset": {
            "name": ds.name,
            "digest": ds.digest,
            "source_type": ds.source_type,
            "source": ds.source,
            "schema": ds.schema,
            "profile": ds.profile,
        },
    }


def run_json(r: Run) -> dict[str, Any]:
    return {
        "info": run_info_json(r.info),
        "data": {
            "metrics": [metric_json(m) for m in r.metrics],
            "params": key_values(r.params),
            "tags": key_values(r.tags),
        },
        "inputs": {
            "dataset_inputs": [_dataset_input_json(d) for d in r.dataset_inputs],
            "model_inputs": [{"model_id": m} for m in r.model_inputs],
        },
        "outputs": {"model_outputs": [{"model_id": m, "step": s} for m, s in r.model_outputs]},
    }


def logged_model_json(m: LoggedModel) -> dict[str, Any]:
    return {
        "info": {
            "model_id": m.model_id,
            "experiment_id": m.experiment_id,
            "name": m.name,
            "creation_timestamp_ms": m.creation_timestamp_ms,
            "last_updated_timestamp_ms": m.last_updated_timestamp_ms,
            "artifact_uri": m.artifact_location,
            "status": m.status,
            # creator_id is an int64 (a Databricks user id) in MLflow's proto: ours is a name,
            # kept in the database and the audit log, not sent.
            "model_type": m.model_type,
            "source_run_id": m.source_run_id,
            "status_message": m.status_message,
            "tags": key_values(m.tags),
        },
        "data": {
            "params": key_values(m.params),
            "metrics": [metric_json(x) for x in m.metrics],
        },
    }


def metrics_of(
    items: Sequence[Mapping[str, Any]], default_ts: int | None, *, batch: bool = False
) -> list[Metric]:
    """Metrics from a request (``log-batch`` or ``log-metric`` fields).

    Raises:
        InvalidParameter: a field is missing or malformed, a timestamp or step is not an
            int64 (MLflow's protobuf type; the database could not store it either), or a
            timestamp is negative (a stock server refuses it too). In a ``log-batch``
            (``batch``) each metric needs its key, value and timestamp, named by their place
            (``metrics[0].timestamp``) as a stock server names them; ``log-metric`` takes an
            absent timestamp as the server's time.
    """
    out = []
    for index, item in enumerate(items):
        # The shape the stock client sends (float value, int timestamp and step, nothing
        # else) is read directly: a batch is up to 1,000 of them. Anything else takes the
        # general path, which accepts every spelling protobuf JSON allows.
        key, value = item.get("key"), item.get("value")
        timestamp, step = item.get("timestamp"), item.get("step")
        if (
            len(item) == 4
            and type(key) is str
            and 0 < len(key) <= 250
            and type(value) is float
            and type(timestamp) is int
            and type(step) is int
            and 0 <= timestamp <= INT64_MAX
            and INT64_MIN <= step <= INT64_MAX
        ):
            out.append(Metric(key, value, timestamp, step))
        else:
            if batch:
                for field in ("key", "value", "timestamp"):
                    if item.get(field) in (None, ""):
                        raise InvalidParameter(
                            f"Missing value for required parameter 'metrics[{index}].{field}'."
                        )
            out.append(_metric_of(item, default_ts))
    return out


def _metric_of(item: Mapping[str, Any], default_ts: int | None) -> Metric:
    f = Fields(item)
    key = f.required("key", max_len=250)
    value = parse_double(item.get("value"), "value")
    # 0 is a time like any other (the epoch); only an absent timestamp means "now".
    given = f.integer("timestamp")
    timestamp = (default_ts or 0) if given is None else given
    if timestamp < 0:
        raise InvalidParameter(
            f"Invalid value {timestamp} for parameter 'timestamp' supplied: metric '{key}'. "
            "Timestamp must be a nonnegative long (64-bit integer)."
        )
    return Metric(
        key=key,
        value=value,
        timestamp=timestamp,
        step=f.integer("step") or 0,
        model_id=f.text("model_id", max_len=64),
        dataset_name=f.text("dataset_name", max_len=500),
        dataset_digest=f.text("dataset_digest", max_len=64),
    )


def dataset_inputs_of(items: Sequence[Mapping[str, Any]]) -> list[DatasetInput]:
    out = []
    for item in items:
        raw = item.get("dataset")
        if not isinstance(raw, dict):
            raise InvalidParameter("Each dataset input needs a 'dataset' object.")
        f = Fields(raw)
        dataset = Dataset(
            name=f.required("name", max_len=500),
            digest=f.required("digest", max_len=64),
            source_type=f.required("source_type", max_len=64),
            source=f.required("source"),
            schema=f.text("schema"),
            profile=f.text("profile"),
        )
        tags = pairs_of(Fields(item).objects("tags"), "dataset input tag")
        out.append(DatasetInput(dataset, tuple(tags)))
    return out
