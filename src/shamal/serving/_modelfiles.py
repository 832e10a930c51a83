"""Finding out what a model path holds, without trusting it.

A served model comes from a bare ``.onnx`` file, a **model folder** (``shamal-model.json`` + the
file it names), an MLflow model folder (``MLmodel`` with an ``onnx`` flavour, or a ``sklearn``
flavour converted to ONNX by the optimizer), or a ``models:/`` URI downloaded from the registry.

Everything here treats files as hostile (hostile-inputs.md §4): formats are told by their first
bytes, never by their names; pickles are refused unless the operator trusts the model; every path a
manifest names must stay inside its folder; an ONNX graph whose tensors point at external data
outside the folder is refused before any runtime opens it. Nothing here imports code named by a
file.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from shamal.errors import InvalidParameter
from shamal.serving._datatypes import DATATYPES, MAX_RANK
from shamal.serving._types import TensorSpec

__all__ = [
    "MANIFEST",
    "ModelFiles",
    "contained",
    "read_model_files",
    "sniff",
]

logger = logging.getLogger(__name__)

MANIFEST = "shamal-model.json"
_MANIFEST_KEYS = {"schema", "format", "path", "max_batch_size", "task", "inputs", "outputs"}
_MANIFEST_KEYS |= {"source", "labels"}
_MAX_LABEL_CHARS = 1024  # (the manifest's own size cap bounds how many)
_MAX_MANIFEST_BYTES = 1 << 20
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
_MAX_MLMODEL_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelFiles:
    """What a model path turned out to hold, checked and ready for a backend.

    Attributes:
        format: ``onnx`` or ``torch``.
        path: the weights file (ONNX graph or safetensors), inside ``root``.
        root: the folder the model lives in; every file it uses is inside it.
        max_batch_size: from the manifest, or None to decide from the graph.
        inputs: declared inputs (manifest), or None to read them from the graph.
        outputs: declared outputs (manifest), or None to read them from the graph.
        labels: output name -> its class names by index (manifest ``labels``), for the
            classification extension.
    """

    format: str
    path: Path
    root: Path
    max_batch_size: int | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def contained(folder: Path, relpath: object) -> Path:
    """``folder / relpath`` resolved, refused unless it stays inside ``folder``.

    Absolute paths, drive letters, backslashes, NUL and ``..`` segments are refused outright; the
    resolved path (symlinks followed) must then be inside the resolved folder.

    Raises:
        InvalidParameter: the path is unsafe or leaves the folder.
    """
    refusal = InvalidParameter("A model file path must be relative and stay inside its folder.")
    if not isinstance(relpath, str) or not relpath or len(relpath) > 1024:
        raise refusal
    if any(c in relpath for c in ("\x00", "\\", ":")) or relpath.startswith("/"):
        raise refusal
    if any(part == ".." for part in PurePosixPath(relpath).parts):
        raise refusal
    root = folder.resolve()
    target = (root / relpath).resolve()
    if not target.is_relative_to(root):
        raise refusal
    return target


def sniff(path: Path) -> str:
    """What a file is by its first bytes.

    Returns one of ``pickle``, ``zip`` (a torch or joblib archive: pickles inside), ``safetensors``,
    ``onnx`` (a protobuf that may be an ONNX graph; :func:`_check_onnx` decides), ``empty``.
    """
    with path.open("rb") as f:
        head = f.read(16)
    size = path.stat().st_size
    if not head:
        return "empty"
    if head[0] == 0x80 and len(head) > 1 and 2 <= head[1] <= 5:
        return "pickle"
    if head[:1] in (b"(", b"]", b"}", b"c") and _looks_like_old_pickle(path):
        return "pickle"
    if head[:4] == b"PK\x03\x04":
        return "zip"
    if len(head) >= 9:
        (header_len,) = struct.unpack_from("<Q", head)
        if head[8:9] == b"{" and 0 < header_len <= min(size - 8, _MAX_SAFETENSORS_HEADER):
            return "safetensors"
    return "onnx"


def _looks_like_old_pickle(path: Path) -> bool:
    """Protocol 0/1 pickles start with an opcode and end with STOP (``.``)."""
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"."


def read_model_files(path: Path, *, name: str, trusted: bool, work_dir: Path) -> ModelFiles:
    """Check a local model path and say how to load it.

    Args:
        path: a file or a folder on this machine.
        name: the served model name (for messages).
        trusted: the operator passed ``--trust NAME``: pickled formats may be converted.
        work_dir: a private folder for conversions (MLflow sklearn -> ONNX).

    Raises:
        InvalidParameter: the path is missing, holds a refused format (pickles without trust),
            a manifest that fails its schema, or a path that leaves the folder.
    """
    if not path.exists():
        raise InvalidParameter(f"Model '{name}': {path} does not exist.")
    if path.is_file():
        return _single_file(path, path.parent, name)
    if (path / MANIFEST).is_file():
        return _from_manifest(path, name)
    if (path / "MLmodel").is_file():
        return _from_mlflow(path, name=name, trusted=trusted, work_dir=work_dir)
    if (path / "model.onnx").is_file():
        return _single_file(contained(path, "model.onnx"), path, name)
    raise InvalidParameter(
        f"Model '{name}': {path} holds no model.onnx, {MANIFEST} or MLflow MLmodel file."
    )


def _single_file(path: Path, root: Path, name: str) -> ModelFiles:
    kind = sniff(path)
    if kind in ("pickle", "zip"):
        raise InvalidParameter(
            f"Model '{name}': {path.name} is a pickle (or an archive of pickles), which can run "
            "code when loaded; export the model to ONNX or safetensors instead."
        )
    if kind != "onnx":
        raise InvalidParameter(
            f"Model '{name}': {path.name} is not an ONNX graph ({kind}); a safetensors file "
            f"needs a {MANIFEST} with format 'torch' and a --torch-factory."
        )
    _check_onnx(path, root, name)
    return ModelFiles(format="onnx", path=path, root=root)


def _check_onnx(path: Path, root: Path, name: str) -> None:
    """Parse the graph (no external data) and check every external-data location.

    Raises:
        InvalidParameter: not an ONNX graph, or external data that leaves ``root``.
    """
    import onnx

    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception:
        raise InvalidParameter(f"Model '{name}': {path.name} is not a valid ONNX graph.") from None
    if not model.HasField("graph") or model.ir_version <= 0:
        raise InvalidParameter(f"Model '{name}': {path.name} is not a valid ONNX graph.")
    for location in _external_locations(model.graph):
        try:
            target = contained(root, location)
        except InvalidParameter:
            raise InvalidParameter(
                f"Model '{name}': the ONNX graph reads external data outside its folder; refused."
            ) from None
        if not target.is_file():
            raise InvalidParameter(f"Model '{name}': external data file {location!r} is missing.")


def _external_locations(graph: Any) -> list[str]:
    """Every ``external_data`` location in a graph, its subgraphs included."""
    import onnx

    found: list[str] = []
    tensors = list(graph.initializer)
    tensors += [sparse.values for sparse in graph.sparse_initializer]
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                tensors.append(attr.t)
            tensors.extend(attr.tensors)
            subgraphs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            for sub in subgraphs:
                found += _external_locations(sub)
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            found.append(entries.get("location", ""))
    return found


def _from_manifest(folder: Path, name: str) -> ModelFiles:
    raw = _read_json(folder / MANIFEST, name)
    if not isinstance(raw, dict) or raw.get("schema") != 1:
        raise InvalidParameter(f"Model '{name}': {MANIFEST} must be an object with schema 1.")
    unknown = set(raw) - _MANIFEST_KEYS
    if unknown:
        raise InvalidParameter(f"Model '{name}': {MANIFEST} has unknown keys {sorted(unknown)}.")
    fmt = raw.get("format")
    if fmt not in ("onnx", "torch"):
        raise InvalidParameter(f"Model '{name}': {MANIFEST} format must be 'onnx' or 'torch'.")
    target = contained(folder, raw.get("path"))
    if not target.is_file():
        raise InvalidParameter(f"Model '{name}': the file its {MANIFEST} names is missing.")
    max_batch = raw.get("max_batch_size", 0)
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 0:
        raise InvalidParameter(f"Model '{name}': max_batch_size must be a non-negative integer.")
    inputs = _specs(raw.get("inputs"), "inputs", name)
    outputs = _specs(raw.get("outputs"), "outputs", name)
    labels = _labels(raw.get("labels"), name)
    if fmt == "onnx":
        checked = _single_file(target, folder.resolve(), name)
        return ModelFiles("onnx", checked.path, checked.root, max_batch, inputs, outputs, labels)
    if sniff(target) != "safetensors":
        raise InvalidParameter(
            f"Model '{name}': format 'torch' needs safetensors weights; {target.name} is not "
            "safetensors (pickled torch files are refused)."
        )
    if not inputs or not outputs:
        raise InvalidParameter(f"Model '{name}': a torch model's {MANIFEST} must list its tensors.")
    return ModelFiles("torch", target, folder.resolve(), max_batch, inputs, outputs, labels)


def _labels(raw: object, name: str) -> dict[str, tuple[str, ...]]:
    """The manifest's ``labels``: ``{"output name": ["class 0", "class 1", ...]}``."""
    if raw is None:
        return {}
    problem = InvalidParameter(
        f"Model '{name}': {MANIFEST} labels must map output names to lists of class names "
        f"(strings of at most {_MAX_LABEL_CHARS} characters)."
    )
    if not isinstance(raw, dict):
        raise problem
    found: dict[str, tuple[str, ...]] = {}
    for output, names in raw.items():
        if not isinstance(names, list):
            raise problem
        if not all(isinstance(n, str) and len(n) <= _MAX_LABEL_CHARS for n in names):
            raise problem
        found[output] = tuple(names)
    return found


