"""What the optimizer starts from: a local folder (MLflow sklearn, ONNX model folder or file,
Hugging Face transformer, torch model folder built by an operator-named factory) turned into an
fp32 ONNX graph, a reference to compare variants with, and held-out inputs to compare them on."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._folder import MANIFEST, MODEL_FILE, read_model_folder, specs_of
from shamal.optimize._lazy import module
from shamal.optimize._measure import load_arrays, run_batches, session
from shamal.optimize._openvino import encoder_to_openvino
from shamal.optimize._safety import check_onnx_file, contained, load_onnx
from shamal.optimize._sandbox import SandboxLimits
from shamal.optimize._sklearn import (
    INPUT_NAME,
    convert_trusted_pickle,
    is_mlflow_sklearn,
    is_pickled_sklearn,
    load_sklearn_model,
    sklearn_labels,
    sklearn_task,
    sklearn_to_onnx,
    synthetic_inputs,
)
from shamal.optimize._structured import PruneSummary, prune_transformer
from shamal.optimize._torch import export_torch, is_torch_folder, load_torch_model
from shamal.optimize._transformer import (
    INPUT_NAMES,
    is_transformer_folder,
    load_transformer,
    probe_sentences,
    tokenize,
)

__all__ = ["EvalSet", "SourceModel", "load_source"]

logger = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]
SYNTHETIC_ROWS = 256
SYNTHETIC_ORIGIN = "synthetic N(0,1)"
PROBE_SENTENCES = 64
#: Sentences (after the probe sentences, so never the ones fidelity is checked on) that
#: static quantization calibrates on and structured pruning measures its units' importance on.
CALIBRATION_SENTENCES = 128


@dataclass(frozen=True)
class EvalSet:
    """Held-out inputs (named arrays), optional labels, and where they came from."""

    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None
    origin: str


@dataclass(frozen=True)
class SourceModel:
    """A model ready to be optimized.

    Attributes:
        kind: sklearn, transformer, torch or onnx.
        graph: the fp32 ONNX graph (exported, or the source's own).
        task: classification, regression, embedding or other.
        reference: the original model's outputs for given inputs (sklearn estimator, PyTorch
            module, or the source ONNX graph).
        eval_set: the held-out inputs fidelity is checked on.
        max_batch_size: what the variants' manifests declare (0 = the batch dim is free).
        labels: class names by output, carried into the variants' manifests.
        calibration: inputs for static quantization apart from the held-out ones (generated
            sentences for encoders); None: a calibration file, or the held-out inputs, serve.
        structured: builds the fp32 graph with a fraction of its units pruned from the
            original module (transformers: heads and FFN neurons, before export); None = prune
            the exported graph instead.
        openvino: builds the OpenVINO model from the original module (transformers: attention
            stays one fused operation); None = convert the ONNX graph.
    """

    kind: str
    graph: Any
    task: str
    reference: Callable[[dict[str, np.ndarray]], Outputs]
    eval_set: EvalSet
    max_batch_size: int = 0
    labels: dict[str, list[str]] = field(default_factory=dict)
    calibration: dict[str, np.ndarray] | None = None
    structured: Callable[[float], tuple[Any, PruneSummary]] | None = None
    openvino: Callable[[], Any] | None = None


def _input_example(folder: Path) -> np.ndarray | None:
    """The input example an MLflow model was logged with, if any (JSON only)."""
    yaml = module("yaml")

    try:
        info = yaml.safe_load((folder / "MLmodel").read_text()).get("saved_input_example_info")
        path = contained(folder, str(info["artifact_path"]))
        raw = json.loads(path.read_text())
    except (OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError):
        return None
    rows = raw.get("data", raw.get("inputs")) if isinstance(raw, dict) else raw
    try:
        found = np.asarray(rows, dtype=np.float32)
    except (TypeError, ValueError):
        return None
    return found if found.ndim == 2 else None


def _eval_for_features(
    folder: Path, n_features: int, eval_data: Path | None, input_name: str
) -> EvalSet:
    if eval_data is not None:
        feeds, labels = load_arrays(eval_data, [input_name])
        return EvalSet({input_name: feeds[input_name].astype(np.float32)}, labels, eval_data.name)
    example = _input_example(folder)
    if example is not None and example.shape[1] == n_features:
        return EvalSet({input_name: example}, None, "logged input example")
    synthetic = synthetic_inputs(n_features, SYNTHETIC_ROWS)
    return EvalSet({input_name: synthetic}, None, SYNTHETIC_ORIGIN)


def _pickled_sklearn_source(
    folder: Path, eval_data: Path | None, trust_pickle: bool, limits: SandboxLimits | None
) -> SourceModel:
    """A trusted pickle: converted, and its outputs on the held-out rows computed, in the
    sandbox; nothing is unpickled here. The reference answers only for those rows."""
    if eval_data is not None:
        feeds, labels = load_arrays(eval_data, [INPUT_NAME])
        given: np.ndarray | None = feeds[INPUT_NAME].astype(np.float32)
        origin, synthetic_rows = eval_data.name, 0
    else:
        given, labels = _input_example(folder), None
        origin, synthetic_rows = "logged input example", SYNTHETIC_ROWS
    made = convert_trusted_pickle(
        folder,
        trust_pickle=trust_pickle,
        inputs=given,
        synthetic_rows=synthetic_rows,
        limits=limits,
    )
    if made.synthetic or given is None:
        n_features = specs_of(made.graph)[0][0].shape[1]
        given, origin = synthetic_inputs(n_features, SYNTHETIC_ROWS), SYNTHETIC_ORIGIN
    evals = EvalSet({INPUT_NAME: given}, labels, origin)
    computed = made.reference or {}

    def reference(feeds: dict[str, np.ndarray]) -> Outputs:
        if set(feeds) != {INPUT_NAME} or not np.array_equal(feeds[INPUT_NAME], given):
            raise InvalidParameter(
                "The sandboxed model's outputs are known only for its held-out rows."
            )
        return dict(computed)

    return SourceModel("sklearn", made.graph, made.task, reference, evals, labels=made.labels)


def _sklearn_source(
    folder: Path, eval_data: Path | None, trust_pickle: bool, limits: SandboxLimits | None
) -> SourceModel:
    if is_pickled_sklearn(folder):
        return _pickled_sklearn_source(folder, eval_data, trust_pickle, limits)
    estimator = load_sklearn_model(folder)
    graph = sklearn_to_onnx(estimator)
    task = sklearn_task(estimator)
    inputs, outputs = specs_of(graph)
    names = [o.name for o in outputs]

    def reference(feeds: dict[str, np.ndarray]) -> Outputs:
        x = feeds[inputs[0].name]
        if task == "classification":
            return {names[0]: estimator.predict(x), names[1]: estimator.predict_proba(x)}
        return {names[0]: np.asarray(estimator.predict(x)).reshape(len(x), -1)}

    n_features = int(estimator.n_features_in_)
    evals = _eval_for_features(folder, n_features, eval_data, inputs[0].name)
    labels = sklearn_labels(estimator, graph)
    return SourceModel("sklearn", graph, task, reference, evals, labels=labels)


def _transformer_source(folder: Path, sequence_length: int, eval_data: Path | None) -> SourceModel:
    loaded = load_transformer(folder)
    if eval_data is not None:
        feeds, _ = load_arrays(eval_data, list(INPUT_NAMES))
        evals = EvalSet({k: v.astype(np.int64) for k, v in feeds.items()}, None, eval_data.name)
    else:
        feeds = tokenize(loaded.tokenizer, probe_texts(), sequence_length)
        evals = EvalSet(feeds, None, f"{PROBE_SENTENCES} probe texts of 1-8 sentences")
    from shamal.optimize._transformer import export_transformer

    calibration = tokenize(loaded.tokenizer, calibration_texts(), sequence_length)

    def structured(fraction: float) -> tuple[Any, PruneSummary]:
        smaller, summary = prune_transformer(loaded, fraction, calibration)
        return export_transformer(smaller), summary

    def openvino() -> Any:
        return encoder_to_openvino(loaded.module, INPUT_NAMES, loaded.output_name)

    return SourceModel(
        "transformer",
        export_transformer(loaded),
        loaded.task,
        loaded.reference,
        evals,
        calibration=calibration,
        structured=structured,
        openvino=openvino,
    )


def _joined(pool: list[str], count: int, stride: int) -> list[str]:
    """``count`` texts of one to eight sentences of ``pool`` each (lengths cycle)."""
    return [
        " ".join(pool[(i * 7 + j * stride) % len(pool)] for j in range(1 + i % 8))
        for i in range(count)
    ]


def probe_texts() -> list[str]:
    """The default held-out texts of an encoder's fidelity check: the first generated
    sentences, alone and joined up to eight at a time, so the gate sees long inputs as well as
    short ones (a static int8 variant calibrated on short text alone can pass on short text and
    fail on long)."""
    return _joined(probe_sentences(PROBE_SENTENCES), PROBE_SENTENCES, 9)


def calibration_texts() -> list[str]:
    """The default calibration texts of an encoder: the generated sentences after the probe
    sentences (never the ones fidelity is checked on), joined one to eight at a time, so that
    activation ranges are measured at every position up to a long input's and not only over
    the first dozen tokens a single short sentence fills."""
    pool = probe_sentences(PROBE_SENTENCES + CALIBRATION_SENTENCES * 2)[PROBE_SENTENCES:]
    return _joined(pool, CALIBRATION_SENTENCES, 13)


def _torch_source(folder: Path, factory: str | None, eval_data: Path | None) -> SourceModel:
    if factory is None:
        raise InvalidParameter(
            "This is a PyTorch model folder: name the code that builds its module with "
            "--torch-factory module:function (importable here; the folder never names code)."
        )
    loaded = load_torch_model(folder, factory)
    if eval_data is not None:
        feeds, labels = load_arrays(eval_data, [s.name for s in loaded.inputs])
        evals = EvalSet(loaded.conform(feeds), labels, eval_data.name)
    else:
        evals = EvalSet(loaded.generated(SYNTHETIC_ROWS), None, "generated from specs, seeded")
    graph = export_torch(loaded)
    return SourceModel("torch", graph, loaded.task, loaded.reference, evals, loaded.max_batch_size)


def _synthetic_feeds(graph: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    inputs, _ = specs_of(graph)
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        shape = [
            SYNTHETIC_ROWS if i == 0 and d < 0 else max(d, 1) for i, d in enumerate(spec.shape)
        ]
        if spec.datatype == "FP32":
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
        elif spec.datatype in ("INT64", "INT32"):
            feeds[spec.name] = np.ones(
                shape, dtype=np.int64 if spec.datatype == "INT64" else np.int32
            )
        else:
            raise InvalidParameter(f"Give --eval data: input {spec.name} is {spec.datatype}.")
    return feeds


def _onnx_source(
    folder: Path,
    path: Path,
    task: str,
    eval_data: Path | None,
    class_names: dict[str, list[str]] | None = None,
) -> SourceModel:
    graph = load_onnx(path, folder)
    inputs, _ = specs_of(graph)
    sess = session(path, 2)

    def reference(feeds: dict[str, np.ndarray]) -> Outputs:
        return run_batches(sess, feeds)

    if eval_data is not None:
        feeds, labels = load_arrays(eval_data, [s.name for s in inputs])
        evals = EvalSet(feeds, labels, eval_data.name)
    else:
        evals = EvalSet(_synthetic_feeds(graph), None, "synthetic")
    return SourceModel("onnx", graph, task, reference, evals, labels=class_names or {})


def load_source(
    location: Path,
    *,
    eval_data: Path | None = None,
    trust_pickle: bool = False,
    sequence_length: int = 128,
    sandbox: SandboxLimits | None = None,
    torch_factory: str | None = None,
) -> SourceModel:
    """Load a local model for optimizing: an ONNX file, a model folder (``shamal-model.json``,
    format onnx, or format torch built by ``torch_factory``), an MLflow sklearn folder, a
    Hugging Face transformer folder, or a folder with model.onnx.

    A trusted pickled sklearn model is loaded only in the sandbox (limits ``sandbox``); its
    reference outputs are computed there, for the held-out rows only.

    Raises:
        InvalidParameter: none of those, a torch folder without ``torch_factory`` (or a factory
            given for another kind of model), or a hostile file (see the loaders).
    """
    location = Path(location).resolve()
    if location.is_dir() and is_torch_folder(location):
        return _torch_source(location, torch_factory, eval_data)
    if torch_factory is not None:
        raise InvalidParameter(
            "--torch-factory is for PyTorch model folders (shamal-model.json with format "
            "torch); this model is not one."
        )
    if location.is_file():
        check_onnx_file(location, location.parent)
        return _onnx_source(location.parent, location, "other", eval_data)
    if not location.is_dir():
        raise InvalidParameter("The model location is neither a folder nor a file.")
    if (location / MANIFEST).is_file():
        manifest = read_model_folder(location)
        path = contained(location, manifest.path)
        return _onnx_source(location, path, manifest.task, eval_data, manifest.labels)
    if is_mlflow_sklearn(location):
        return _sklearn_source(location, eval_data, trust_pickle, sandbox)
    if is_transformer_folder(location):
        return _transformer_source(location, sequence_length, eval_data)
    if (location / MODEL_FILE).is_file():
        return _onnx_source(location, location / MODEL_FILE, "other", eval_data)
    raise InvalidParameter(
        "Not a model this optimizer reads: expected an MLflow sklearn model, an ONNX model "
        "(folder or file) or a Hugging Face folder (config.json, model.safetensors, "
        "tokenizer.json)."
    )
