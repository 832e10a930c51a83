"""scikit-learn models saved by MLflow: safe loading and conversion to ONNX.

The MLflow sklearn flavour stores the estimator as ``skops`` (the default of recent MLflow,
loadable without running code) or as ``pickle``/``cloudpickle`` (which runs whatever code the
file names). skops files are loaded with an allow-list computed here: only classes (and numpy
ufuncs) from ``sklearn``, ``numpy``, ``scipy.sparse`` and ``builtins`` are trusted; anything
else, functions such as ``builtins.exec`` or ``numpy.load`` included, refuses the file.
Pickles are refused unless the caller explicitly trusts the file.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._folder import write_model_folder
from shamal.optimize._lazy import module
from shamal.optimize._safety import contained, sniff_format

__all__ = ["export_mlflow_sklearn", "is_mlflow_sklearn", "load_sklearn_model", "sklearn_task"]

logger = logging.getLogger(__name__)

MLMODEL = "MLmodel"
_MAX_MLMODEL_BYTES = 1024 * 1024
_TRUSTED_PREFIXES = ("sklearn.", "numpy.", "scipy.sparse.", "builtins.")
_PICKLE_FORMATS = ("pickle", "cloudpickle")


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


def _load_pickle(path: Path, fmt: str, trust_pickle: bool) -> Any:
    if not trust_pickle:
        raise InvalidParameter(
            f"The model is stored as {fmt}, which can run arbitrary code when loaded; refused. "
            "Re-save it with serialization_format='skops', or, only if you trust its author, "
            "pass --trust-pickle (trust_pickle=True)."
        )
    if sniff_format(path) != "pickle":
        raise InvalidParameter("The model file is not a pickle (by its bytes).")
    import pickle

    logger.warning("loading a trusted pickle: %s", path.name)
    with path.open("rb") as f:
        # The caller trusted this file explicitly (--trust-pickle / --trust NAME).
        return pickle.load(f)  # nosec B301


def load_sklearn_model(folder: Path, *, trust_pickle: bool = False) -> Any:
    """Load the estimator of an MLflow sklearn-flavour model folder.

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
    if fmt == "skops":
        return _load_skops(path)
    if fmt in _PICKLE_FORMATS:
        return _load_pickle(path, fmt, trust_pickle)
    raise InvalidParameter("Unknown sklearn serialization_format; expected skops or pickle.")


def sklearn_task(model: Any) -> str:
    """classification, regression or other."""
    from sklearn.base import is_classifier, is_regressor

    if is_classifier(model):
        return "classification"
    if is_regressor(model):
        return "regression"
    return "other"


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
            model, initial_types=[("input", float_tensor([None, n_features]))], options=options
        )
    except Exception as exc:  # skl2onnx raises many types for unsupported estimators
        logger.info("skl2onnx failed: %r", exc)
        raise InvalidParameter(
            f"skl2onnx cannot convert a {type(model).__name__}; no ONNX converter for it."
        ) from None


def export_mlflow_sklearn(folder: Path, dest: Path, *, trust_pickle: bool = False) -> Path:
    """Convert an MLflow sklearn model folder to a model folder (``model.onnx`` +
    ``shamal-model.json``) at ``dest``; returns ``dest``.

    Raises:
        InvalidParameter: see :func:`load_sklearn_model`; or no converter for the estimator.
    """
    model = load_sklearn_model(folder, trust_pickle=trust_pickle)
    write_model_folder(dest, sklearn_to_onnx(model), task=sklearn_task(model))
    return dest