def _read_json(path: Path, name: str) -> Any:
    if path.stat().st_size > _MAX_MANIFEST_BYTES:
        raise InvalidParameter(f"Model '{name}': {path.name} is too large.")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        raise InvalidParameter(f"Model '{name}': {path.name} is not valid JSON.") from None


def _specs(raw: object, key: str, name: str) -> tuple[TensorSpec, ...] | None:
    if raw is None:
        return None
    problem = InvalidParameter(
        f"Model '{name}': {MANIFEST} {key} must be a list of "
        '{"name", "datatype", "shape"} with OIP datatypes and integer dims (-1 = variable).'
    )
    if not isinstance(raw, list) or len(raw) > 256:
        raise problem
    specs = []
    for item in raw:
        if not isinstance(item, dict) or set(item) - {"name", "datatype", "shape"}:
            raise problem
        tensor, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(tensor, str) or not tensor or datatype not in DATATYPES:
            raise problem
        if not isinstance(shape, list) or len(shape) > MAX_RANK:
            raise problem
        if any(isinstance(d, bool) or not isinstance(d, int) or d < -1 for d in shape):
            raise problem
        specs.append(TensorSpec(tensor, str(datatype), tuple(shape)))
    return tuple(specs)


def _from_mlflow(folder: Path, *, name: str, trusted: bool, work_dir: Path) -> ModelFiles:
    flavors = _mlflow_flavors(folder, name)
    onnx_flavor = flavors.get("onnx")
    if isinstance(onnx_flavor, dict):
        target = contained(folder, onnx_flavor.get("data", "model.onnx"))
        return _single_file(target, folder.resolve(), name)
    if "sklearn" in flavors:
        return _convert_sklearn(folder, name=name, trusted=trusted, work_dir=work_dir)
    raise InvalidParameter(
        f"Model '{name}': the MLflow model has no 'onnx' or 'sklearn' flavour "
        f"(it has {sorted(flavors)[:8]}); export it to ONNX first."
    )


