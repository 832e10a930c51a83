"""Safe reading of model files: formats by magic bytes, paths kept inside their folder.

Model files are hostile until proven otherwise (hostile-inputs.md §4): a pickle renamed
``model.onnx`` or ``model.safetensors`` must be refused before any loader sees it, and an ONNX
file whose tensors point at external data outside its folder (``../../etc/passwd``, an absolute
path, a symlink out) must never be loaded. Nothing here executes code from a file.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from shamal.errors import InvalidParameter

if TYPE_CHECKING:
    import onnx

__all__ = ["check_onnx_file", "contained", "load_onnx", "sniff_format"]

logger = logging.getLogger(__name__)

_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def contained(folder: Path, relpath: str) -> Path:
    """``folder / relpath`` resolved, refused unless it stays inside ``folder``.

    Refuses absolute paths, drive letters, backslashes, NUL and ``..`` segments outright, then
    checks the resolved path (symlinks followed) with ``is_relative_to``.

    Raises:
        InvalidParameter: the path is unsafe or leaves the folder.
    """
    if (
        not relpath
        or "\x00" in relpath
        or "\\" in relpath
        or ":" in relpath
        or relpath.startswith("/")
        or any(part == ".." for part in PurePosixPath(relpath).parts)
    ):
        raise InvalidParameter("A model file path must be relative and stay inside its folder.")
    root = folder.resolve()
    target = (root / relpath).resolve()
    if not target.is_relative_to(root):
        raise InvalidParameter("A model file path must be relative and stay inside its folder.")
    return target


def sniff_format(path: Path) -> str:
    """What a file is by its first bytes: ``pickle``, ``zip``, ``safetensors``, ``onnx``,
    ``text`` or ``unknown``. The extension is never consulted."""
    with path.open("rb") as f:
        head = f.read(16)
        size = path.stat().st_size
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if head.startswith(b"PK\x03\x04"):
        return "zip"  # torch .pt, skops, keras: containers, each with its own rules
    if len(head) >= 9:
        (header_len,) = struct.unpack("<Q", head[:8])
        if head[8:9] == b"{" and 0 < header_len <= min(size - 8, _MAX_SAFETENSORS_HEADER):
            return "safetensors"
    if head[:1] == b"\x08":  # ModelProto field 1 (ir_version, varint) comes first
        return "onnx"
    if head[:1] in (b"{", b"[") or head.isascii():
        return "text"
    return "unknown"


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph: initializers, sparse ones and constants in node attributes,
    subgraphs (If/Loop/Scan bodies) included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _external_locations(model: onnx.ModelProto) -> Iterator[str]:
    import onnx

    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            yield entries.get("location", "")


def check_onnx_file(path: Path, folder: Path) -> onnx.ModelProto:
    """Parse an ONNX file without loading external data, and refuse hostile ones.

    Returns:
        The model, with any (contained) external data still not loaded.

    Raises:
        InvalidParameter: not a regular file inside ``folder``, not ONNX by its magic bytes
            (a pickle named ``model.onnx``), unparsable, or a tensor whose external data lies
            outside ``folder`` (``..``, absolute path, symlink out).
    """
    import onnx

    target = path.resolve()  # symlinks followed: one pointing out of the folder is refused
    if not target.is_relative_to(folder.resolve()) or not target.is_file():
        raise InvalidParameter("The ONNX file must be a regular file inside the model folder.")
    kind = sniff_format(target)
    if kind != "onnx":
        raise InvalidParameter(f"{path.name} is not an ONNX file (its bytes look like {kind}).")
    try:
        model = onnx.load_model(str(target), load_external_data=False)
    except Exception:  # the protobuf parser raises several types; all mean "not ONNX"
        raise InvalidParameter(f"{path.name} is not a valid ONNX file.") from None
    for location in _external_locations(model):
        contained(folder, location)  # raises for traversal, absolute paths, symlinks out
    return model


def load_onnx(path: Path, folder: Path) -> onnx.ModelProto:
    """:func:`check_onnx_file`, then load external data (all of it inside ``folder``)."""
    import onnx.external_data_helper as helper

    model = check_onnx_file(path, folder)
    if any(True for _ in _external_locations(model)):
        helper.load_external_data_for_model(model, str(folder.resolve()))
    return model
