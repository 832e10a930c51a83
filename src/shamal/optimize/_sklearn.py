"""scikit-learn models saved by MLflow: safe loading and conversion to ONNX.

The MLflow sklearn flavour stores the estimator as ``skops`` (the default of recent MLflow,
loadable without running code) or as ``pickle``/``cloudpickle`` (which runs whatever code the
file names). skops files are loaded with an allow-list computed here: only classes (and numpy
ufuncs) from ``sklearn``, ``numpy``, ``scipy.sparse`` and ``builtins`` are trusted; anything
else, functions such as ``builtins.exec`` or ``numpy.load`` included, refuses the file.
Pickles are refused unless the caller explicitly trusts the file, and even then they are
unpickled only in a sandboxed child process (:mod:`shamal.optimize._sandbox`):
:func:`export_mlflow_sklearn` and :func:`convert_trusted_pickle` never load one in the calling
process. :func:`load_sklearn_model` with ``trust_pickle=True`` is the in-process primitive the
sandbox's child runs; the control plane (serving, the optimizer) does not call it on pickles.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._folder import specs_of, write_model_folder
from shamal.optimize._lazy import module
from shamal.optimize._safety import contained, sniff_format
from shamal.optimize._sandbox import SandboxedModel, SandboxLimits, convert_in_sandbox

__all__ = [
    "INPUT_NAME",
    "convert_trusted_pickle",
    "export_mlflow_sklearn",
    "is_mlflow_sklearn",
    "is_pickled_sklearn",
    "load_sklearn_model",
    "sklearn_task",
    "synthetic_inputs",
]

logger = logging.getLogger(__name__)

MLMODEL = "MLmodel"
_MAX_MLMODEL_BYTES = 1024 * 1024
_TRUSTED_PREFIXES = ("sklearn.", "numpy.", "scipy.sparse.", "builtins.")
_PICKLE_FORMATS = ("pickle", "cloudpickle")
INPUT_NAME = "input"


def _mlmodel(folder: Path) -> dict[str, Any]:
    """The parsed ``MLmodel`` YAML of a folder (safe_load only)."""
    yaml = module("yaml")

    path = contained(folder, MLMODEL)
    if not path.is_file() or path.stat().st_size > _MAX_MLMODEL_BYTES:
        raise InvalidParameter("The folder has no MLmodel file (or it is too large).")
    try:
        parsed = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        raise InvalidParameter("The MLmodel file is not valid YAML.") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("flavors"), dict):
        raise InvalidParameter("The MLmodel file has no flavors.")
    return parsed


def is_mlflow_sklearn(folder: Path) -> bool:
    """Whether ``folder`` is an MLflow model with the sklearn flavour."""
    try:
        return isinstance(_mlmodel(folder)["flavors"].get("sklearn"), dict)
    except InvalidParameter:
        return False


def _resolve(dotted: str) -> object | None:
    """The object a dotted name names, importing only inside the trusted packages."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            found = getattr(found, attr, None)
            if found is None:
                return None
        return found
    return None


def _is_safe_type(name: str) -> bool:
    """A class (or a numpy ufunc) from sklearn, numpy, scipy.sparse or builtins.

    Functions are refused even there: ``builtins.exec``, ``builtins.eval`` or ``numpy.load``
    stored as, say, a FunctionTransformer's ``func`` would run on the model's inputs.
    """
    if not name.startswith(_TRUSTED_PREFIXES):
        return False
    found = _resolve(name)
    return isinstance(found, (type, np.ufunc))


def _trusted_skops_types(path: Path) -> list[str]:
    sio = module("skops.io")

    try:
        untrusted = sio.get_untrusted_types(file=str(path))
    except Exception:  # skops raises several types for malformed archives
        raise InvalidParameter("The skops file could not be read.") from None
    refused = sorted(t for t in untrusted if not _is_safe_type(t))
    if refused:
        shown = ", ".join(refused[:5]) + (" ..." if len(refused) > 5 else "")
        raise InvalidParameter(
            "The skops file names functions, or types outside scikit-learn, numpy, scipy.sparse "
            f"and builtins ({shown}); refusing to load it."
        )
    return list(untrusted)


