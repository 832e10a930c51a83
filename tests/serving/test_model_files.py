"""Hostile model files (hostile-inputs.md §4) are refused before any loader runs them, and the
accepted formats load: bare .onnx, model folders, MLflow onnx and sklearn flavours.

SENTINEL must never exist: every pickle here would ``touch`` it when loaded.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from shamal.errors import InvalidParameter
from shamal.serving._backends import BackendOptions
from shamal.serving._repository import ModelRepository, ModelSource, load_repository
from tests.needs import module
from tests.serving.conftest import REPO
from tests.serving.models import (
    external_data_model,
    gated_model,
    identity_model,
    pickle_bomb,
    scale_model,
    write_manifest,
)


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "SENTINEL"
    yield path
    assert not path.exists(), "a model file ran code"


def _load(path: Path, tmp_path: Path, *, trusted: bool = False, name: str = "m") -> ModelRepository:
    return load_repository(
        [ModelSource(name, None, str(path))],
        BackendOptions(threads=1),
        trusted=[name] if trusted else [],
        work_dir=tmp_path / "work",
    )


def _refused(path: Path, tmp_path: Path, *words: str) -> str:
    with pytest.raises(InvalidParameter) as caught:
        _load(path, tmp_path)
    message = caught.value.message
    assert "Model 'm'" in message
    for word in words:
        assert word in message
    return message


def test_pickle_named_model_onnx_is_refused(tmp_path: Path, sentinel: Path) -> None:
    bare = pickle_bomb(tmp_path / "bare" / "model.onnx", sentinel)
    _refused(bare, tmp_path, "pickle")
    _refused(bare.parent, tmp_path, "pickle")  # a folder with model.onnx


@pytest.mark.parametrize("filename", ["model.safetensors", "model.pt", "weights", "model.joblib"])
def test_pickle_as_torch_weights_is_refused(tmp_path: Path, sentinel: Path, filename: str) -> None:
    folder = tmp_path / "torch"
    pickle_bomb(folder / filename, sentinel)
    write_manifest(
        folder,
        fmt="torch",
        path=filename,
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        outputs=[{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
    )
    _refused(folder, tmp_path, "safetensors")


def test_torch_zip_archive_is_refused(tmp_path: Path, sentinel: Path) -> None:
    folder = tmp_path / "zip"
    folder.mkdir()
    torch.save({"factor": torch.ones(1)}, folder / "model.onnx")  # a zip of pickles
    _refused(folder, tmp_path, "pickle")


@pytest.mark.parametrize(
    "path", ["../../etc/passwd", "/etc/passwd", "..", "a/../../x", "C:/Windows/win.ini", "a\\..\\x"]
)
def test_manifest_path_traversal_is_refused(tmp_path: Path, path: str) -> None:
    folder = tmp_path / "folder"
    identity_model(folder / "model.onnx", "FP32")
    write_manifest(folder, fmt="onnx", path=path)
    _refused(folder, tmp_path, "inside its folder")


def test_manifest_symlink_out_is_refused(tmp_path: Path) -> None:
    outside = identity_model(tmp_path / "outside" / "real.onnx", "FP32")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "model.onnx").symlink_to(outside)
    write_manifest(folder, fmt="onnx", path="model.onnx")
    _refused(folder, tmp_path, "inside its folder")


def test_manifest_naming_code_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    identity_model(folder / "model.onnx", "FP32")
    write_manifest(folder, fmt="onnx", path="model.onnx", loader_module="os")
    _refused(folder, tmp_path, "unknown keys")
    write_manifest(folder, fmt="pickle", path="model.onnx")
    _refused(folder, tmp_path, "format")


@pytest.mark.parametrize(
    ("labels", "words"),
    [
        (["a", "b"], ("labels",)),
        ({"OUTPUT0": "a,b"}, ("labels",)),
        ({"OUTPUT0": ["a", 7]}, ("labels",)),
        ({"OUTPUT0": ["x" * 5000]}, ("labels",)),
        ({"OUTPUT0": ["a"] * 400_000}, ("too large",)),
        ({"nope": ["a"]}, ("labels", "'nope'", "not outputs")),
    ],
)
def test_manifest_labels_that_do_not_fit_are_refused(
    tmp_path: Path, labels: object, words: tuple[str, ...]
) -> None:
    folder = tmp_path / "folder"
    identity_model(folder / "model.onnx", "FP32")
    write_manifest(folder, fmt="onnx", path="model.onnx", labels=labels)
    _refused(folder, tmp_path, *words)


def test_manifest_labels_reach_the_served_model(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    identity_model(folder / "model.onnx", "FP32")
    write_manifest(folder, fmt="onnx", path="model.onnx", labels={"OUTPUT0": ["a", "b"]})
    served = _load(folder, tmp_path).get("m", "1")
    assert served.labels == {"OUTPUT0": ("a", "b")}


@pytest.mark.parametrize(
    "location", ["../outside.bin", "/etc/passwd", "..", "sub/../../outside.bin"]
)
def test_onnx_external_data_outside_the_folder_is_refused(tmp_path: Path, location: str) -> None:
    (tmp_path / "outside.bin").write_bytes(b"\0" * 8)
    path = external_data_model(tmp_path / "model", location)
    _refused(path.parent, tmp_path, "outside its folder")


def test_onnx_external_data_symlink_out_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside.bin").write_bytes(b"\0" * 8)
    path = external_data_model(tmp_path / "model", "weights.bin")
    (path.parent / "weights.bin").symlink_to(tmp_path / "outside.bin")
    _refused(path.parent, tmp_path, "outside its folder")


def test_onnx_external_data_inside_the_folder_loads(tmp_path: Path) -> None:
    path = external_data_model(tmp_path / "model", "weights.bin")
    (path.parent / "weights.bin").write_bytes(np.array([1.0, 2.0], "<f4").tobytes())
    repository = _load(path.parent, tmp_path)
    backend = repository.get("m", "1").backend
    out = backend.run({"x": np.ones((1, 2), np.float32)})
    assert out["y"].tolist() == [[1.0, 2.0]]


def test_not_an_onnx_graph_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x12\x34 this is not protobuf \xff" * 10)
    _refused(junk, tmp_path, "not an ONNX file", "first bytes")
    junk.write_bytes(b"\x08\x07 starts like a graph, then is not protobuf \xff" * 10)
    _refused(junk, tmp_path, "not a valid ONNX file")
    junk.write_text("name: a model card, not a model\n")
    _refused(junk, tmp_path, "not an ONNX file", "text")
    _refused(tmp_path / "missing.onnx", tmp_path, "does not exist")


def test_torch_model_without_factory_says_what_to_pass(tmp_path: Path) -> None:
    folder = gated_model(tmp_path / "gated")
    _refused(folder, tmp_path, "--torch-factory m=module:function")


def _mlflow_folder(folder: Path, flavors: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "MLmodel").write_text(f"artifact_path: model\nflavors:\n{flavors}")
    return folder


def test_mlflow_onnx_flavour_loads(tmp_path: Path) -> None:
    folder = _mlflow_folder(
        tmp_path / "mlflow", "  onnx:\n    data: graph.onnx\n    onnx_version: 1.17.0\n"
    )
    scale_model(folder / "graph.onnx", 2.0)
    repository = _load(folder, tmp_path)
    out = repository.get("m", "1").backend.run({"x": np.ones((2, 2), np.float32)})
    assert out["y"].tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_mlflow_python_function_loader_module_is_refused(tmp_path: Path, sentinel: Path) -> None:
    folder = _mlflow_folder(
        tmp_path / "pyfunc",
        "  python_function:\n    loader_module: os\n    python_model: ../x.pkl\n",
    )
    pickle_bomb(folder / "python_model.pkl", sentinel)
    _refused(folder, tmp_path, "no 'onnx' or 'sklearn' flavour")


def _sklearn_flavour(folder: Path, fmt: str, filename: str) -> Path:
    return _mlflow_folder(
        folder,
        f"  sklearn:\n    pickled_model: {filename}\n    serialization_format: {fmt}\n"
        "    sklearn_version: 1.5.0\n",
    )


def test_mlflow_sklearn_pickle_is_refused_unless_trusted(tmp_path: Path, sentinel: Path) -> None:
    folder = _sklearn_flavour(tmp_path / "sk", "cloudpickle", "model.pkl")
    pickle_bomb(folder / "model.pkl", sentinel)
    message = _refused(folder, tmp_path)
    assert "--trust m" in message


def test_mlflow_sklearn_pickle_loads_when_trusted(tmp_path: Path) -> None:
    import pickle

    from sklearn.datasets import load_iris
    from sklearn.tree import DecisionTreeClassifier

    features, target = load_iris(return_X_y=True)
    estimator = DecisionTreeClassifier(max_depth=3, random_state=0).fit(features, target)
    folder = _sklearn_flavour(tmp_path / "sk", "pickle", "model.pkl")
    (folder / "model.pkl").write_bytes(pickle.dumps(estimator, protocol=4))
    repository = _load(folder, tmp_path, trusted=True)
    backend = repository.get("m", "1").backend
    (spec,) = backend.inputs
    out = backend.run({spec.name: features[:6].astype(np.float32)})
    np.testing.assert_array_equal(out["label"], estimator.predict(features[:6]))


def test_mlflow_sklearn_skops_is_converted_and_served(tmp_path: Path) -> None:
    skops_io = module("skops.io")
    from sklearn.datasets import load_wine
    from sklearn.linear_model import LogisticRegression

    features, target = load_wine(return_X_y=True)
    features = features.astype(np.float32)
    estimator = LogisticRegression(max_iter=3000).fit(features, target)
    folder = _sklearn_flavour(tmp_path / "sk", "skops", "model.skops")
    skops_io.dump(estimator, folder / "model.skops")
    repository = _load(folder, tmp_path)
    backend = repository.get("m", "1").backend
    (spec,) = backend.inputs
    out = backend.run({spec.name: features[:5]})
    np.testing.assert_array_equal(out["label"], estimator.predict(features[:5]))
    # The classification extension names the classes by the estimator's own classes_.
    assert repository.get("m", "1").labels == {"probabilities": ("0", "1", "2")}


def test_cli_refusal_is_one_clear_line_and_exit_1(tmp_path: Path, sentinel: Path) -> None:
    bomb = pickle_bomb(tmp_path / "model.onnx", sentinel)
    done = subprocess.run(
        [sys.executable, "-m", "shamal", "serve", "--model", f"evil={bomb}", "--http-port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "error:" in done.stderr
    assert "pickle" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "Serving OIP REST" not in done.stdout


def test_cli_usage_errors_say_what_to_do(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shamal", "serve", "--model", "no-equals-sign"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "NAME=PATH_OR_URI" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--device", "tpu"], "--device takes auto, cpu or cuda."),
        (["--report-interval", "0.01"], "--report-interval must be at least 0.05 seconds."),
        (["--queue-size", "0"], "--queue-size must be at least 1."),
    ],
)
def test_cli_refuses_bad_serving_options_before_loading_a_model(
    tmp_path: Path, options: list[str], message: str
) -> None:
    model = scale_model(tmp_path / "m.onnx", 2.0)
    done = subprocess.run(
        [sys.executable, "-m", "shamal", "serve", "--model", f"m={model}", *options],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert "Serving OIP" not in done.stdout


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port"])
def test_cli_port_in_use_is_a_clear_error(tmp_path: Path, flag: str) -> None:
    model = scale_model(tmp_path / "m.onnx", 2.0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = ["--http-port", "0", flag, str(port)]
        done = subprocess.run(
            [sys.executable, "-m", "shamal", "serve", "--model", f"m={model}", *ports],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert "listen on" in done.stderr
    assert flag in done.stderr
    assert "Traceback" not in done.stderr
    assert "Serving OIP" not in done.stdout


def test_cli_help_lists_the_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shamal", "serve", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0
    for option in ("--model", "--http-port", "--grpc-port", "--max-batch-size", "--trust"):
        assert option in done.stdout


# ------------------------------------------------------ OpenVINO folders and variant sets
def _scale_set(tmp_path: Path, kind_factor: dict[str, float]) -> Path:
    """A variant set of scale models: ``portable`` scales by 1, each CPU kind by its factor."""
    from shamal.modelformat import VariantEntry, VariantSet, host_cpu, write_variant_set

    root = tmp_path / "set"
    scale_model(root / "portable" / "model.onnx", 1.0)
    write_manifest(root / "portable", fmt="onnx", path="model.onnx")
    entries = []
    here = host_cpu()
    for kind, factor in kind_factor.items():
        scale_model(root / kind / "model.onnx", factor)
        write_manifest(root / kind, fmt="onnx", path="model.onnx")
        flags = {"x86-amx": ["avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8",
                             "amx_bf16"], "x86-avx2": ["avx2", "fma"]}.get(kind)  # fmt: skip
        cpu = here if flags is None else type(here)("Other CPU", here.arch, frozenset(flags))
        entries.append(VariantEntry(kind, f"scale-{factor}", cpu))
    write_variant_set(root, VariantSet("portable", tuple(entries)))
    return root


def _answer(repository: ModelRepository) -> list[float]:
    served = next(iter(repository.all()))
    out = served.backend.run({"x": np.array([[1.0, 2.0]], dtype=np.float32)})
    return [float(v) for v in next(iter(out.values())).ravel()]


def test_a_variant_set_serves_the_build_for_this_cpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from shamal.modelformat import host_cpu

    here = host_cpu().kind
    caplog.set_level("INFO", logger="shamal.serving")
    repository = _load(_scale_set(tmp_path, {here: 3.0}), tmp_path)
    assert _answer(repository) == [3.0, 6.0]
    assert any("serving variant scale-3.0" in r.getMessage() for r in caplog.records)


def test_a_variant_set_without_a_build_for_this_cpu_serves_the_portable_one(
    tmp_path: Path,
) -> None:
    from shamal.modelformat import host_cpu

    other = "x86-amx" if host_cpu().kind != "x86-amx" else "x86-avx2"
    repository = _load(_scale_set(tmp_path, {other: 5.0}), tmp_path)
    if other == "x86-avx2" and host_cpu().supports(frozenset({"avx2", "fma"})):
        assert _answer(repository) == [5.0, 10.0]  # a lesser CPU's build runs here
    else:
        assert _answer(repository) == [1.0, 2.0]


def test_a_variant_set_that_points_out_of_its_folder_is_refused(tmp_path: Path) -> None:
    import json

    root = _scale_set(tmp_path, {})
    raw = json.loads((root / "shamal-variants.json").read_text())
    raw["portable"] = "../elsewhere"
    (tmp_path / "elsewhere").mkdir()
    (root / "shamal-variants.json").write_text(json.dumps(raw))
    _refused(root, tmp_path, "inside its folder")


def test_an_openvino_folder_with_entities_is_refused_before_openvino_reads_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ov"
    folder.mkdir()
    (folder / "model.xml").write_text(
        '<?xml version="1.0"?><!DOCTYPE net [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        "<net><layers>&x;</layers></net>"
    )
    (folder / "model.bin").write_bytes(b"")
    write_manifest(folder, fmt="openvino", path="model.xml")
    _refused(folder, tmp_path, "DTD")


def test_a_precision_on_an_onnx_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "scaled"
    scale_model(folder / "model.onnx", 2.0)
    write_manifest(folder, fmt="onnx", path="model.onnx", precision="bf16")
    _refused(folder, tmp_path, "precision")
