"""Column profiles computed while batches stream by.

A :class:`Profiler` sees each Arrow batch once and keeps, per column, bounded state: counts,
exact min/max and moments, and the sketches of :mod:`._sketches`. Profilers fed different
partitions merge into the profiler of the whole, so a dataset can be profiled in parallel.
:meth:`Profiler.result` gives a frozen :class:`Profile` that round-trips through JSON.

Columns named *personal* keep no raw value anywhere, not in the profiler's state nor in the
profile: only their counts, nulls and distinct estimate (from seeded hashes).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped,unused-ignore]

from shamal.datasets._columns import (
    Kind,
    Scalar,
    column_kind,
    decoded,
    float_from_json,
    float_to_json,
    render_temporal,
    seconds_per_unit,
)
from shamal.datasets._sketches import (
    DistinctSketch,
    QuantileSketch,
    TopValues,
    hash_bytes,
    hash_words,
)
from shamal.errors import InvalidParameter

__all__ = ["QUANTILES", "ColumnProfile", "Profile", "Profiler", "TopValue"]

logger = logging.getLogger(__name__)

#: The quantiles a profile names, as (name, rank).
QUANTILES: Final[tuple[tuple[str, float], ...]] = (
    ("p1", 0.01),
    ("p5", 0.05),
    ("p25", 0.25),
    ("p50", 0.50),
    ("p75", 0.75),
    ("p95", 0.95),
    ("p99", 0.99),
)
_RANKS: Final = np.linspace(0.0, 1.0, 101)
_SKETCHED: Final[frozenset[Kind]] = frozenset({"numeric", "temporal"})
_COUNTED: Final[frozenset[Kind]] = frozenset({"numeric", "temporal", "string", "boolean"})


@dataclass(frozen=True, slots=True)
class TopValue:
    """A frequent value: its estimated count, over-estimated by at most ``error``."""

    value: Scalar
    count: int
    error: int


@dataclass(frozen=True, slots=True)
class ColumnProfile:
    """What one column held.

    ``count`` is every row, ``nulls`` the null ones, ``nans`` the NaN floats (left out of
    every other statistic). ``min``/``max`` read as the values do (temporal ones as ISO-8601
    text). ``mean``, ``std`` and ``percentiles`` are numbers; for temporal columns, seconds
    since the Unix epoch (UTC). ``percentiles`` holds the 101 values at ranks 0, 0.01, ...,
    1 (first and last exact, the others from the sketch). A personal column has only
    ``count``, ``nulls``, ``nans`` and ``distinct``.
    """

    name: str
    type: str
    kind: Kind
    personal: bool
    count: int
    nulls: int
    nans: int
    distinct: int | None
    min: Scalar | None = None
    max: Scalar | None = None
    mean: float | None = None
    std: float | None = None
    percentiles: tuple[float, ...] | None = None
    top_values: tuple[TopValue, ...] = ()

    @property
    def null_rate(self) -> float:
        return self.nulls / self.count if self.count else 0.0

    @property
    def quantiles(self) -> dict[str, float]:
        """The named quantiles p1 ... p99 (empty without percentiles)."""
        return {name: self.quantile(rank) for name, rank in QUANTILES} if self.percentiles else {}

    def quantile(self, rank: float) -> float:
        """The value at a normalized rank in [0, 1], interpolated between percentiles.

        Raises:
            InvalidParameter: the column has no percentiles, or the rank is outside [0, 1].
        """
        if self.percentiles is None or not 0.0 <= rank <= 1.0:
            raise InvalidParameter(f"column {self.name!r} has no quantile at rank {rank}.")
        return float(np.interp(rank, _RANKS, np.asarray(self.percentiles)))

    def to_json(self) -> dict[str, Any]:
        numeric = self.kind in _SKETCHED
        return {
            "name": self.name,
            "type": self.type,
            "kind": self.kind,
            "personal": self.personal,
            "count": self.count,
            "nulls": self.nulls,
            "nans": self.nans,
            "distinct": self.distinct,
            "min": _scalar_out(self.min, numeric),
            "max": _scalar_out(self.max, numeric),
            "mean": None if self.mean is None else float_to_json(self.mean),
            "std": None if self.std is None else float_to_json(self.std),
            "quantiles": {k: float_to_json(v) for k, v in self.quantiles.items()},
            "percentiles": (
                None if self.percentiles is None else [float_to_json(v) for v in self.percentiles]
            ),
            "top_values": [
                {"value": _scalar_out(t.value, numeric), "count": t.count, "error": t.error}
                for t in self.top_values
            ],
        }

    @classmethod
    def from_json(cls, raw: Any) -> ColumnProfile:
        """A column profile as :meth:`to_json` wrote it.

        Raises:
            InvalidParameter: a field is missing or of the wrong type.
        """
        try:
            return cls._from_json(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidParameter(f"a column profile is malformed ({exc!r}).") from None

    @classmethod
    def _from_json(cls, raw: Mapping[str, Any]) -> ColumnProfile:
        kind = raw["kind"]
        if kind not in ("numeric", "temporal", "boolean", "string", "binary", "other"):
            raise ValueError(f"kind {kind!r}")
        numeric = kind in _SKETCHED
        percentiles = raw["percentiles"]
        return cls(
            name=_text(raw["name"]),
            type=_text(raw["type"]),
            kind=kind,
            personal=bool(raw["personal"]),
            count=_integer(raw["count"]),
            nulls=_integer(raw["nulls"]),
            nans=_integer(raw["nans"]),
            distinct=None if raw["distinct"] is None else _integer(raw["distinct"]),
            min=_scalar_in(raw["min"], numeric),
            max=_scalar_in(raw["max"], numeric),
            mean=None if raw["mean"] is None else float_from_json(raw["mean"]),
            std=None if raw["std"] is None else float_from_json(raw["std"]),
            percentiles=(
                None
                if percentiles is None
                else tuple(float_from_json(v) for v in _sized(percentiles, 101))
            ),
            top_values=tuple(
                TopValue(
                    _present(_scalar_in(t["value"], numeric)),
                    _integer(t["count"]),
                    _integer(t["error"]),
                )
                for t in raw["top_values"]
            ),
        )


@dataclass(frozen=True, slots=True)
class Profile:
    """The profile of a whole dataset (or of every batch a profiler saw): frozen."""

    rows: int
    columns: tuple[ColumnProfile, ...]

    def column(self, name: str) -> ColumnProfile:
        """The profile of one column.

        Raises:
            InvalidParameter: no column has that name.
        """
        for column in self.columns:
            if column.name == name:
                return column
        raise InvalidParameter(f"the profile has no column {name!r}.")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "columns": [c.to_json() for c in self.columns]}

    @classmethod
    def from_json(cls, raw: Any) -> Profile:
        """A profile as :meth:`to_json` wrote it.

        Raises:
            InvalidParameter: the document is not a profile.
        """
        if not isinstance(raw, Mapping) or not isinstance(raw.get("columns"), list):
            raise InvalidParameter("a profile needs rows and columns.")
        try:
            rows = _integer(raw["rows"])
        except (KeyError, TypeError, ValueError):
            raise InvalidParameter("a profile needs a row count.") from None
        return cls(rows, tuple(ColumnProfile.from_json(c) for c in raw["columns"]))


class Profiler:
    """Profiles a dataset one Arrow batch at a time, in bounded memory.

    The first batch fixes the schema; every later batch must have the same column names and
    types. Two profilers with the same settings merge (:meth:`merge`) into the profile of
    everything both saw. Deterministic for a given seed and order of batches and merges.
    Not thread-safe: use one profiler per worker and merge them.

    Args:
        personal: names of columns that hold personal data: no raw value of theirs is kept.
        seed: seeds the hashes (distinct counts) and the quantile sketch's coin flips.
        quantile_k: size of the quantile sketch (rank error about 1.7/k at 99 % confidence).
        top_k: how many top values a column profile lists.
        distinct_precision: HyperLogLog precision p (relative error about 1.04/sqrt(2**p)).
    """

    def __init__(
        self,
        personal: Iterable[str] = (),
        *,
        seed: int = 0,
        quantile_k: int = 400,
        top_k: int = 10,
        distinct_precision: int = 14,
    ) -> None:
        if quantile_k < 8 or not 1 <= top_k <= 1000 or not 4 <= distinct_precision <= 18:
            raise InvalidParameter(
                "profiler settings: quantile_k >= 8, top_k in [1, 1000], "
                "distinct_precision in [4, 18]."
            )
        self.personal = frozenset(personal)
        self.seed = seed
        self.quantile_k = quantile_k
        self.top_k = top_k
        self.distinct_precision = distinct_precision
        self._schema: Any = None
        self._rows = 0
        self._columns: list[_ColumnState] = []

    @property
    def _settings(self) -> tuple[Any, ...]:
        return (self.personal, self.seed, self.quantile_k, self.top_k, self.distinct_precision)

    def update(self, batch: Any) -> None:
        """Profile one more ``pyarrow.RecordBatch`` (a ``pyarrow.Table`` is taken batch by batch).

        Raises:
            InvalidParameter: the batch's schema differs from the first one's, or a personal
                column is not in it.
        """
        if isinstance(batch, pa.Table):
            # An empty table has no batches, but still fixes the schema.
            for part in batch.to_batches() or [_empty_batch(batch.schema)]:
                self.update(part)
            return
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidParameter("a profiler takes Arrow record batches or tables.")
        if self._schema is None:
            self._start(batch.schema)
        elif not batch.schema.equals(self._schema, check_metadata=False):
            raise InvalidParameter("a batch's schema differs from the first batch's.")
        self._rows += batch.num_rows
        for state, array in zip(self._columns, batch.columns, strict=True):
            state.update(array)

    def _start(self, schema: Any) -> None:
        missing = sorted(self.personal - set(schema.names))
        if missing:
            raise InvalidParameter(f"personal columns not in the data: {', '.join(missing)}.")
        if len(set(schema.names)) != len(schema.names):
            raise InvalidParameter("the data has two columns of the same name.")
        self._schema = schema
        self._columns = [
            _ColumnState(field.name, field.type, field.name in self.personal, self)
            for field in schema
        ]

    def merge(self, other: Profiler) -> None:
        """Take in everything ``other`` saw (``other`` is left as it was).

        Raises:
            InvalidParameter: the two profilers' settings or schemas differ.
        """
        if other._settings != self._settings:
            raise InvalidParameter("profilers with different settings do not merge.")
        if other._schema is None:
            return
        if self._schema is None:
            self._schema = other._schema
            self._rows = other._rows
            self._columns = copy.deepcopy(other._columns)
            return
        if not other._schema.equals(self._schema, check_metadata=False):
            raise InvalidParameter("profilers of different schemas do not merge.")
        self._rows += other._rows
        for mine, theirs in zip(self._columns, other._columns, strict=True):
            mine.merge(theirs)

    def result(self) -> Profile:
        """The profile of everything seen so far (the profiler can go on after)."""
        return Profile(self._rows, tuple(state.result(self.top_k) for state in self._columns))


class _Moments:
    """Count, mean and sum of squared deviations, merged by Chan's formula."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0

    def update(self, values: npt.NDArray[np.float64]) -> None:
        if values.size == 0:
            return
        other = _Moments()
        with np.errstate(all="ignore"):
            other.n = int(values.size)
            other.mean = float(values.mean())
            other.m2 = float(np.square(values - other.mean).sum())
        self.merge(other)

    def merge(self, other: _Moments) -> None:
        if other.n == 0:
            return
        n = self.n + other.n
        with np.errstate(all="ignore"):
            delta = other.mean - self.mean
            self.mean = self.mean + delta * other.n / n if self.n else other.mean
            self.m2 = self.m2 + other.m2 + delta * delta * self.n * other.n / n
        self.n = n


