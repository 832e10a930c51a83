"""Finding out what a model path holds, without trusting it.

A served model comes from a bare ``.onnx`` file, a **model folder** (``shamal-model.json`` + the
file it names: ONNX, safetensors or an OpenVINO IR), a **variant set** (``shamal-variants.json``:
builds by CPU kind, of which the one made for this CPU is served), an MLflow model folder
(``MLmodel`` with an ``onnx`` flavour, or a ``sklearn`` flavour converted to ONNX by the
optimizer), or a ``models:/`` URI downloaded from the registry.

Everything here treats files as hostile (hostile-inputs.md §4): formats are told by their first
bytes, never by their names; pickles are refused unless the operator trusts the model; every path a
manifest names must stay inside its folder; an ONNX graph whose tensors point at external data
outside the folder is refused before any runtime opens it. Nothing here imports code named by a
file. The manifest and the checks are :mod:`shamal.modelformat`'s, shared with the optimizer.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shamal.errors import InvalidParameter
from shamal.modelformat import (
    MANIFEST,
    MODEL_FILE,
    VARIANTS_MANIFEST,
    CpuInfo,
    VariantChoice,
    check_onnx_file,
    check_openvino_ir,
    contained,
    host_cpu,
    is_variant_set,
    pick_variant,
    read_manifest,
    read_variant_set,
    sniff_format,
)
from shamal.serving._types import TensorSpec

__all__ = ["ModelFiles", "read_model_files"]

logger = logging.getLogger(__name__)

_MAX_MLMODEL_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelFiles:
    """What a model path turned out to hold, checked and ready for a backend.

    Attributes:
        format: ``onnx``, ``torch`` or ``openvino``.
        path: the weights file (ONNX graph, safetensors or IR graph), inside ``root``.
        root: the folder the model lives in; every file it uses is inside it.
        max_batch_size: from the manifest, or None to decide from the graph.
        inputs: declared inputs (manifest), or None to read them from the graph.
        outputs: declared outputs (manifest), or None to read them from the graph.
        labels: output name -> its class names by index (manifest ``labels``), for the
            classification extension.
        precision: the inference precision an OpenVINO model asks for (``f32``, ``bf16``,
            ``f16``); None for other formats.
        choice: for a variant set, which build was taken and why; None otherwise.
    """

    format: str
    path: Path
    root: Path
    max_batch_size: int | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    precision: str | None = None
    choice: VariantChoice | None = None


@contextmanager
def _named(name: str) -> Iterator[None]:
    """Refusals from the shared checks, said of the served model by name."""
    try:
        yield
    except InvalidParameter as exc:
        raise InvalidParameter(f"Model '{name}': {exc.message}") from None


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
        path = path.resolve()  # the operator named this file: its folder is where it lives
        return _single_file(path, path.parent, name)
    if is_variant_set(path):
        return _from_variant_set(path, name)
    if (path / MANIFEST).is_file():
        return _from_manifest(path, name)
    if (path / "MLmodel").is_file():
        return _from_mlflow(path, name=name, trusted=trusted, work_dir=work_dir)
    if (path / MODEL_FILE).is_file():
        with _named(name):
            target = contained(path, MODEL_FILE)
        return _single_file(target, path, name)
    raise InvalidParameter(
        f"Model '{name}': {path} holds no model.onnx, {MANIFEST}, {VARIANTS_MANIFEST} or "
        "MLflow MLmodel file."
    )


def _single_file(path: Path, root: Path, name: str) -> ModelFiles:
    if sniff_format(path) == "safetensors":
        raise InvalidParameter(
            f"Model '{name}': {path.name} is safetensors, not an ONNX graph; a torch model "
            f"needs a {MANIFEST} with format 'torch' and a --torch-factory."
        )
    with _named(name):
        check_onnx_file(path, root)
    return ModelFiles(format="onnx", path=path.resolve(), root=root.resolve())


def _from_manifest(folder: Path, name: str) -> ModelFiles:
    with _named(name):
        manifest = read_manifest(folder)
        target = contained(folder, manifest.path)
    inputs, outputs = manifest.inputs or None, manifest.outputs or None
    labels = {output: tuple(classes) for output, classes in manifest.labels.items()}
    batch = manifest.max_batch_size
    if manifest.format == "onnx":
        checked = _single_file(target, folder, name)
        return ModelFiles("onnx", checked.path, checked.root, batch, inputs, outputs, labels)
    if manifest.format == "openvino":
        with _named(name):
            check_openvino_ir(target, folder)
        root = folder.resolve()
        return ModelFiles(
            "openvino", target, root, batch, inputs, outputs, labels, manifest.precision
        )
    if sniff_format(target) != "safetensors":
        raise InvalidParameter(
            f"Model '{name}': format 'torch' needs safetensors weights; {target.name} is not "
            "safetensors (pickled torch files are refused)."
        )
    if not inputs or not outputs:
        raise InvalidParameter(f"Model '{name}': a torch model's {MANIFEST} must list its tensors.")
    return ModelFiles("torch", target, folder.resolve(), batch, inputs, outputs, labels)


def _from_mlflow(folder: Path, *, name: str, trusted: bool, work_dir: Path) -> ModelFiles:
    flavors = _mlflow_flavors(folder, name)
    onnx_flavor = flavors.get("onnx")
    if isinstance(onnx_flavor, dict):
        with _named(name):
            target = contained(folder, onnx_flavor.get("data", MODEL_FILE))
        return _single_file(target, folder, name)
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


def _runtime_present(folder: Path) -> bool:
    """Whether this process can run the build in ``folder`` (OpenVINO is an optional extra)."""
    try:
        fmt = read_manifest(folder).format
    except InvalidParameter:
        return True  # let the full check say what is wrong
    return fmt != "openvino" or importlib.util.find_spec("openvino") is not None


def _from_variant_set(folder: Path, name: str, host: CpuInfo | None = None) -> ModelFiles:
    """The build of a variant set made for this CPU (or the portable one), said in the log."""
    with _named(name):
        variants = read_variant_set(folder)
    host = host or host_cpu()
    choice = pick_variant(variants, host)
    if choice.path != variants.portable and not _runtime_present(folder / choice.path):
        choice = VariantChoice(
            variants.portable,
            "portable",
            f"the build for this CPU ({choice.variant}) needs OpenVINO, which is not installed "
            "here (pip install 'shamal[openvino]'): the portable one",
        )
    logger.info(
        "model %s: serving variant %s from %s; this CPU: %s; %s",
        name,
        choice.variant,
        choice.path,
        host.describe(),
        choice.reason,
    )
    files = _from_manifest(folder / choice.path, name)
    return replace(files, choice=choice)
