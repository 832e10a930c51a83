"""The model folder format, and the checks every reader of model files shares.

A **model folder** is what ``shamal optimize`` writes and ``shamal serve`` reads: a weights file
and ``shamal-model.json``::

    {"schema": 1, "format": "onnx", "path": "model.onnx", "max_batch_size": 0,
     "task": "classification",
     "inputs":  [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}],
     "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1]}],
     "source": {"model_uri": "models:/wine/1", "variant": "int8-dynamic-per-channel"},
     "labels": {"probabilities": ["class_0", "class_1", "class_2"]}}

``format`` is ``onnx`` (``path`` names an ONNX graph), ``torch`` (``path`` names safetensors
weights; the operator names the module's factory, never the folder) or ``openvino`` (``path``
names an IR graph, ``model.xml``, whose weights are ``model.bin`` beside it; ``precision``, one
of ``f32``, ``bf16`` or ``f16``, is the inference precision the runtime is asked for).
Datatypes are Open Inference Protocol names; ``-1`` marks a variable dimension. ``labels``
(optional) names the classes of a classifier's score output, by index, for the classification
extension of the model server.

Model files are hostile until proven otherwise (hostile-inputs.md §4), so everything here reads
them as such: a manifest is size-capped and checked key by key (unknown keys, code to import
among them, are refused); formats are told by their first bytes, never by their names, and
pickles are recognised whatever they are called; every path a manifest or an ONNX graph names
must stay inside its folder, symlinks followed. Nothing here imports code named by a file.

This module imports only the standard library (``onnx`` when a graph is checked), so the model
server and the optimizer share it without loading each other.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from shamal.errors import InvalidParameter

if TYPE_CHECKING:
    import onnx

__all__ = [
    "DATATYPES",
    "FORMATS",
    "MANIFEST",
    "MAX_RANK",
    "MODEL_FILE",
    "PRECISIONS",
    "SCHEMA",
    "TASKS",
    "ModelFolder",
    "TensorSpec",
    "check_onnx_file",
    "checked_labels",
    "contained",
    "external_locations",
    "read_manifest",
    "read_manifest_json",
    "sniff_format",
]

MANIFEST = "shamal-model.json"
MODEL_FILE = "model.onnx"
SCHEMA = 1
FORMATS: tuple[str, ...] = ("onnx", "torch", "openvino")
#: Inference precisions an OpenVINO folder may ask its runtime for (``f32`` when unsaid).
PRECISIONS: tuple[str, ...] = ("f32", "bf16", "f16")
TASKS: tuple[str, ...] = ("classification", "regression", "embedding", "other")
#: Open Inference Protocol datatype names.
DATATYPES = frozenset(
    ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")
    + ("FP16", "FP32", "FP64", "BYTES")
)
#: The most dimensions one tensor may have.
MAX_RANK = 16
_MAX_TENSORS = 256
_MAX_LABEL_CHARS = 1024  # (the manifest's own size cap bounds how many)
_MAX_MANIFEST_BYTES = 1 << 20
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
_LOOKS = {
    "empty": "it is empty",
    "text": "it is text",
    "safetensors": "it holds safetensors weights",
    "unknown": "its first bytes are not an ONNX graph's",
}
_KEYS = frozenset(
    {"schema", "format", "path", "max_batch_size", "task", "inputs", "outputs", "source", "labels"}
    | {"precision"}
)
# A protocol 0/1 pickle: an opcode first (MARK, EMPTY_LIST, EMPTY_DICT or GLOBAL "module\nname")
# and STOP (".") last.
_OLD_PICKLE_HEAD = re.compile(rb"[(\]}]|c[\w.]+\n")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: its name, OIP datatype and shape (-1 = variable)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, raw: Any) -> TensorSpec:
        """A tensor as a manifest writes it.

        Raises:
            InvalidParameter: not exactly name, datatype and shape; an empty name, a datatype
                the protocol lacks, or a shape that is not at most 16 integers >= -1.
        """
        if not isinstance(raw, dict) or set(raw) != {"name", "datatype", "shape"}:
            raise InvalidParameter(f"{MANIFEST}: a tensor needs name, datatype and shape.")
        name, datatype, shape = raw["name"], raw["datatype"], raw["shape"]
        if not isinstance(name, str) or not name or datatype not in DATATYPES:
            raise InvalidParameter(
                f"{MANIFEST}: a tensor has a bad name or datatype (one of "
                f"{', '.join(sorted(DATATYPES))})."
            )
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_RANK
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape)
        ):
            raise InvalidParameter(
                f"{MANIFEST}: a tensor shape must be a list of at most {MAX_RANK} integers "
                "(-1 = variable)."
            )
        return cls(name, datatype, tuple(shape))


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """The manifest of a model folder.

    Attributes:
        inputs, outputs: the declared tensors, in graph order; empty when the manifest leaves
            them to be read from the graph (ONNX only).
        task: what the outputs mean (classification, regression, embedding, other).
        max_batch_size: 0 when the batch dimension is free, else the largest batch allowed.
        source: ``{"model_uri": ..., "variant": ...}`` of what it was made from, or None.
        path: the weights file, relative to the folder (``model.onnx`` in what Shamal writes).
        labels: output name -> class names by index (classifiers), or empty.
        format: ``onnx``, ``torch`` or ``openvino``.
        precision: the inference precision an OpenVINO model runs at (``f32``, ``bf16``,
            ``f16``); None for other formats.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    task: str = "other"
    max_batch_size: int = 0
    source: dict[str, str] | None = field(default=None)
    path: str = MODEL_FILE
    labels: dict[str, list[str]] = field(default_factory=dict)
    format: str = "onnx"
    precision: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "format": self.format,
            "path": self.path,
            "max_batch_size": self.max_batch_size,
            "task": self.task,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "source": dict(self.source) if self.source is not None else None,
            **({"labels": self.labels} if self.labels else {}),
            **({"precision": self.precision} if self.precision else {}),
        }


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