class _ColumnState:
    """What a profiler keeps of one column: no raw value when the column is personal."""

    def __init__(self, name: str, data_type: Any, personal: bool, owner: Profiler) -> None:
        self.name = name
        self.type = data_type
        self.value_type = data_type.value_type if pa.types.is_dictionary(data_type) else data_type
        self.kind = column_kind(data_type)
        self.personal = personal
        self.seed = owner.seed
        self.count = 0
        self.nulls = 0
        self.nans = 0
        self.distinct = DistinctSketch(owner.distinct_precision) if self.kind != "other" else None
        keeps_values = not personal
        self.low: Any = None
        self.high: Any = None
        self.moments = (
            _Moments() if keeps_values and self.kind in ("numeric", "temporal", "boolean") else None
        )
        self.sketch = (
            QuantileSketch(owner.quantile_k, dtype=_sketch_dtype(self.value_type), seed=owner.seed)
            if keeps_values and self.kind in _SKETCHED
            else None
        )
        self.top = (
            TopValues(max(100, 10 * owner.top_k))
            if keeps_values and self.kind in _COUNTED
            else None
        )

    def update(self, array: Any) -> None:
        values = decoded(array)
        self.count += len(values)
        self.nulls += values.null_count
        values = values.drop_null()
        if self.kind in _SKETCHED:
            self._numbers(_numbers(values, self.value_type))
        elif self.kind == "boolean":
            flags = values.to_numpy(zero_copy_only=False).astype(np.int64)
            self._hash(hash_words(flags, self.seed))
            if self.moments is not None:
                self.moments.update(flags.astype(np.float64))
            self._top(values)
        elif self.top is not None and len(values):
            # A string column whose values are kept: counted once, and the distinct values
            # alone hashed and compared (the sketch and the extremes are the same as from
            # every value, at the cost of the batch's distinct values, not its rows).
            counted = pc.value_counts(values)
            distinct = counted.field("values")
            self._hash(hash_bytes(*_offsets_and_data(distinct), self.seed))
            extremes = pc.min_max(distinct)
            self._extremes(extremes["min"].as_py(), extremes["max"].as_py())
            self._top_counted(counted)
        elif self.kind in ("string", "binary"):
            self._hash(hash_bytes(*_offsets_and_data(values), self.seed))

    def _numbers(self, numbers: npt.NDArray[Any]) -> None:
        if numbers.dtype.kind == "f":
            nan = np.isnan(numbers)
            self.nans += int(nan.sum())
            numbers = numbers[~nan] + 0.0  # + 0.0 folds -0.0 into 0.0 for hashing
        if self.personal or numbers.size == 0 or self.top is None:
            self._hash(hash_words(numbers, self.seed))
            return
        # One sort serves the extremes, the sketch and the counts (runs of equal values):
        # cheaper than a hash table of every value when most of them are distinct.
        ordered = np.sort(numbers, kind="stable")
        self._extremes(ordered[0].item(), ordered[-1].item())
        scale = seconds_per_unit(self.value_type) if self.kind == "temporal" else 1.0
        if self.moments is not None:
            self.moments.update(ordered.astype(np.float64) * scale)
        if self.sketch is not None:
            self.sketch.update(ordered)
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        distinct = ordered[starts]
        counts = np.diff(np.append(starts, ordered.size))
        # Only the distinct values are hashed (a repeated hash leaves the sketch as it was).
        self._hash(hash_words(distinct, self.seed))
        self._top_counts(pa.array(distinct), counts)

    def _hash(self, hashes: npt.NDArray[np.uint64]) -> None:
        if self.distinct is not None:
            self.distinct.update(hashes)

    def _extremes(self, low: Any, high: Any) -> None:
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def _top(self, values: Any) -> None:
        if self.top is None or len(values) == 0:
            return
        self._top_counted(pc.value_counts(values))

    def _top_counted(self, counted: Any) -> None:
        """Take a batch's value counts (Arrow's ``value_counts``) into the top values; only
        the values the summary can hold become Python objects."""
        self._top_counts(counted.field("values"), counted.field("counts").to_numpy())

    def _top_counts(self, values: Any, counts: npt.NDArray[Any]) -> None:
        """Take a batch's distinct ``values`` (an Arrow array) and their ``counts``."""
        assert self.top is not None
        counts = counts.astype(np.int64)
        capacity = self.top.capacity
        if len(counts) <= capacity:
            self.top.update(values.to_pylist(), counts)
            return
        kept = np.argpartition(-counts, capacity)[:capacity]
        dropped = np.ones(len(counts), dtype=bool)
        dropped[kept] = False
        floor = int(counts[dropped].max())
        self.top.update(values.take(pa.array(kept)).to_pylist(), counts[kept], floor=floor)

    def merge(self, other: _ColumnState) -> None:
        self.count += other.count
        self.nulls += other.nulls
        self.nans += other.nans
        if self.distinct is not None and other.distinct is not None:
            self.distinct.merge(other.distinct)
        if other.low is not None:
            self._extremes(other.low, other.high)
        if self.moments is not None and other.moments is not None:
            self.moments.merge(other.moments)
        if self.sketch is not None and other.sketch is not None:
            self.sketch.merge(other.sketch)
        if self.top is not None and other.top is not None:
            self.top.merge(other.top)

    def result(self, top_k: int) -> ColumnProfile:
        seen = self.count - self.nulls - self.nans
        profile = ColumnProfile(
            name=self.name,
            type=str(self.type),
            kind=self.kind,
            personal=self.personal,
            count=self.count,
            nulls=self.nulls,
            nans=self.nans,
            distinct=(
                None if self.distinct is None else min(self.distinct.estimate(), max(seen, 0))
            ),
        )
        if self.personal:
            return profile
        mean, std = self._mean_std()
        return dataclasses.replace(
            profile,
            min=self._render(self.low),
            max=self._render(self.high),
            mean=mean,
            std=std,
            percentiles=self._percentiles(),
            top_values=tuple(
                TopValue(_present(self._render(value)), count, error)
                for value, count, error in (self.top.top(top_k) if self.top else [])
            ),
        )

    def _mean_std(self) -> tuple[float | None, float | None]:
        if self.moments is None or self.moments.n == 0:
            return None, None
        with np.errstate(all="ignore"):
            std = math.sqrt(self.moments.m2 / self.moments.n) if self.moments.m2 >= 0 else 0.0
        return self.moments.mean, std

    def _percentiles(self) -> tuple[float, ...] | None:
        if self.sketch is None or self.sketch.count == 0:
            return None
        values = self.sketch.quantiles(_RANKS).astype(np.float64)
        values[0], values[-1] = float(self.low), float(self.high)
        if self.kind == "temporal":
            values = values * seconds_per_unit(self.value_type)
        return tuple(float(v) for v in values)

    def _render(self, value: Any) -> Scalar | None:
        if value is None:
            return None
        if self.kind == "temporal":
            return render_temporal(int(value), self.value_type)
        assert isinstance(value, int | float | str | bool)
        return value


