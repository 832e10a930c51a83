"""Lazy imports of heavy or untyped third-party modules.

torch, transformers, skl2onnx and onnxruntime are imported only when a function needs them, so
that ``import shamal.optimize`` stays cheap. onnxruntime, skl2onnx, skops and PyYAML ship no
type information; they are typed ``Any`` here, in one place, rather than with scattered
``type: ignore`` comments.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["module"]


def module(name: str) -> Any:
    """``import name`` at call time, typed Any (for untyped third-party modules)."""
    return importlib.import_module(name)