def sniff_format(path: Path) -> str:
    """What a file is by its bytes; its name is never consulted.

    Returns one of ``pickle`` (any protocol), ``zip`` (a torch, joblib, skops or keras archive:
    containers, each with its own rules), ``safetensors``, ``onnx`` (a protobuf that starts as
    an ONNX ModelProto does; :func:`check_onnx_file` parses it), ``text``, ``empty`` or
    ``unknown``.
    """
    with path.open("rb") as f:
        head = f.read(64)
        size = f.seek(0, 2)
        if size:
            f.seek(-1, 2)
        last = f.read(1)
    header_len = struct.unpack_from("<Q", head)[0] if len(head) >= 9 else 0
    checks = (
        (not head, "empty"),
        # Safetensors first: a header length of 640 starts 80 02, as a protocol-2 pickle does
        # (and a file read as safetensors is never unpickled, whatever else it may be).
        (
            head[8:9] == b"{" and 0 < header_len <= min(size - 8, _MAX_SAFETENSORS_HEADER),
            "safetensors",
        ),
        (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5, "pickle"),
        (last == b"." and _OLD_PICKLE_HEAD.match(head) is not None, "pickle"),
        (head.startswith(b"PK\x03\x04"), "zip"),
        (head[:1] == b"\x08", "onnx"),  # ModelProto field 1 (ir_version, a varint) comes first
        (head[:1] in (b"{", b"[") or head.isascii(), "text"),
    )
    return next((kind for matched, kind in checks if matched), "unknown")


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