def _empty_batch(schema: Any) -> Any:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


def _sketch_dtype(data_type: Any) -> Any:
    """Exact int64 for integers (up to 63 bits) and temporal values; float64 otherwise."""
    if pa.types.is_floating(data_type) or pa.types.is_decimal(data_type):
        return np.float64
    if pa.types.is_uint64(data_type):
        return np.float64
    return np.int64


def _numbers(values: Any, data_type: Any) -> npt.NDArray[Any]:
    """A null-free numeric or temporal Arrow array as numpy numbers (physical units)."""
    numbers: npt.NDArray[Any]
    if pa.types.is_decimal(data_type):
        numbers = pc.cast(values, pa.float64(), safe=False).to_numpy()
    elif pa.types.is_floating(data_type) or pa.types.is_uint64(data_type):
        numbers = values.to_numpy().astype(np.float64)
    elif pa.types.is_integer(data_type):
        numbers = values.to_numpy().astype(np.int64)
    else:
        physical = pa.int64() if data_type.bit_width == 64 else pa.int32()
        numbers = values.view(physical).to_numpy().astype(np.int64)
    return numbers


def _offsets_and_data(values: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """The offsets and bytes of a null-free string or binary Arrow array."""
    data_type = values.type
    n = len(values)
    data: npt.NDArray[np.uint8]
    if pa.types.is_fixed_size_binary(data_type):
        width = data_type.byte_width
        data = np.frombuffer(values.buffers()[1], dtype=np.uint8)[values.offset * width :]
        return np.arange(n + 1, dtype=np.int64) * width, data
    if pa.types.is_string_view(data_type) or pa.types.is_binary_view(data_type):
        values = values.cast(pa.large_binary())
        data_type = values.type
    wide = pa.types.is_large_string(data_type) or pa.types.is_large_binary(data_type)
    buffers = values.buffers()
    raw = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32)
    offsets = np.asarray(raw[values.offset : values.offset + n + 1], dtype=np.int64)
    data = (
        np.empty(0, dtype=np.uint8)
        if buffers[2] is None
        else np.frombuffer(buffers[2], dtype=np.uint8)
    )
    return offsets, data


def _scalar_out(value: Scalar | None, numeric: bool) -> Any:
    if numeric and isinstance(value, float):
        return float_to_json(value)
    return value


def _scalar_in(raw: Any, numeric: bool) -> Scalar | None:
    if raw is None or isinstance(raw, bool | int | float):
        return raw
    if isinstance(raw, str):
        return float(raw) if numeric and raw in ("inf", "-inf", "nan") else raw
    raise TypeError(f"not a scalar: {type(raw).__name__}")


def _present(value: Scalar | None) -> Scalar:
    if value is None:
        raise TypeError("a top value is null")
    return value


def _text(raw: Any) -> str:
    if not isinstance(raw, str):
        raise TypeError("not a string")
    return raw


def _integer(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError("not an integer")
    return raw


def _sized(raw: Any, size: int) -> list[Any]:
    if not isinstance(raw, list) or len(raw) != size:
        raise ValueError(f"expected a list of {size}")
    return raw