def _load_skops(path: Path) -> Any:
    sio = module("skops.io")

    if sniff_format(path) != "zip":
        raise InvalidParameter("The skops model file is not a skops archive (by its bytes).")
    trusted = _trusted_skops_types(path)
    try:
        return sio.load(str(path), trusted=trusted)
    except Exception:
        raise InvalidParameter("The skops file could not be loaded.") from None


def _check_pickle(path: Path, fmt: str, trust_pickle: bool) -> None:
    if not trust_pickle:
        raise InvalidParameter(
            f"The model is stored as {fmt}, which can run arbitrary code when loaded; refused. "
            "Re-save it with serialization_format='skops', or, only if you trust its author, "
            "pass --trust-pickle (trust_pickle=True)."
        )
    if sniff_format(path) != "pickle":
        raise InvalidParameter("The model file is not a pickle (by its bytes).")


def _load_pickle(path: Path, fmt: str, trust_pickle: bool) -> Any:
    _check_pickle(path, fmt, trust_pickle)
    import pickle

    logger.warning("loading a trusted pickle in this process: %s", path.name)
    with path.open("rb") as f:
        # The caller trusted this file explicitly; the control plane only gets here inside
        # the sandbox's child process (shamal.optimize._sandbox_child).
        return pickle.load(f)  # nosec B301


def _model_file(folder: Path) -> tuple[Path, str, str]:
    """(model file inside ``folder``, serialization format, path as MLmodel gives it)."""
    flavor = _mlmodel(folder)["flavors"].get("sklearn")
    if not isinstance(flavor, dict):
        raise InvalidParameter("The MLmodel file has no sklearn flavor.")
    fmt = flavor.get("serialization_format", "pickle")
    model_file = flavor.get("pickled_model")
    if not isinstance(model_file, str) or not isinstance(fmt, str):
        raise InvalidParameter("The sklearn flavor needs pickled_model and serialization_format.")
    path = contained(folder, model_file)
    if not path.is_file():
        raise InvalidParameter("The sklearn flavor names a model file that does not exist.")
    return path, fmt, model_file


def is_pickled_sklearn(folder: Path) -> bool:
    """Whether an MLflow sklearn folder declares a pickle or cloudpickle model file.

    Raises:
        InvalidParameter: the MLmodel file or its sklearn flavour is malformed.
    """
    return _model_file(Path(folder).resolve())[1] in _PICKLE_FORMATS


def load_sklearn_model(folder: Path, *, trust_pickle: bool = False) -> Any:
    """Load the estimator of an MLflow sklearn-flavour model folder **in this process**.

    With ``trust_pickle=True`` a pickle is unpickled here, running its code in the caller: only
    the sandbox's child does that; everything else uses :func:`convert_trusted_pickle`.

    Args:
        folder: the folder holding ``MLmodel``.
        trust_pickle: allow the ``pickle``/``cloudpickle`` formats (they run code on load).

    Returns:
        The fitted estimator (or pipeline).

    Raises:
        InvalidParameter: no sklearn flavour, a model path outside the folder, a skops file
            naming untrusted types, a pickle without ``trust_pickle``, or a file whose bytes do
            not match its declared format.
    """
    folder = Path(folder).resolve()
    path, fmt, _ = _model_file(folder)
    if fmt == "skops":
        return _load_skops(path)
    if fmt in _PICKLE_FORMATS:
        return _load_pickle(path, fmt, trust_pickle)
    raise InvalidParameter("Unknown sklearn serialization_format; expected skops or pickle.")


