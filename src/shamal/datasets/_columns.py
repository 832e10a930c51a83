"""What a column holds, as profiles and expectations both see it.

An Arrow type falls in one *kind* (``numeric``, ``temporal``, ``boolean``, ``string``,
``binary`` or ``other``) that decides which statistics and checks apply to it. Temporal values
are handled as their physical integers (epoch units of the type) and shown as ISO-8601 text;
every value that leaves this package is made JSON-able here.
"""

from __future__ import annotations

import base64
import math
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

__all__ = [
    "Kind",
    "Scalar",
    "canonical_type",
    "column_kind",
    "decoded",
    "float_from_json",
    "float_to_json",
    "jsonable",
    "render_temporal",
    "seconds_per_unit",
]

#: A JSON scalar.
Scalar = int | float | str | bool

Kind = Literal["numeric", "temporal", "boolean", "string", "binary", "other"]

#: Seconds in one physical unit of a temporal type.
_UNIT_SECONDS: Final[Mapping[str, float]] = {
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "ns": 1e-9,
    "day": 86400.0,
}

#: Names people write for a type, and the name Arrow prints for it.
_ALIASES: Final[Mapping[str, str]] = {
    "float64": "double",
    "float32": "float",
    "float16": "halffloat",
    "utf8": "string",
    "large_utf8": "string",
    "large_string": "string",
    "string_view": "string",
    "large_binary": "binary",
    "binary_view": "binary",
    "boolean": "bool",
    "date32": "date32[day]",
    "date64": "date64[ms]",
}


#: The type tests of each kind, in the order they are tried.
_KIND_TESTS: Final[tuple[tuple[Kind, tuple[Callable[[Any], bool], ...]], ...]] = (
    ("boolean", (pa.types.is_boolean,)),
    (
        "numeric",
        (
            pa.types.is_integer,
            pa.types.is_floating,
            pa.types.is_decimal,
            pa.types.is_duration,
            pa.types.is_time,
        ),
    ),
    ("temporal", (pa.types.is_timestamp, pa.types.is_date)),
    ("string", (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)),
    (
        "binary",
        (
            pa.types.is_binary,
            pa.types.is_large_binary,
            pa.types.is_binary_view,
            pa.types.is_fixed_size_binary,
        ),
    ),
)


def decoded(array: Any) -> Any:
    """``array`` with a dictionary encoding undone (the values, as a plain array)."""
    if pa.types.is_dictionary(array.type):
        return array.dictionary_decode()
    return array


def column_kind(data_type: Any) -> Kind:
    """The kind of values an Arrow type holds (dictionary types by their value type)."""
    if pa.types.is_dictionary(data_type):
        return column_kind(data_type.value_type)
    for kind, tests in _KIND_TESTS:
        if any(test(data_type) for test in tests):
            return kind
    return "other"


def canonical_type(name: str) -> str:
    """A type name in one spelling: Arrow's, with the string and binary families folded
    (``large_string`` and ``string_view`` are ``string``) and common aliases resolved.
    Compare two canonical names with ``casefold`` (``tz=UTC`` is ``tz=utc``)."""
    text = name.strip()
    return _ALIASES.get(text.lower(), text)


def seconds_per_unit(data_type: Any) -> float:
    """Seconds in one physical unit of a timestamp or date type."""
    if pa.types.is_date32(data_type):
        return _UNIT_SECONDS["day"]
    if pa.types.is_date64(data_type):
        return _UNIT_SECONDS["ms"]
    return _UNIT_SECONDS[data_type.unit]


def render_temporal(value: int, data_type: Any) -> str:
    """A physical temporal value as ISO-8601 text: a date for date types; a date-time for
    timestamps, ending in ``Z`` (UTC) when the type has a time zone."""
    if pa.types.is_date32(data_type):
        return str(np.datetime_as_string(np.datetime64(value, "D")))
    if pa.types.is_date64(data_type):
        return str(np.datetime_as_string(np.datetime64(value, "ms"), unit="D"))
    moment = np.datetime64(value, data_type.unit)
    if data_type.tz is not None:
        return str(np.datetime_as_string(moment, timezone="UTC"))
    return str(np.datetime_as_string(moment))


def float_to_json(value: float) -> float | str:
    """A float as JSON holds it: non-finite values as the strings ``inf``, ``-inf``, ``nan``."""
    if math.isfinite(value):
        return value
    return str(value)


def float_from_json(raw: Any) -> float:
    """The inverse of :func:`float_to_json`."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise TypeError("not a number")
    return float(raw)


def jsonable(value: Any) -> Any:
    """A value from a query result made JSON-able: times as ISO-8601 text, decimals and UUIDs
    as text, bytes as base64, durations in seconds, non-finite floats as text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    for kinds, convert in _CONVERSIONS:
        if isinstance(value, kinds):
            return convert(value)
    return str(value)


#: How values of a type become JSON, tried in order.
_CONVERSIONS: Final[tuple[tuple[type | tuple[type, ...], Callable[[Any], Any]], ...]] = (
    (float, float_to_json),
    ((datetime, date, time), lambda v: v.isoformat()),
    (timedelta, lambda v: v.total_seconds()),
    ((bytes, bytearray, memoryview), lambda v: base64.b64encode(bytes(v)).decode("ascii")),
    ((Decimal, uuid.UUID), str),
)
