"""The classification extension of the Open Inference Protocol (as Triton serves it).

A requested output with the parameter ``classification: N`` comes back as a BYTES tensor instead
of its values: for each row (each batch entry, or the whole tensor for a model without a batch
dimension) the N largest values as ``"value:index"``, or ``"value:index:label"`` when the model
names its classes, largest first, ties by the lower index. Values are written as Triton writes
them: six decimals for floating point, plain digits for integers. N past the number of classes
gives every class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter

__all__ = ["class_count", "check_classifiable", "top_classes"]

PARAMETER = "classification"
_NOT_CLASSIFIABLE = {"BYTES", "BOOL"}


def class_count(parameters: Mapping[str, Any], output: str) -> int:
    """The ``classification`` count asked for on a requested output; 0 when none.

    Raises:
        InvalidParameter: a count that is not an integer of at least 1.
    """
    value = parameters.get(PARAMETER)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameter(
            f"Output {output[:64]!r}: 'classification' must be an integer of at least 1 "
            "(how many top classes to return)."
        )
    return value


def check_classifiable(output: str, datatype: str) -> None:
    """Raises InvalidParameter when an output of ``datatype`` cannot be ranked."""
    if datatype in _NOT_CLASSIFIABLE:
        raise InvalidParameter(
            f"Output {output[:64]!r} is {datatype}; classification ranks numeric outputs only."
        )


def top_classes(
    data: np.ndarray, count: int, *, batched: bool, labels: Sequence[str] = ()
) -> np.ndarray:
    """The top ``count`` classes of ``data`` as UTF-8 ``value:index[:label]`` strings: shape
    ``[rows, k]`` when ``batched`` (the first dimension is the batch), else ``[k]``."""
    rows = data.reshape(data.shape[0], -1) if batched and data.ndim else data.reshape(1, -1)
    width = rows.shape[1]
    keep = min(count, width)
    floating = rows.dtype.kind == "f"
    answer = np.empty((rows.shape[0], keep), dtype=object)
    for r, row in enumerate(rows):
        # A stable ascending sort of the reversed row, read backwards: largest first and, among
        # equal values, the lower index first (exact for every dtype, no negation overflow).
        order = (width - 1 - np.argsort(row[::-1], kind="stable"))[::-1][:keep]
        for j, index in enumerate(order.tolist()):
            value = row[index]
            text = f"{float(value):f}" if floating else str(int(value))
            text = f"{text}:{index}"
            if index < len(labels):
                text = f"{text}:{labels[index]}"
            answer[r, j] = text.encode("utf-8")
    return answer if batched else answer.reshape(keep)