def convert_trusted_pickle(
    folder: Path,
    *,
    trust_pickle: bool,
    inputs: np.ndarray | None = None,
    synthetic_rows: int = 0,
    limits: SandboxLimits | None = None,
) -> SandboxedModel:
    """Convert a pickled MLflow sklearn model to ONNX in the sandbox (and, when ``inputs`` or
    ``synthetic_rows`` are given, compute its outputs there); see
    :func:`shamal.optimize._sandbox.convert_in_sandbox`.

    Raises:
        InvalidParameter: not a pickled sklearn model, not trusted, not a pickle by its bytes,
            a path outside the folder, or the sandbox failed.
    """
    folder = Path(folder).resolve()
    path, fmt, relpath = _model_file(folder)
    if fmt not in _PICKLE_FORMATS:
        raise InvalidParameter("The model is not stored as a pickle.")
    _check_pickle(path, fmt, trust_pickle)
    logger.info("converting a trusted %s model in the sandbox: %s", fmt, path.name)
    return convert_in_sandbox(
        folder, path, relpath, inputs=inputs, synthetic_rows=synthetic_rows, limits=limits
    )


def synthetic_inputs(n_features: int, rows: int) -> np.ndarray:
    """Held-out rows when none are given: N(0, 1), seed 0, FP32 [rows, n_features]."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((rows, n_features)).astype(np.float32)


def sklearn_task(model: Any) -> str:
    """classification, regression or other."""
    from sklearn.base import is_classifier, is_regressor

    if is_classifier(model):
        return "classification"
    if is_regressor(model):
        return "regression"
    return "other"


def sklearn_labels(model: Any, graph: Any) -> dict[str, list[str]]:
    """A classifier's class names for its score output (the graph's second output)."""
    classes = getattr(model, "classes_", None)
    outputs = specs_of(graph)[1]
    if sklearn_task(model) != "classification" or classes is None or len(outputs) < 2:
        return {}
    return {outputs[1].name: [str(c) for c in np.asarray(classes).ravel().tolist()]}


def sklearn_to_onnx(model: Any) -> Any:
    """An ONNX graph of a fitted estimator: input ``input`` FP32 [N, n_features]; classifiers
    give ``label`` and ``probabilities`` as plain tensors (no ZipMap)."""
    convert_sklearn = module("skl2onnx").convert_sklearn
    float_tensor = module("skl2onnx.common.data_types").FloatTensorType

    n_features = getattr(model, "n_features_in_", None)
    if not isinstance(n_features, int) or n_features < 1:
        raise InvalidParameter("The estimator does not say how many features it takes.")
    options = {id(model): {"zipmap": False}} if sklearn_task(model) == "classification" else None
    try:
        return convert_sklearn(
            model, initial_types=[(INPUT_NAME, float_tensor([None, n_features]))], options=options
        )
    except Exception as exc:  # skl2onnx raises many types for unsupported estimators
        logger.info("skl2onnx failed: %r", exc)
        raise InvalidParameter(
            f"skl2onnx cannot convert a {type(model).__name__}; no ONNX converter for it."
        ) from None


def export_mlflow_sklearn(
    folder: Path, dest: Path, *, trust_pickle: bool = False, limits: SandboxLimits | None = None
) -> Path:
    """Convert an MLflow sklearn model folder to a model folder (``model.onnx`` +
    ``shamal-model.json``) at ``dest``; returns ``dest``.

    skops files are loaded here (allow-listed types only); trusted pickles only in the sandbox
    (``limits`` are its limits).

    Raises:
        InvalidParameter: see :func:`load_sklearn_model` and :func:`convert_trusted_pickle`;
            or no converter for the estimator.
    """
    folder = Path(folder).resolve()
    if is_pickled_sklearn(folder):
        made = convert_trusted_pickle(folder, trust_pickle=trust_pickle, limits=limits)
        write_model_folder(Path(dest), made.graph, task=made.task, labels=made.labels)
        return Path(dest)
    model = load_sklearn_model(folder, trust_pickle=False)
    graph = sklearn_to_onnx(model)
    labels = sklearn_labels(model, graph)
    write_model_folder(Path(dest), graph, task=sklearn_task(model), labels=labels)
    return Path(dest)