def external_locations(model: onnx.ModelProto) -> Iterator[str]:
    """The ``location`` of every tensor of ``model`` whose data lives in another file."""
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
        InvalidParameter: not a regular file inside ``folder``; not ONNX by its bytes (a
            pickle named ``model.onnx``); unparsable; or a tensor whose external data is
            missing or lies outside ``folder`` (``..``, an absolute path, a symlink out).
    """
    import onnx

    target = path.resolve()  # symlinks followed: one pointing out of the folder is refused
    if not target.is_relative_to(folder.resolve()) or not target.is_file():
        raise InvalidParameter("The ONNX file must be a regular file inside the model folder.")
    kind = sniff_format(target)
    if kind in ("pickle", "zip"):
        raise InvalidParameter(
            f"{path.name} is not an ONNX file: it is a pickle (or an archive of pickles), "
            "which can run code when loaded; export the model to ONNX instead."
        )
    if kind != "onnx":
        raise InvalidParameter(f"{path.name} is not an ONNX file ({_LOOKS[kind]}).")
    try:
        model = onnx.load_model(str(target), load_external_data=False)
    except Exception:  # the protobuf parser raises several types; all mean "not ONNX"
        raise InvalidParameter(f"{path.name} is not a valid ONNX file.") from None
    if not model.HasField("graph") or model.ir_version <= 0:
        raise InvalidParameter(f"{path.name} is not a valid ONNX file.")
    for location in external_locations(model):
        try:
            data = contained(folder, location)
        except InvalidParameter:
            raise InvalidParameter(
                "The ONNX graph reads external data from outside its folder; every file a "
                "model uses must stay inside its folder."
            ) from None
        if not data.is_file():
            raise InvalidParameter(f"The ONNX graph's external data file {location!r} is missing.")
    return model


def read_manifest_json(folder: Path) -> Any:
    """The parsed ``shamal-model.json`` of ``folder``, unchecked but size-capped.

    Raises:
        InvalidParameter: missing, over 1 MiB, or not JSON.
    """
    path = folder / MANIFEST
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            raise InvalidParameter(f"{MANIFEST} is too large.")
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        raise InvalidParameter(f"{MANIFEST} is missing or is not JSON.") from None


def checked_labels(raw: object) -> dict[str, list[str]]:
    """``labels`` as written in a manifest (or returned by the sandboxed loader): an object of
    output name -> list of class names.

    Raises:
        InvalidParameter: any other shape.
    """
    if raw is None:
        return {}
    if isinstance(raw, dict) and all(
        isinstance(names, list)
        and all(isinstance(n, str) and len(n) <= _MAX_LABEL_CHARS for n in names)
        for names in raw.values()
    ):
        return {str(output): list(names) for output, names in raw.items()}
    raise InvalidParameter(
        f"{MANIFEST}: labels must map output names to lists of class names (strings of at "
        f"most {_MAX_LABEL_CHARS} characters)."
    )


def _tensor_list(raw: object, key: str) -> tuple[TensorSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > _MAX_TENSORS:
        raise InvalidParameter(f"{MANIFEST}: {key} must be a list of at most {_MAX_TENSORS}.")
    specs = tuple(TensorSpec.from_json(item) for item in raw)
    if len({s.name for s in specs}) != len(specs):
        raise InvalidParameter(f"{MANIFEST}: two {key} share a name.")
    return specs


def read_manifest(folder: Path) -> ModelFolder:
    """Read and check ``folder``'s manifest; the file it names must exist inside the folder.

    The weights file's own format is the caller's to check (:func:`check_onnx_file` for
    ``onnx``, :func:`sniff_format` is ``safetensors`` for ``torch``).

    Raises:
        InvalidParameter: a missing or malformed manifest: not schema 1, unknown keys, a format
            other than onnx or torch, a task outside :data:`TASKS`, a bad tensor list,
            ``max_batch_size``, ``source`` or ``labels``, or a path that leaves the folder or
            names no file.
    """
    raw = read_manifest_json(folder)
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise InvalidParameter(f"{MANIFEST} must be an object with schema {SCHEMA}.")
    unknown = set(raw) - _KEYS
    if unknown:
        raise InvalidParameter(f"{MANIFEST} has unknown keys {sorted(unknown)[:8]}.")
    fmt, task = raw.get("format"), raw.get("task")
    task = "other" if task is None else task  # absent or null: nothing said of the outputs
    if fmt not in FORMATS:
        raise InvalidParameter(f"{MANIFEST}: format must be 'onnx', 'torch' or 'openvino'.")
    if task not in TASKS:
        raise InvalidParameter(f"{MANIFEST}: task must be one of {', '.join(TASKS)}.")
    max_batch = raw.get("max_batch_size", 0)
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 0:
        raise InvalidParameter(f"{MANIFEST}: max_batch_size must be a non-negative integer.")
    source = raw.get("source")
    if source is not None and not (
        isinstance(source, dict) and all(isinstance(v, str) for v in source.values())
    ):
        raise InvalidParameter(f"{MANIFEST}: source must be null or an object of strings.")
    inputs = _tensor_list(raw.get("inputs"), "inputs")
    outputs = _tensor_list(raw.get("outputs"), "outputs")
    labels = checked_labels(raw.get("labels"))
    path = raw.get("path")
    if not contained(folder, path).is_file():
        raise InvalidParameter(f"The file {MANIFEST} names is missing.")
    return ModelFolder(
        inputs,
        outputs,
        str(task),
        max_batch,
        source,
        str(path),
        labels,
        format=str(fmt),
        precision=_precision(raw.get("precision"), str(fmt)),
    )


def _precision(raw: object, fmt: str) -> str | None:
    if raw is None:
        return "f32" if fmt == "openvino" else None
    if fmt != "openvino" or raw not in PRECISIONS:
        raise InvalidParameter(
            f"{MANIFEST}: precision is for openvino folders and takes {', '.join(PRECISIONS)}."
        )
    return str(raw)
