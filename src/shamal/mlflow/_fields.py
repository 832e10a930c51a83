"""The MLflow REST dialect: how requests arrive and answers leave.

Shared by every router that speaks it (tracking, registry, artifacts proxy).
GET requests carry fields as query parameters (repeated keys for lists, numbers
as strings); the other methods carry a JSON object body (DELETE too). Answers
are protobuf-style JSON: int64 as numbers, enums as names, NaN and infinities
as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, unset fields omitted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from shamal.api import PageOf, gather_page
from shamal.errors import AlreadyExists, InvalidParameter, ShamalError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MLFLOW_PREFIXES",
    "Fields",
    "ProtoJSONResponse",
    "bounded_page",
    "encode_json",
    "invalid_value",
    "is_mlflow_path",
    "mlflow_status",
    "parse_double",
    "proto_json",
    "proto_json_encoded",
    "read_fields",
]

#: The MLflow version Shamal speaks: the pinned client's major.minor (``mlflow-skinny`` in
#: pyproject.toml; a test holds the two together). ``GET /version`` answers it, as a stock
#: server answers its own: MLflow 3 clients probe it before features such as ``log_spans``.
MLFLOW_VERSION = "3.17"

#: Path prefixes served in the MLflow dialect (their errors use MLflow's status mapping).
MLFLOW_PREFIXES = (
    "/api/2.0/mlflow",
    "/api/3.0/mlflow",
    "/ajax-api/2.0/mlflow",
    "/ajax-api/3.0/mlflow",
)
_MAX_LIST = 10_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_TWO_TO_63 = float(2**63)


def invalid_value(name: str, value: Any) -> InvalidParameter:
    """A value of the wrong type, refused in a stock server's words (MLflow's tests and
    clients match on them); the value is echoed as JSON, cut at 100 characters."""
    try:
        shown = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        shown = repr(value)
    if len(shown) > 100:
        shown = shown[:100] + "..."
    return InvalidParameter(
        f"Invalid value {shown} for parameter '{name}' supplied: Hint: Value was of type "
        f"'{type(value).__name__}'. See the API docs for more information about request "
        "parameters."
    )


def is_mlflow_path(path: str) -> bool:
    return path.startswith(MLFLOW_PREFIXES)


def mlflow_status(exc: ShamalError) -> int:
    """MLflow's stock status for an error: a duplicate name is 400, not 409."""
    if isinstance(exc, AlreadyExists):
        return 400
    return exc.status


