"""Sampled requests -> columns: what a monitor compares with the reference. Pure.

A serve process samples each tensor of a request as an excerpt (``shape``, ``datatype`` and
its first values, flattened; non-finite floats already null). A tensor of one value per row
is one column, named by the tensor; a 2-D tensor is split into one column per position,
named by the model version's signature when it lists as many columns (``x[0]``, ``x[1]``
... otherwise). Outputs become prediction columns. Values arrive as JSON: a number where
the reference holds text, or text where it holds numbers, is a type change — counted, kept
as a null of the column (so the run completes and the change is reported), never dropped
silently (a quality issue ``invalid_value``). ``"NaN"`` and ``"Infinity"`` as text parse as
the numbers they name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from shamal.monitoring._entities import ColumnRole

__all__ = [
    "LabelledPairs",
    "SampleColumns",
    "Sampled",
    "coerce",
    "labelled_pairs",
    "signature_names",
    "split_samples",
]

#: Columns taken from one request at most (the excerpts carry at most 32 tensors).
MAX_COLUMNS_PER_TENSOR: Final = 512


@dataclass(frozen=True, slots=True)
class Sampled:
    """One sampled request as the monitor reads it (the deployments' Sample, reduced)."""

    id: int
    inputs: Mapping[str, Any]
    outputs: Mapping[str, Any]


@dataclass(slots=True)
class SampleColumns:
    """Columns gathered from samples, in sample order, with each column's role."""

    values: dict[str, list[Any]] = field(default_factory=dict)
    roles: dict[str, ColumnRole] = field(default_factory=dict)
    samples: int = 0
    rows: int = 0
    first_id: int = 0
    last_id: int = 0
    malformed: int = 0


def signature_names(signature: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """The input and output column names a column-based signature lists (in order)."""
    found: list[list[str]] = []
    for part in ("inputs", "outputs"):
        entries = signature.get(part) if isinstance(signature, Mapping) else None
        names = []
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, Mapping) and entry.get("type") != "tensor":
                name = entry.get("name")
                if isinstance(name, str) and 0 < len(name) <= 256:
                    names.append(name)
        found.append(names)
    return found[0], found[1]


def _tensor_rows(excerpt: Any) -> tuple[int, int, list[Any]] | None:
    """(width, whole rows, values) of one excerpt; None when it is not one. An excerpt
    says how many whole rows it holds (``rows``; 0: its one row was too long to keep
    whole); one without says nothing, and only the whole rows its values fill are read."""
    if not isinstance(excerpt, Mapping):
        return None
    shape, data, rows = excerpt.get("shape"), excerpt.get("data"), excerpt.get("rows")
    if not isinstance(shape, list) or not isinstance(data, list):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None
    width = math.prod(shape[1:]) if len(shape) >= 2 else 1
    if not 1 <= width <= MAX_COLUMNS_PER_TENSOR:
        return None
    full = len(data) // width  # an excerpt may end inside a row: that row is left out
    if rows is not None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            return None
        full = min(full, rows)
    return width, full, data


def _add(
    out: SampleColumns, tensors: Mapping[str, Any], names: Sequence[str], role: ColumnRole
) -> int:
    """Add one request's tensors as columns; returns the rows it held (its widest tensor)."""
    rows = 0
    for tensor, excerpt in tensors.items():
        found = _tensor_rows(excerpt)
        if found is None:
            out.malformed += 1
            continue
        width, full, data = found
        if full == 0:
            continue  # no whole row to read
        if width == 1:
            labels = [names[0] if len(tensors) == 1 and len(names) == 1 else tensor]
        elif len(tensors) == 1 and len(names) == width:
            labels = list(names)
        else:
            labels = [f"{tensor}[{j}]" for j in range(width)]
        for j, label in enumerate(labels):
            out.values.setdefault(label, []).extend(data[j : full * width : width])
            out.roles.setdefault(label, role)
        rows = max(rows, full)
    return rows


def split_samples(
    samples: Iterable[Sampled],
    signature: Mapping[str, Any] | None,
    *,
    max_rows: int,
) -> SampleColumns:
    """Columns from ``samples`` (oldest first), stopping after the sample that brings the
    rows to ``max_rows``: ``last_id`` is the last sample read (the monitor's next cursor)."""
    inputs, outputs = signature_names(signature)
    out = SampleColumns()
    for sample in samples:
        if out.samples == 0:
            out.first_id = sample.id
        out.last_id = sample.id
        out.samples += 1
        rows_in = _add(out, sample.inputs, inputs, ColumnRole.FEATURE)
        rows_out = _add(out, sample.outputs, outputs, ColumnRole.PREDICTION)
        out.rows += max(rows_in, rows_out)
        if out.rows >= max_rows:
            break
    return out


def _number(value: Any) -> tuple[float, bool]:
    """(the value as a float, whether it was a type change)."""
    if value is None:
        return math.nan, False
    if isinstance(value, bool):
        return float(value), False
    if isinstance(value, int | float):
        return float(value), False
    if isinstance(value, str):
        try:
            return float(value), False
        except ValueError:
            return math.nan, True
    return math.nan, True


def coerce(values: Sequence[Any], kind: str) -> tuple[np.ndarray, int]:
    """The column as the reference's kind holds it, and how many values changed type
    (text in a numeric column, lists or objects in any column): those become nulls."""
    if kind == "numeric":
        changed = 0
        out = np.empty(len(values), dtype=np.float64)
        for i, value in enumerate(values):
            out[i], bad = _number(value)
            changed += bad
        return out, changed
    texts: list[str | None] = []
    changed = 0
    for value in values:
        if value is None or isinstance(value, bool | int | float | str):
            texts.append(None if value is None else str(value))
        else:
            texts.append(None)
            changed += 1
    return np.array(texts, dtype=object), changed


@dataclass(slots=True)
class LabelledPairs:
    """True outcomes and the model's answers, row by row, from labelled samples."""

    truth: list[Any] = field(default_factory=list)
    predicted: list[Any] = field(default_factory=list)
    output: str | None = None
    samples: int = 0
    skipped: int = 0


def labelled_pairs(labelled: Iterable[tuple[Sampled, Any]]) -> LabelledPairs:
    """(label, prediction) per row of each labelled sample. The prediction is the sample's
    first output tensor of one value per row (a classifier's label, a regressor's value);
    a label is one value for a one-row request or a list with one value per row (the rows
    the excerpt holds take the first ones). A sample that pairs no row (no such output, a
    single label for several rows, fewer labels than rows) is skipped, and counted."""
    out = LabelledPairs()
    for sample, label in labelled:
        out.samples += 1
        answers = _one_per_row(sample.outputs, out.output)
        if answers is None:
            out.skipped += 1
            continue
        name, values = answers
        labels = label if isinstance(label, list) else [label]
        if (
            not values
            or len(labels) < len(values)
            or (not isinstance(label, list) and len(values) != 1)
        ):
            out.skipped += 1
            continue
        out.output = name
        out.truth.extend(labels[: len(values)])
        out.predicted.extend(values)
    return out


def _one_per_row(outputs: Mapping[str, Any], wanted: str | None) -> tuple[str, list[Any]] | None:
    """The first output tensor (or ``wanted``, once one was chosen) holding one value per row,
    as (name, the values of its whole rows)."""
    for name, excerpt in outputs.items():
        if wanted is not None and name != wanted:
            continue
        found = _tensor_rows(excerpt)
        if found is not None and found[0] == 1 and found[1] > 0:
            return name, list(found[2][: found[1]])
    return None
