"""Safe reading of model files: formats by magic bytes, paths kept inside their folder.

Model files are hostile until proven otherwise (hostile-inputs.md §4): a pickle renamed
``model.onnx`` or ``model.safetensors`` must be refused before any loader sees it, and an ONNX
file whose tensors point at external data outside its folder (``../../etc/passwd``, an absolute
path, a symlink out) must never be loaded. Nothing here executes code from a file.

The checks are :mod:`shamal.modelformat`'s, shared with the model server; this module adds
loading a checked graph's external data.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from shamal.modelformat import check_onnx_file, contained, external_locations, sniff_format

if TYPE_CHECKING:
    import onnx

__all__ = ["check_onnx_file", "contained", "load_onnx", "sniff_format"]


def load_onnx(path: Path, folder: Path) -> onnx.ModelProto:
    """:func:`check_onnx_file`, then load external data (all of it inside ``folder``)."""
    import onnx.external_data_helper as helper

    model = check_onnx_file(path, folder)
    if any(True for _ in external_locations(model)):
        helper.load_external_data_for_model(model, str(folder.resolve()))
    return model
