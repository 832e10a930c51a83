"""What a registered model version is: its formats and signature, read from its ``MLmodel``.

An MLflow model folder describes itself in ``MLmodel`` (YAML): ``flavors`` names the formats it
can be loaded as (``python_function``, ``sklearn``, ``onnx``, ...) and ``signature`` holds the
input, output and parameter schemas as JSON strings. The registry reads both when a version is
created, so a version says what it is without anyone downloading it.

The file is hostile input (hostile-inputs.md §4): it is size-capped, parsed with the safe YAML
loader, and only the two fields are taken from it; anything malformed is left out (the version
is still registered, as MLflow registers it) rather than stored or echoed.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["MLMODEL", "ModelCard", "parse_mlmodel"]

logger = logging.getLogger(__name__)

MLMODEL = "MLmodel"
MAX_MLMODEL_BYTES = 1 << 20
_MAX_FORMATS = 32
_FORMAT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SCHEMAS = ("inputs", "outputs", "params")


@dataclass(frozen=True, slots=True)
class ModelCard:
    """A version's formats (MLflow flavours, sorted) and signature (schemas by part), if any."""

    formats: tuple[str, ...] = ()
    signature: dict[str, Any] | None = None


def _schema(raw: object) -> Any:
    """One signature part: MLflow writes it as a JSON string of a list of columns or tensors."""
    if not isinstance(raw, str):
        return None
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, list) else None


def parse_mlmodel(data: bytes) -> ModelCard:
    """The formats and signature an ``MLmodel`` file declares; an empty card if it is not one."""
    import yaml  # type: ignore[import-untyped,unused-ignore]

    if len(data) > MAX_MLMODEL_BYTES:
        return ModelCard()
    try:
        raw = yaml.safe_load(data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError):
        logger.info("an MLmodel file is not valid YAML; the version has no card")
        return ModelCard()
    if not isinstance(raw, dict):
        return ModelCard()
    flavors = raw.get("flavors")
    names = flavors if isinstance(flavors, dict) else {}
    formats = sorted(k for k in names if isinstance(k, str) and _FORMAT.match(k))[:_MAX_FORMATS]
    signature = raw.get("signature")
    parts = (
        {part: _schema(signature.get(part)) for part in _SCHEMAS}
        if isinstance(signature, dict)
        else {}
    )
    found = {part: schema for part, schema in parts.items() if schema is not None}
    return ModelCard(tuple(formats), found or None)
