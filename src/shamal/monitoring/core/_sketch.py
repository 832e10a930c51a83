"""Column sketches: a bounded, JSON-able summary of one column, reference or current.

A monitor compares sketches, never raw tables: the reference is summarised once (from the
training dataset version and the model's predictions on it) and each window of live traffic
is summarised the same way, so neither side is ever reloaded whole.

How a numeric column is summarised (:class:`SketchBuilder`):

- counts of rows, nulls (null and NaN), non-finite values (+-inf) and *invalid* values (a value
  of the wrong type, e.g. a string in a numeric column: the live monitor must survive a
  type-changed column, so such values are counted, never raised on);
- min, max, mean and population standard deviation of the finite values (streaming moments,
  Chan et al.'s pairwise update: exact up to rounding whatever the batching);
- the values at :data:`QUANTILE_RANKS` (1,017 ranks, 0 to 1 by 0.001, finer in the tails),
  from a deterministic multi-level compactor (the KLL / MRL scheme: a level holds values of
  weight ``2**h``; a full level is sorted and every other value moves up, offsets
  alternating). Exact while a column has at most ``_LEVEL_CAPACITY`` finite values; beyond,
  the rank error of a quantile is at most ``(levels + 2) / _LEVEL_CAPACITY`` (about 0.1% at
  a million values) and in practice far less (0.015% measured), the alternating offsets
  cancelling. Memory: ``_LEVEL_CAPACITY`` values per level, a level per doubling: under
  2 MB per column at a billion rows;
- ``str(value) -> count`` while the column has at most :data:`DISTINCT_LIMIT` distinct values;
- its :data:`TAIL_VALUES` smallest and largest values (exact tails for the binned tests);
- the exact finite values while there are at most :data:`EXACT_LIMIT` of them.

A categorical column (strings, booleans, dictionary arrays, or any column given the kind) keeps
value counts, at most :data:`CATEGORY_LIMIT` of them (the rarest beyond that are folded under
:data:`OTHER`), and its exact values while there are at most :data:`EXACT_LIMIT` of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shamal.errors import InvalidParameter

__all__ = [
    "CATEGORY_LIMIT",
    "DISTINCT_LIMIT",
    "EXACT_LIMIT",
    "OTHER",
    "QUANTILE_RANKS",
    "TAIL_VALUES",
    "ColumnSketch",
    "Kind",
    "SketchBuilder",
]

Kind = Literal["numeric", "categorical"]
KINDS: Final = ("numeric", "categorical")

#: A column with at most this many rows keeps its exact values (small-sample tests need them).
EXACT_LIMIT: Final = 1000
#: The key under which categories beyond the kept ones are counted.
OTHER: Final = "\x00other"
#: A categorical column keeps at most this many categories (plus :data:`OTHER`).
CATEGORY_LIMIT: Final = 1000
#: A numeric column keeps value counts while it has at most this many distinct values.
DISTINCT_LIMIT: Final = 100
_TAIL: Final = (1e-6, 1e-5, 5e-5, 1e-4, 2e-4, 3e-4, 5e-4, 7e-4)
#: The ranks of a numeric sketch's quantiles: 0.001 apart, finer in the tails (where a
#: distribution's quantile function bends most), the min and the max at the ends.
QUANTILE_RANKS: Final[tuple[float, ...]] = (
    (0.0, *_TAIL)
    + tuple(i / 1000 for i in range(1, 1000))
    + (*(1.0 - t for t in reversed(_TAIL)), 1.0)
)
#: A numeric sketch keeps this many of its smallest and of its largest values.
TAIL_VALUES: Final = 64
#: Values per level of the quantile compactor (see the module's docstring).
_LEVEL_CAPACITY: Final = 8192
#: Caps on hostile JSON: a name's length and a category's length.
_MAX_NAME = 1000
_MAX_KEY = 10_000

FloatArray = npt.NDArray[np.float64]
_RANKS: Final = np.asarray(QUANTILE_RANKS, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class ColumnSketch:
    """Bounded summary of one column.

    Attributes:
        name: the column.
        kind: numeric or categorical.
        count: rows seen, nulls included.
        nulls: null values (and NaN floats).
        nonfinite: +-inf values of a numeric column (left out of the statistics).
        min, max, mean, std: of the finite values (numeric only; ``std`` is the population
            standard deviation, as ``numpy.std``).
        quantiles: numeric: the values at :data:`QUANTILE_RANKS`.
        counts: categorical: value -> count (capped; the rest under :data:`OTHER`);
            numeric with few distinct values: ``repr(float(value))`` -> count.
        values: the exact valid values (not null; numeric: finite) while there are at most
            :data:`EXACT_LIMIT` of them (Evidently's small-sample tests run on exactly these).
        invalid: values of the wrong type (a string in a numeric column, an object that is
            not a category): counted, left out of the statistics. ``count`` = ``nulls`` +
            ``nonfinite`` + ``invalid`` + the values the statistics describe (:attr:`valid`).
        tails: numeric: the :data:`TAIL_VALUES` smallest and the :data:`TAIL_VALUES` largest
            finite values, sorted (a quantile grid cannot say where a sparse tail's few
            values lie; binned tests need it).
    """

    name: str
    kind: Kind
    count: int
    nulls: int = 0
    nonfinite: int = 0
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    quantiles: tuple[float, ...] | None = None
    counts: Mapping[str, int] | None = None
    values: tuple[float | str, ...] | None = None
    invalid: int = 0
    tails: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    @property
    def valid(self) -> int:
        """The values the statistics describe (not null, finite, of the column's kind)."""
        return self.count - self.nulls - self.nonfinite - self.invalid

    def to_json(self) -> dict[str, Any]:
        """A JSON object (only finite numbers; :meth:`from_json` reads it back)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "count": self.count,
            "nulls": self.nulls,
            "nonfinite": self.nonfinite,
            "invalid": self.invalid,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "std": self.std,
            "quantiles": None if self.quantiles is None else list(self.quantiles),
            "counts": None if self.counts is None else dict(self.counts),
            "values": None if self.values is None else list(self.values),
            "tails": None if self.tails is None else [list(t) for t in self.tails],
        }

    @classmethod
    def from_json(cls, raw: Any) -> ColumnSketch:
        """The sketch ``raw`` (from :meth:`to_json`) describes.

        Raises:
            InvalidParameter: ``raw`` is not such an object: unknown or missing fields, wrong
                types, NaN or infinite numbers, negative or inconsistent counts, lists longer
                than a sketch holds, quantiles out of order.
        """
        if not isinstance(raw, Mapping):
            raise InvalidParameter("a column sketch must be a JSON object")
        unknown = set(raw) - _FIELDS
        if unknown:
            raise InvalidParameter(f"unknown column sketch fields: {sorted(map(str, unknown))[:5]}")
        name = _text(raw.get("name"), "name", _MAX_NAME)
        kind = raw.get("kind")
        if kind not in KINDS:
            raise InvalidParameter("a column sketch's kind must be 'numeric' or 'categorical'")
        count = _count(raw.get("count"), "count")
        nulls = _count(raw.get("nulls", 0), "nulls")
        nonfinite = _count(raw.get("nonfinite", 0), "nonfinite")
        invalid = _count(raw.get("invalid", 0), "invalid")
        if nulls + nonfinite + invalid > count:
            raise InvalidParameter("a column sketch counts more nulls than rows")
        numbers = {k: _number(raw.get(k), k) for k in ("min", "max", "mean", "std")}
        sketch = cls(
            name=name,
            kind=cast(Kind, kind),
            count=count,
            nulls=nulls,
            nonfinite=nonfinite,
            invalid=invalid,
            quantiles=_quantiles(raw.get("quantiles")),
            counts=_counts(raw.get("counts"), count),
            values=_values(raw.get("values"), kind, count),
            tails=_tails(raw.get("tails"), count),
            **numbers,
        )
        _check_shape(sketch)
        return sketch


_FIELDS: Final = frozenset(
    ("name", "kind", "count", "nulls", "nonfinite", "invalid", "min", "max", "mean", "std")
    + ("quantiles", "counts", "values", "tails")
)


def _text(raw: Any, what: str, limit: int) -> str:
    if not isinstance(raw, str) or len(raw) > limit:
        raise InvalidParameter(f"a column sketch's {what} must be a string of at most {limit}")
    return raw


def _count(raw: Any, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0 or raw >= 2**63:
        raise InvalidParameter(f"a column sketch's {what} must be a non-negative integer")
    return raw


def _number(raw: Any, what: str) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise InvalidParameter(f"a column sketch's {what} must be a finite number or null")
    return float(raw)


def _quantiles(raw: Any) -> tuple[float, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != len(QUANTILE_RANKS):
        raise InvalidParameter(f"a column sketch's quantiles must be {len(QUANTILE_RANKS)} numbers")
    values = tuple(cast(float, _number(v, "quantiles")) for v in raw if v is not None)
    if len(values) != len(raw) or any(b < a for a, b in zip(values, values[1:], strict=False)):
        raise InvalidParameter("a column sketch's quantiles must be numbers in increasing order")
    return values


def _counts(raw: Any, count: int) -> dict[str, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or len(raw) > max(CATEGORY_LIMIT, DISTINCT_LIMIT) + 1:
        raise InvalidParameter(
            f"a column sketch's counts must be an object of at most {CATEGORY_LIMIT + 1} entries"
        )
    counts = {_text(k, "category", _MAX_KEY): _count(v, "category count") for k, v in raw.items()}
    if sum(counts.values()) > count:
        raise InvalidParameter("a column sketch's counts add up to more than its rows")
    return counts


def _values(raw: Any, kind: Any, count: int) -> tuple[float | str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > min(count, EXACT_LIMIT):
        raise InvalidParameter(
            f"a column sketch's values must be a list of at most {EXACT_LIMIT} (and its count)"
        )
    if kind == "numeric":
        if any(v is None for v in raw):
            raise InvalidParameter("a column sketch's values must not hold nulls")
        return tuple(cast(float, _number(v, "values")) for v in raw)
    return tuple(_text(v, "values", _MAX_KEY) for v in raw)


def _tails(raw: Any, count: int) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 2:
        raise InvalidParameter("a column sketch's tails must be two lists")
    out = []
    for tail in raw:
        if not isinstance(tail, list) or len(tail) > min(TAIL_VALUES, count):
            raise InvalidParameter(f"a column sketch's tails hold at most {TAIL_VALUES} values")
        values = tuple(cast(float, _number(v, "tails")) for v in tail if v is not None)
        if len(values) != len(tail) or any(b < a for a, b in zip(values, values[1:], strict=False)):
            raise InvalidParameter("a column sketch's tails must be numbers in increasing order")
        out.append(values)
    if len(out[0]) != len(out[1]) or not out[0]:
        raise InvalidParameter("a column sketch's tails must be as long as each other")
    return out[0], out[1]


def _check_shape(sketch: ColumnSketch) -> None:
    """A categorical sketch has none of the numeric fields; a numeric one's fit together."""
    numeric = (sketch.min, sketch.max, sketch.mean, sketch.std, sketch.quantiles, sketch.tails)
    if sketch.kind == "categorical":
        if any(v is not None for v in numeric):
            raise InvalidParameter("a categorical column sketch has no numeric statistics")
        return
    present = [v is not None for v in numeric]
    if any(present) and not all(present):
        raise InvalidParameter(
            "a numeric column sketch has all of min, max, mean, std, quantiles, tails or none"
        )
    if sketch.min is not None and sketch.max is not None and sketch.min > sketch.max:
        raise InvalidParameter("a numeric column sketch's min exceeds its max")
    if sketch.std is not None and sketch.std < 0:
        raise InvalidParameter("a numeric column sketch's std must not be negative")
    if sketch.counts is not None:
        for key in sketch.counts:
            _numeric_key(key)


def _numeric_key(key: str) -> float:
    try:
        value = float(key)
    except ValueError:
        raise InvalidParameter("a numeric column sketch's count keys must be numbers") from None
    if not math.isfinite(value):
        raise InvalidParameter("a numeric column sketch's count keys must be finite")
    return value


def numeric_key(value: float) -> str:
    """The key of a numeric value in :attr:`ColumnSketch.counts` (``-0.0`` is ``0.0``)."""
    return repr(float(value) + 0.0)


def category_key(value: Any) -> str:
    """The key of a category: strings as they are, integral numbers without ``.0``."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


# --------------------------------------------------------------------------------------------
# The streaming builder
# --------------------------------------------------------------------------------------------


class _Compactor:
    """Deterministic multi-level quantile compactor (see the module's docstring)."""

    __slots__ = ("_flip", "_levels", "_sizes")

    def __init__(self) -> None:
        self._levels: list[list[FloatArray]] = [[]]
        self._sizes: list[int] = [0]
        self._flip: list[int] = [0]

    def add(self, sorted_run: FloatArray) -> None:
        """Adds finite values (sorted) of weight 1."""
        self._levels[0].append(sorted_run)
        self._sizes[0] += sorted_run.size
        level = 0
        while level < len(self._sizes) and self._sizes[level] >= _LEVEL_CAPACITY:
            self._compact(level)
            level += 1

    def _compact(self, level: int) -> None:
        runs = self._levels[level]
        merged = runs[0] if len(runs) == 1 else np.sort(np.concatenate(runs), kind="stable")
        keep = merged[-1:] if merged.size % 2 else merged[:0]
        body = merged[: merged.size - keep.size]
        offset = self._flip[level]
        self._flip[level] ^= 1
        if level + 1 == len(self._levels):
            self._levels.append([])
            self._sizes.append(0)
            self._flip.append(0)
        promoted = body[offset::2]
        self._levels[level + 1].append(promoted)
        self._sizes[level + 1] += promoted.size
        self._levels[level] = [keep] if keep.size else []
        self._sizes[level] = keep.size

    def quantiles(self, lowest: float, highest: float) -> tuple[float, ...]:
        """The values at :data:`QUANTILE_RANKS` (linear interpolation, numpy's default)."""
        values = [np.concatenate(runs) for runs in self._levels if runs]
        weights = [
            np.full(sum(r.size for r in runs), 2.0**h)
            for h, runs in enumerate(self._levels)
            if runs
        ]
        flat = np.concatenate(values)
        order = np.argsort(flat, kind="stable")
        flat = flat[order]
        w = np.concatenate(weights)[order]
        total = float(w.sum())
        if total <= 1:
            return tuple(float(flat[0]) for _ in QUANTILE_RANKS)
        # The position of each value is the middle of its block of ranks; with all weights 1
        # this is numpy's linear rule (position i of n at rank i / (n - 1)).
        positions = (np.cumsum(w) - w / 2 - 0.5) / (total - 1)
        # Interpolated on values scaled below 1 in magnitude: no overflow near the float max.
        exponent = math.frexp(max(abs(lowest), abs(highest)))[1]
        out = np.ldexp(np.interp(_RANKS, positions, np.ldexp(flat, -exponent)), exponent)
        out[0], out[-1] = lowest, highest
        return tuple(float(v) for v in np.maximum.accumulate(out))


@dataclass(slots=True)
class _NumericState:
    seen: int = 0
    nulls: int = 0
    nonfinite: int = 0
    invalid: int = 0
    n: int = 0
    mean: float = 0.0  # of the values times 2 ** -exponent
    m2: float = 0.0  # likewise
    exponent: int = -1074
    low: float = math.inf
    high: float = -math.inf
    distinct: dict[float, int] | None = field(default_factory=dict)
    exact: list[FloatArray] | None = field(default_factory=list)
    compactor: _Compactor = field(default_factory=_Compactor)
    bottom: FloatArray = field(default_factory=lambda: np.empty(0))
    top: FloatArray = field(default_factory=lambda: np.empty(0))

    def update(self, values: FloatArray, invalid: int) -> None:
        """Adds a batch: ``values`` float64 with NaN for nulls; ``invalid`` wrong-typed values."""
        self.seen += values.size + invalid
        self.invalid += invalid
        nan = np.isnan(values)
        self.nulls += int(nan.sum())
        finite = values[np.isfinite(values)]
        self.nonfinite += values.size - int(nan.sum()) - finite.size
        if self.exact is not None:
            self.exact = self.exact + [finite] if self.n + finite.size <= EXACT_LIMIT else None
        if not finite.size:
            return
        ordered = np.sort(finite) + 0.0  # + 0.0: -0.0 counts as 0.0
        self._moments(ordered)
        self._distinct(ordered)
        self.bottom = np.sort(np.concatenate((self.bottom, ordered[:TAIL_VALUES])))[:TAIL_VALUES]
        self.top = np.sort(np.concatenate((self.top, ordered[-TAIL_VALUES:])))[-TAIL_VALUES:]
        self.compactor.add(ordered)

    def _moments(self, ordered: FloatArray) -> None:
        """Chan et al.'s pairwise update, on values divided by a power of two at least their
        largest magnitude (so sums of values near the float maximum do not overflow)."""
        self.low = min(self.low, float(ordered[0]))
        self.high = max(self.high, float(ordered[-1]))
        exponent = math.frexp(max(abs(self.low), abs(self.high)))[1]
        if exponent > self.exponent:
            shrink = math.ldexp(1.0, self.exponent - exponent)
            self.mean *= shrink
            self.m2 *= shrink * shrink
            self.exponent = exponent
        scaled = np.ldexp(ordered, -self.exponent)
        count = scaled.size
        mean = float(scaled.mean())
        m2 = float(np.square(scaled - mean).sum())
        total = self.n + count
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.n * count / total
        self.mean += delta * count / total
        self.n = total

    def _distinct(self, ordered: FloatArray) -> None:
        if self.distinct is None:
            return
        starts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        if starts.size + 1 + len(self.distinct) > 2 * DISTINCT_LIMIT + 1:
            self.distinct = None
            return
        bounds = np.concatenate(([0], starts, [ordered.size]))
        for value, count in zip(ordered[bounds[:-1]], np.diff(bounds), strict=True):
            key = float(value)
            self.distinct[key] = self.distinct.get(key, 0) + int(count)
        if len(self.distinct) > DISTINCT_LIMIT:
            self.distinct = None

    def sketch(self, name: str, rows: int) -> ColumnSketch:
        missing = rows - self.seen
        stats: dict[str, Any] = {}
        if self.n:
            stats = {
                "min": self.low,
                "max": self.high,
                "mean": min(max(math.ldexp(self.mean, self.exponent), self.low), self.high),
                "std": math.ldexp(math.sqrt(max(self.m2, 0.0) / self.n), self.exponent),
                "quantiles": self.compactor.quantiles(self.low, self.high),
                "tails": (
                    tuple(float(v) for v in self.bottom),
                    tuple(float(v) for v in self.top),
                ),
            }
        values: tuple[float | str, ...] | None = None
        if self.exact is not None:
            values = tuple(float(v) for v in np.concatenate([np.empty(0), *self.exact]))
        counts = None
        if self.distinct is not None:
            counts = {numeric_key(k): v for k, v in sorted(self.distinct.items())}
        return ColumnSketch(
            name=name,
            kind="numeric",
            count=rows,
            nulls=self.nulls + missing,
            nonfinite=self.nonfinite,
            invalid=self.invalid,
            counts=counts,
            values=values,
            **stats,
        )


@dataclass(slots=True)
class _CategoricalState:
    seen: int = 0
    nulls: int = 0
    invalid: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    exact: list[str] | None = field(default_factory=list)

    def update(self, keys: list[str], counts: list[int], nulls: int, invalid: int) -> None:
        self.seen += sum(counts) + nulls + invalid
        self.nulls += nulls
        self.invalid += invalid
        for key, count in zip(keys, counts, strict=True):
            self.counts[key] = self.counts.get(key, 0) + count
        if len(self.counts) > CATEGORY_LIMIT + 1:
            self._fold()

    def _fold(self) -> None:
        """Keeps the CATEGORY_LIMIT most frequent categories; the rest count under OTHER."""
        other = self.counts.pop(OTHER, 0)
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        self.counts = dict(ranked[:CATEGORY_LIMIT])
        self.counts[OTHER] = other + sum(c for _, c in ranked[CATEGORY_LIMIT:])

    def keep_exact(self, values: list[str | None]) -> None:
        if self.exact is None:
            return
        self.exact = self.exact + [v for v in values if v is not None]

    def sketch(self, name: str, rows: int) -> ColumnSketch:
        values: tuple[float | str, ...] | None = None
        if self.exact is not None:
            values = tuple(self.exact)
        return ColumnSketch(
            name=name,
            kind="categorical",
            count=rows,
            nulls=self.nulls + rows - self.seen,
            invalid=self.invalid,
            counts=dict(sorted(self.counts.items())),
            values=values,
        )


_NUMERIC_TYPES = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
_CATEGORY_TYPES = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_boolean,
    pa.types.is_dictionary,
)


def _infer_kind(array: pa.Array) -> Kind | None:
    """numeric for numbers, categorical for strings, booleans and dictionaries, else None."""
    kind = array.type
    if any(check(kind) for check in _NUMERIC_TYPES):
        return "numeric"
    if any(check(kind) for check in _CATEGORY_TYPES):
        return "categorical"
    return None


class SketchBuilder:
    """Streams Arrow record batches (or a ``pa.Table``, or ``Mapping[str, array]``) once,
    in bounded memory, and gives per-column sketches.

    Args:
        kinds: column -> kind; only those columns are summarised. ``None``: every column,
            its kind inferred where it first appears (numbers numeric; strings, booleans and
            dictionary arrays categorical; columns of other types are skipped and listed in
            :attr:`skipped`).

    A column missing from a batch counts that batch's rows as nulls. A value of the wrong type
    (a string in a numeric column; in a numpy object array, anything but a number in a numeric
    column or anything but a string, number or boolean in a categorical one) is counted in
    :attr:`ColumnSketch.invalid` and never raises: the live monitor survives a type-changed
    column and reports it. Not thread-safe.

    Raises (from the constructor and :meth:`update`):
        InvalidParameter: kinds that are not ``numeric``/``categorical``, a batch of another
            type, column names that are not strings, arrays of unequal lengths.
    """

    def __init__(self, kinds: Mapping[str, Kind] | None = None) -> None:
        if kinds is not None:
            if not isinstance(kinds, Mapping):
                raise InvalidParameter("kinds must map column names to 'numeric'/'categorical'")
            for name, kind in kinds.items():
                if not isinstance(name, str) or kind not in KINDS:
                    raise InvalidParameter("kinds must map column names to 'numeric'/'categorical'")
        self._kinds: dict[str, Kind] | None = None if kinds is None else dict(kinds)
        self._states: dict[str, _NumericState | _CategoricalState] = {}
        self._rows = 0
        self.skipped: set[str] = set()

    @property
    def rows(self) -> int:
        """The rows seen so far."""
        return self._rows

    def update(self, batch: pa.RecordBatch | pa.Table | Mapping[str, Any]) -> None:
        """Adds one batch of rows (every column the builder summarises, at once)."""
        columns, rows = _columns_of(batch)
        for name, column in columns.items():
            state = self._state_for(name, column)
            if state is not None:
                for chunk in _chunks(column):
                    _feed(state, chunk)
        self._rows += rows

    def _state_for(self, name: str, column: Any) -> _NumericState | _CategoricalState | None:
        state = self._states.get(name)
        if state is not None or name in self.skipped:
            return state
        if self._kinds is not None:
            kind = self._kinds.get(name)
        else:
            kind = _infer_kind(next(iter(_chunks(column)), pa.array([], pa.null())))
        if kind is None:
            if self._kinds is None:
                self.skipped.add(name)
            return None
        state = _NumericState() if kind == "numeric" else _CategoricalState()
        # A column first seen now had nulls in every earlier row.
        state.seen = self._rows
        state.nulls = self._rows
        self._states[name] = state
        return state

    def result(self) -> dict[str, ColumnSketch]:
        """The sketch of every summarised column (columns given in ``kinds`` but never seen
        count all their rows as nulls)."""
        names = list(self._states)
        if self._kinds is not None:
            names += [n for n in self._kinds if n not in self._states]
        out: dict[str, ColumnSketch] = {}
        for name in names:
            state = self._states.get(name)
            if state is None:
                kind = cast(dict[str, Kind], self._kinds)[name]
                state = _NumericState() if kind == "numeric" else _CategoricalState()
            out[name] = state.sketch(name, self._rows)
        return out


def _columns_of(batch: Any) -> tuple[dict[str, Any], int]:
    """The batch's columns (Arrow arrays or numpy arrays) and its number of rows."""
    if isinstance(batch, pa.RecordBatch | pa.Table):
        return dict(zip(batch.schema.names, batch.columns, strict=True)), batch.num_rows
    if not isinstance(batch, Mapping):
        raise InvalidParameter("a batch must be an Arrow record batch or table, or a mapping")
    columns: dict[str, Any] = {}
    lengths = set()
    for name, raw in batch.items():
        if not isinstance(name, str):
            raise InvalidParameter("column names must be strings")
        column = raw if isinstance(raw, pa.Array | pa.ChunkedArray) else _as_numpy(raw)
        columns[name] = column
        lengths.add(len(column))
    if len(lengths) > 1:
        raise InvalidParameter("a batch's columns must have the same length")
    return columns, lengths.pop() if lengths else 0


def _as_numpy(raw: Any) -> np.ndarray[Any, Any]:
    if isinstance(raw, np.ndarray):
        if raw.ndim != 1:
            raise InvalidParameter("a column must be one-dimensional")
        return raw
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        raise InvalidParameter("a column must be an array or a list of values")
    items = list(raw)
    out: np.ndarray[Any, Any] = np.empty(len(items), dtype=np.object_)
    for i, item in enumerate(items):
        out[i] = item
    return out


def _chunks(column: Any) -> Iterable[Any]:
    """Arrow chunks, or the numpy array converted: Arrow for typed arrays, object as is."""
    if isinstance(column, pa.ChunkedArray):
        return cast(list[Any], column.chunks)
    if isinstance(column, pa.Array):
        return [column]
    if column.dtype == object:
        return [column]
    return [pa.array(column, from_pandas=True)]


def _feed(state: _NumericState | _CategoricalState, chunk: Any) -> None:
    if isinstance(state, _NumericState):
        values, invalid = _as_floats(chunk)
        state.update(values, invalid)
        return
    keys, counts, nulls, invalid = _category_counts(chunk)
    state.update(keys, counts, nulls, invalid)
    if state.exact is not None and state.seen - state.nulls - state.invalid <= EXACT_LIMIT:
        state.keep_exact(_category_list(chunk))
    else:
        state.exact = None


def _as_floats(chunk: Any) -> tuple[FloatArray, int]:
    """float64 values (NaN for nulls) and the number of wrong-typed values."""
    if isinstance(chunk, np.ndarray):
        return _object_floats(chunk)
    array = cast(pa.Array, chunk)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = array.type
    if any(check(kind) for check in _NUMERIC_TYPES) or pa.types.is_boolean(kind):
        floats = pc.cast(array, pa.float64()).to_numpy(zero_copy_only=False)
        return np.asarray(floats, dtype=np.float64), 0
    nulls = array.null_count
    return np.full(nulls, np.nan), len(array) - nulls


def _object_floats(chunk: np.ndarray[Any, Any]) -> tuple[FloatArray, int]:
    floats: list[float] = []
    invalid = 0
    for value in chunk:
        if value is None:
            floats.append(math.nan)
        elif isinstance(value, bool | np.bool_) or not isinstance(
            value, int | float | np.integer | np.floating
        ):
            invalid += 1
        else:
            floats.append(float(value))
    return np.asarray(floats, dtype=np.float64), invalid


def _category_counts(chunk: Any) -> tuple[list[str], list[int], int, int]:
    """(keys, counts, nulls, invalid) of one chunk of a categorical column."""
    if isinstance(chunk, np.ndarray):
        return _object_category_counts(chunk)
    array = cast(pa.Array, chunk)
    if pa.types.is_dictionary(array.type):
        if pa.types.is_string(array.type.value_type) or pa.types.is_large_string(
            array.type.value_type
        ):
            return _dictionary_counts(array)
        array = array.dictionary_decode()
    kind = array.type
    if any(check(kind) for check in _NUMERIC_TYPES):
        return _numeric_categories(array)
    if not (
        pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_boolean(kind)
    ):
        try:
            array = pc.cast(array, pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return [], [], array.null_count, len(array) - array.null_count
    counted = pc.value_counts(array.drop_null())
    keys = [category_key(v) for v in counted.field("values").to_pylist()]
    return keys, counted.field("counts").to_pylist(), array.null_count, 0


def _object_category_counts(chunk: np.ndarray[Any, Any]) -> tuple[list[str], list[int], int, int]:
    listed = _object_categories(chunk)
    strings = [v for v in listed if isinstance(v, str)]
    nulls = sum(1 for v in listed if v is None)
    keys, counts, _, _ = _category_counts(pa.array(strings, pa.string()))
    return keys, counts, nulls, len(listed) - len(strings) - nulls


def _dictionary_counts(array: pa.DictionaryArray) -> tuple[list[str], list[int], int, int]:
    """Counts of a dictionary-encoded string chunk, by its indices (no strings materialised)."""
    indices = array.indices.drop_null().to_numpy(zero_copy_only=False)
    counts = np.bincount(indices.astype(np.int64, copy=False), minlength=len(array.dictionary))
    used = np.flatnonzero(counts)
    words = array.dictionary.take(pa.array(used)).to_pylist()
    totals: dict[str, int] = {}
    for word, count in zip(words, counts[used].tolist(), strict=True):
        totals[word] = totals.get(word, 0) + count  # a dictionary may repeat a word
    return list(totals), list(totals.values()), array.null_count, 0


def _numeric_categories(array: pa.Array) -> tuple[list[str], list[int], int, int]:
    floats = np.asarray(pc.cast(array, pa.float64()).to_numpy(zero_copy_only=False), np.float64)
    nan = np.isnan(floats)
    unique, counts = np.unique(floats[~nan] + 0.0, return_counts=True)
    keys = [category_key(float(v)) for v in unique]
    return keys, [int(c) for c in counts], int(nan.sum()), 0


def _object_categories(chunk: np.ndarray[Any, Any]) -> list[str | None | object]:
    """Each value as its category key, None for nulls, or an opaque marker for invalid."""
    out: list[str | None | object] = []
    for value in chunk:
        if value is None or (isinstance(value, float | np.floating) and math.isnan(value)):
            out.append(None)
        elif isinstance(value, str | bool | int | float | np.integer | np.floating | np.bool_):
            out.append(category_key(value))
        else:
            out.append(_INVALID)
    return out


_INVALID: Final = object()


def _category_list(chunk: Any) -> list[str | None]:
    """The chunk's categories, row by row (for the exact values of a small column)."""
    if isinstance(chunk, np.ndarray):
        return [v if isinstance(v, str) else None for v in _object_categories(chunk)]
    array = cast(pa.Array, chunk)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = array.type
    plain = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_boolean(kind)
    if not plain and not any(check(kind) for check in _NUMERIC_TYPES):
        try:
            array = pc.cast(array, pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return []
    out: list[str | None] = []
    for value in array.to_pylist():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append(None)
        else:
            out.append(category_key(value))
    return out