class Fields:
    """The request's fields, read the same way whether they came by query or by body."""

    def __init__(self, data: Mapping[str, Any], lists: Mapping[str, list[str]] | None = None):
        self._data = data
        self._lists = lists or {}

    def raw(self, name: str) -> Any:
        return self._data.get(name)

    def text(self, name: str, *, required: bool = False, max_len: int = 100_000) -> str | None:
        value = self._data.get(name)
        if value is None or value == "":
            if required:
                raise InvalidParameter(f"Missing value for required parameter '{name}'.")
            return None if value is None else ""
        if not isinstance(value, str):
            raise invalid_value(name, value)
        if len(value) > max_len:
            raise InvalidParameter(f"Parameter '{name}' is longer than {max_len} characters.")
        return value

    def required(self, name: str, *, max_len: int = 100_000) -> str:
        value = self.text(name, required=True, max_len=max_len)
        assert value is not None
        return value

    def integer(
        self, name: str, *, required: bool = False, default: int | None = None
    ) -> int | None:
        value = self._data.get(name)
        if value is None or value == "":
            if required:
                raise InvalidParameter(f"Missing value for required parameter '{name}'.")
            return default
        if isinstance(value, bool):
            raise invalid_value(name, value)
        if isinstance(value, int):
            number = value
        elif isinstance(value, float) and value.is_integer():
            # A float of 2**63 or more holds no exact integer: past 64 bits a JSON integer is
            # read as a float (see read_fields), and -2**63 - 1 must not round into range.
            if not -_TWO_TO_63 < value < _TWO_TO_63:
                raise InvalidParameter(f"Parameter '{name}' must be a 64-bit integer.")
            number = int(value)
        elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
            try:  # isdigit() also says yes to "--1" and to "²", which int() refuses
                number = int(value)
            except ValueError:
                raise invalid_value(name, value) from None
        else:
            raise invalid_value(name, value)
        # Every integer of MLflow's protos fits an int64, and so must what the database
        # stores: a bigger one is the caller's mistake (400), not the database's (500).
        if not INT64_MIN <= number <= INT64_MAX:
            raise InvalidParameter(f"Parameter '{name}' must be a 64-bit integer.")
        return number

    def number(self, name: str, *, required: bool = False) -> float | None:
        value = self._data.get(name)
        if value is None:
            if required:
                raise InvalidParameter(f"Missing value for required parameter '{name}'.")
            return None
        return parse_double(value, name)

    def flag(self, name: str, default: bool = False) -> bool:
        value = self._data.get(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise InvalidParameter(f"Parameter '{name}' must be true or false.")

    def many(self, name: str) -> list[Any]:
        """A repeated field: repeated query keys, or a JSON list."""
        if name in self._lists:
            values: list[Any] = self._lists[name]
        else:
            raw = self._data.get(name)
            if raw is None:
                return []
            values = raw if isinstance(raw, list) else [raw]
        if len(values) > _MAX_LIST:
            raise InvalidParameter(f"Parameter '{name}' has more than {_MAX_LIST} items.")
        return values

    def objects(self, name: str) -> list[Mapping[str, Any]]:
        raw = self._data.get(name)
        if name not in self._lists and raw is not None and not isinstance(raw, list):
            raise invalid_value(name, raw)
        items = self.many(name)
        if not all(isinstance(i, dict) for i in items):
            raise invalid_value(name, raw if raw is not None else items)
        return items


def parse_double(value: Any, name: str) -> float:
    """A double as protobuf JSON sends it: a number, or "NaN" / "Infinity" / "-Infinity"."""
    if isinstance(value, bool):
        raise invalid_value(name, value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        special = {
            "nan": math.nan,
            "infinity": math.inf,
            "-infinity": -math.inf,
            "inf": math.inf,
            "-inf": -math.inf,
        }
        if value.strip().lower() in special:
            return special[value.strip().lower()]
        try:
            return float(value)
        except ValueError:
            pass
    raise invalid_value(name, value)


def _json_value(body: bytes) -> Any:
    """The body's JSON value; orjson reads a 1,000-metric ``log-batch`` about 3x faster.

    orjson refuses what only ``json`` reads (NaN and the infinities as Python clients write
    them, numbers past a double's range, UTF-16 and UTF-32, a BOM, lone surrogates), which
    ``json`` then reads as before. Both read every other body alike, but for integers past
    64 bits, which orjson gives as floats: :meth:`Fields.integer` refuses those as ``json``'s
    integers were refused.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


async def read_fields(request: Request) -> Fields:
    """The request's fields: query parameters for GET, else the JSON object body.

    Raises:
        InvalidParameter: the body is not a JSON object.
    """
    if request.method == "GET":
        query = request.query_params
        lists = {k: query.getlist(k) for k in query}
        return Fields({k: v[-1] for k, v in lists.items()}, lists)
    body = await request.body()
    if not body.strip():
        return Fields({})
    try:
        data = _json_value(body)
    except (ValueError, RecursionError):
        raise InvalidParameter("The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise InvalidParameter("The request body must be a JSON object.")
    return Fields(data)


def _protobuf_safe(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {k: _protobuf_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_protobuf_safe(v) for v in value]
    return value


def encode_json(content: Any) -> bytes:
    """``content`` as the dialect writes JSON (see :class:`ProtoJSONResponse`)."""
    safe = _protobuf_safe(content)
    try:
        # Search pages hold 1,000 runs: orjson writes them several times faster.
        return orjson.dumps(safe, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # what only ``json`` writes (an integer beyond 64 bits)
        return json.dumps(safe, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8"
        )


class ProtoJSONResponse(JSONResponse):
    """JSON with protobuf's spellings of NaN and the infinities, unset fields omitted."""

    def render(self, content: Any) -> bytes:
        return encode_json(content)


class _EncodedJSONResponse(Response):
    media_type = "application/json"


def proto_json(content: Mapping[str, Any] | None = None) -> ProtoJSONResponse:
    """A 200 answer; every 200 in the dialect is a JSON object (``{}`` when empty)."""
    return ProtoJSONResponse(dict(content or {}))


def proto_json_encoded(body: bytes) -> Response:
    """A 200 answer whose JSON object the caller wrote itself (large answers built for
    speed), in the dialect's spelling: NaN and infinities as strings, unset fields left out.
    """
    return _EncodedJSONResponse(body)


T = TypeVar("T")


def bounded_page(
    key: str,
    fetch: Callable[[int, str | None], PageOf[T]],
    to_json: Callable[[T], Mapping[str, Any]],
    *,
    max_results: int,
    page_token: str | None,
    max_bytes: int,
    resume_at: Callable[[str | None, int], str],
) -> Response:
    """A search page of at most ``max_results`` items and, past the first, ``max_bytes``
    bytes of JSON: ``{key: [...], "next_page_token": ...}``.

    Items are read in batches (``fetch(limit, token)``, see ``PAGE_BATCH``) and written as
    they come, so the server holds one batch and the page's JSON, whatever ``max_results``
    says.
    A page that stops early for its size ends with the token ``resume_at(token of the
    batch, index in it)``, which resumes exactly at the first item left out; a client that
    follows tokens sees every item once. The first item always goes in, whatever its size.
    """
    parts, token = gather_page(
        fetch,
        lambda item: encode_json(to_json(item)),
        max_results=max_results,
        page_token=page_token,
        max_bytes=max_bytes,
        resume_at=resume_at,
    )
    return _page_response(key, parts, token)


def _page_response(key: str, parts: list[bytes], token: str | None) -> Response:
    tail = b"" if token is None else b',"next_page_token":' + orjson.dumps(token)
    return proto_json_encoded(
        b"{" + orjson.dumps(key) + b":[" + b",".join(parts) + b"]" + tail + b"}"
    )