def _mlflow_flavors(folder: Path, name: str) -> dict[str, Any]:
    import yaml  # type: ignore[import-untyped,unused-ignore]

    path = folder / "MLmodel"
    if path.stat().st_size > _MAX_MLMODEL_BYTES:
        raise InvalidParameter(f"Model '{name}': its MLmodel file is too large.")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError):
        raise InvalidParameter(f"Model '{name}': its MLmodel file is not valid YAML.") from None
    flavors = raw.get("flavors") if isinstance(raw, dict) else None
    if not isinstance(flavors, dict):
        raise InvalidParameter(f"Model '{name}': its MLmodel file lists no flavours.")
    return {str(key): value for key, value in flavors.items()}


def _convert_sklearn(folder: Path, *, name: str, trusted: bool, work_dir: Path) -> ModelFiles:
    """An MLflow sklearn model, converted to an ONNX model folder by the optimizer."""
    try:
        from shamal.optimize import export_mlflow_sklearn  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        raise InvalidParameter(
            f"Model '{name}' is an MLflow scikit-learn model; converting it needs the optimizer "
            "(pip install 'shamal[optimize]'), or export it to ONNX with `shamal optimize`."
        ) from None
    dest = work_dir / f"{name}-onnx"
    try:
        out = export_mlflow_sklearn(folder, dest, trust_pickle=trusted)
    except InvalidParameter as exc:
        hint = "" if trusted else f" (shamal serve: --trust {name} allows pickled formats)"
        raise InvalidParameter(f"Model '{name}': {exc.message}{hint}") from None
    return read_model_files(Path(out), name=name, trusted=False, work_dir=work_dir)
