"""Any PyTorch model through the optimizer: a torch model folder (safetensors weights and a
``shamal-model.json`` of format torch) whose module is built by a factory the operator names
with ``--torch-factory``. Judges: the torch module itself (reference outputs), onnxruntime
(the exported graph), the stock mlflow client (the registry) and tritonclient against a real
``shamal serve`` process (the variant folder is servable)."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
import typer
from safetensors.torch import save_file
from typer.testing import CliRunner

from shamal.cli.optimize import optimize
from shamal.client import ShamalClient
from shamal.errors import InvalidParameter
from shamal.optimize import OptimizeRequest, load_source, optimize_model, read_model_folder
from tests.live import LiveServer
from tests.optimize import torch_factories
from tests.optimize.conftest import Hostile

WINE = "tests.optimize.torch_factories:wine_mlp"
CONV = "tests.optimize.torch_factories:two_input_conv"
INT8 = "int8-dynamic-per-channel"


def _write_folder(folder: Path, module: torch.nn.Module, manifest: dict[str, Any]) -> Path:
    folder.mkdir(parents=True)
    state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    body = {"schema": 1, "format": "torch", "path": "model.safetensors", **manifest}
    (folder / "shamal-model.json").write_text(json.dumps(body))
    return folder


WINE_MANIFEST = {
    "max_batch_size": 64,
    "task": "classification",
    "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 13]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}],
}
CONV_MANIFEST = {
    "max_batch_size": 0,
    "task": "other",
    "inputs": [
        {"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, -1]},
        {"name": "scale", "datatype": "FP32", "shape": [-1, 4]},
    ],
    "outputs": [
        {"name": "scores", "datatype": "FP32", "shape": [-1, 2]},
        {"name": "pooled", "datatype": "FP32", "shape": [-1, 4]},
    ],
}


@pytest.fixture(scope="module")
def wine_torch(
    tmp_path_factory: pytest.TempPathFactory, wine: tuple[np.ndarray, ...]
) -> tuple[Path, torch.nn.Module, Path]:
    """(torch folder, the trained module, held-out .npz with ``features`` and ``y``)."""
    x_train, x_test, y_train, y_test = wine
    torch.manual_seed(0)
    module = torch_factories.wine_mlp()
    module.mean.copy_(torch.tensor(x_train.mean(0), dtype=torch.float32))
    module.scale.copy_(torch.tensor(x_train.std(0), dtype=torch.float32))
    optimizer = torch.optim.Adam(module.parameters(), lr=0.05)
    features, labels = torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train)
    for _ in range(60):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(features), labels).backward()
        optimizer.step()
    module.eval()
    root = tmp_path_factory.mktemp("wine-torch")
    folder = _write_folder(root / "model", module, WINE_MANIFEST)
    heldout = root / "heldout.npz"
    np.savez(heldout, features=x_test.astype(np.float32), y=y_test)
    return folder, module, heldout


def _predict(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return np.asarray(module(torch.from_numpy(x.astype(np.float32))).numpy())


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("optimize")(optimize)
    app.command("noop")(lambda: None)  # two commands: the first is called by name
    return app


def test_int8_variant_predicts_like_the_module(
    wine_torch: tuple[Path, torch.nn.Module, Path], wine: tuple[np.ndarray, ...], tmp_path: Path
) -> None:
    folder, module, heldout = wine_torch
    x_test, y_test = wine[1].astype(np.float32), wine[3]
    request = OptimizeRequest(
        int8="dynamic", eval_data=heldout, torch_factory=WINE, batches=(1, 8), threads=(1,)
    )
    report = optimize_model(folder, tmp_path / "out", request)
    assert (report.kind, report.task) == ("torch", "classification")
    assert [v.name for v in report.variants] == ["fp32", INT8]
    module_accuracy = float(np.mean(_predict(module, x_test).argmax(1) == y_test))
    assert module_accuracy > 0.85  # the module learned something: accuracy is a real check
    candidate = report.candidate
    assert candidate.verdict == "OK"
    assert candidate.fidelity.metric == "accuracy"
    assert candidate.fidelity.original == pytest.approx(module_accuracy)
    assert candidate.fidelity.drop <= 0.01
    assert candidate.fidelity.rows == len(x_test)
    assert report.variants[0].fidelity.max_abs_diff < 1e-4  # fp32 is the module itself
    assert {(t.batch, t.threads) for t in candidate.timings} == {(1, 1), (8, 1)}

    # The variant, run by onnxruntime, predicts what the module predicts.
    manifest = read_model_folder(candidate.folder)
    assert (manifest.task, manifest.max_batch_size) == ("classification", 64)
    assert [(t.name, t.shape) for t in manifest.inputs] == [("features", (-1, 13))]
    assert [(t.name, t.shape) for t in manifest.outputs] == [("logits", (-1, 3))]
    session = ort.InferenceSession(str(candidate.folder / "model.onnx"))
    (logits,) = session.run(["logits"], {"features": x_test})
    accuracy = float(np.mean(logits.argmax(1) == y_test))
    assert module_accuracy - accuracy <= 0.01
    assert np.mean(logits.argmax(1) == _predict(module, x_test).argmax(1)) >= 0.97


def test_cli_table_and_json_report(
    wine_torch: tuple[Path, torch.nn.Module, Path], tmp_path: Path
) -> None:
    folder, _, heldout = wine_torch
    common = ["optimize", str(folder), "--torch-factory", WINE, "--eval", str(heldout),
              "--batch-sizes", "1", "--threads", "1", "--no-register"]  # fmt: skip
    table = CliRunner().invoke(_app(), [*common, "-o", str(tmp_path / "t")], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert f"{folder} (torch, classification)" in table.stdout
    assert INT8 in table.stdout
    assert "accuracy" in table.stdout
    as_json = CliRunner().invoke(_app(), [*common, "-o", str(tmp_path / "j"), "--json"])
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    assert (report["kind"], report["candidate"], report["registered"]) == ("torch", INT8, None)
    assert report["variants"][-1]["verdict"] == "OK"
    assert report["variants"][-1]["fidelity"]["origin"] == "heldout.npz"


def _register_torch_folder(api: ShamalClient, folder: Path, name: str) -> str:
    """Log ``folder`` in a run and register it as version 1 of ``name``; returns the run id."""
    experiment = api.experiment_for_variants(None, "torch-sources")
    run_id = api.create_run(experiment, "torch-source", {})
    uri = api.upload_run_folder(run_id, folder, "model")
    api.finish_run(run_id)
    api.ensure_registered_model(name)
    api.create_model_version(name, uri, run_id, {})
    return run_id


@pytest.mark.slow
def test_models_uri_registers_a_linked_variant(
    mlflow_live: LiveServer, wine_torch: tuple[Path, torch.nn.Module, Path], tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    folder, _, heldout = wine_torch
    name = f"torch-wine-{uuid.uuid4().hex[:8]}"
    with ShamalClient() as api:
        _register_torch_folder(api, folder, name)
    args = ["optimize", f"models:/{name}/1", "--torch-factory", WINE, "--eval", str(heldout),
            "--batch-sizes", "1", "--threads", "1", "-o", str(tmp_path / "out"),
            "--json"]  # fmt: skip
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["registered"] == {"name": name, "version": 2}
    version = MlflowClient().get_model_version(name, "2")
    assert version.tags["shamal.source_model_uri"] == f"models:/{name}/1"
    assert version.tags["shamal.source_version"] == "1"
    assert version.tags["shamal.variant"] == INT8
    with ShamalClient() as api:
        registered = read_model_folder(api.download_model_version(name, 2, tmp_path / "v2"))
    assert registered.source == {"model_uri": f"models:/{name}/1", "variant": INT8}
    assert registered.max_batch_size == 64


def test_two_input_conv_net_exports_with_dynamic_axes(tmp_path: Path) -> None:
    torch.manual_seed(1)
    module = torch_factories.two_input_conv().eval()
    folder = _write_folder(tmp_path / "conv", module, CONV_MANIFEST)
    source = load_source(folder, torch_factory=CONV)
    assert source.eval_set.origin == "generated from specs, seeded"
    dims = {
        i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in source.graph.graph.input
    }
    assert dims["image"][0] == dims["scale"][0] == "batch"
    assert dims["image"][1:3] == [1, 8]
    assert isinstance(dims["image"][3], str)  # the width is free too
    assert source.graph.opset_import[0].version >= 17

    path = tmp_path / "conv.onnx"
    path.write_bytes(source.graph.SerializeToString())
    session = ort.InferenceSession(str(path))
    rng = np.random.default_rng(5)
    for batch, width in ((1, 6), (9, 11)):  # neither is a size the exporter saw
        image = rng.standard_normal((batch, 1, 8, width)).astype(np.float32)
        scale = rng.standard_normal((batch, 4)).astype(np.float32)
        scores, pooled = session.run(["scores", "pooled"], {"image": image, "scale": scale})
        with torch.inference_mode():
            want = module(torch.from_numpy(image), torch.from_numpy(scale))
        assert scores.shape == (batch, 2)
        np.testing.assert_allclose(scores, want["scores"].numpy(), atol=1e-5)
        np.testing.assert_allclose(pooled, want["pooled"].numpy(), atol=1e-5)

    report = optimize_model(
        folder,
        tmp_path / "out",
        OptimizeRequest(torch_factory=CONV, batches=(2,), threads=(1,), repeats=3),
    )
    fp32 = report.variants[0].fidelity
    assert fp32.cosine_min is not None
    assert fp32.cosine_min > 0.9999
    assert fp32.rows == 256
    assert read_model_folder(report.candidate.folder).inputs[0].shape == (-1, 1, 8, -1)


def _refusal(folder: Path, factory: str | None) -> str:
    with pytest.raises(InvalidParameter) as caught:
        load_source(folder, torch_factory=factory)
    return caught.value.message


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (None, "--torch-factory module:function"),
        ("no_such_module_for_shamal_tests:build", "Cannot import"),
        ("tests.optimize.torch_factories:missing", "has no function 'missing'"),
        ("tests.optimize.torch_factories:NOT_CALLABLE", "not callable"),
        ("tests.optimize.torch_factories", "module:function"),
        ("os:system;id", "module:function"),
        ("tests.optimize.torch_factories:not_a_module", "must return a torch.nn.Module"),
        ("tests.optimize.torch_factories:raises", "raised an error"),
        (CONV, "do not fit the factory's module"),
    ],
)
def test_bad_factories_are_refused(
    wine_torch: tuple[Path, torch.nn.Module, Path], factory: str | None, expected: str
) -> None:
    assert expected in _refusal(wine_torch[0], factory)


def test_cli_refusal_is_one_line_without_a_trace(
    wine_torch: tuple[Path, torch.nn.Module, Path], tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        _app(), ["optimize", str(wine_torch[0]), "-o", str(tmp_path / "out"), "--no-register"]
    )
    assert result.exit_code == 1
    assert "--torch-factory" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_factory_for_another_kind_of_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.onnx").write_bytes(b"\x08\x07")
    assert "for PyTorch model folders" in _refusal(tmp_path / "m", WINE)


@pytest.mark.parametrize("where", ["model.safetensors", "extra/weights.bin", "model.pt"])
def test_pickles_anywhere_in_the_folder_are_refused(
    wine_torch: tuple[Path, torch.nn.Module, Path], tmp_path: Path, sentinel: Path, where: str
) -> None:
    folder = tmp_path / "hostile"
    folder.mkdir()
    for part in wine_torch[0].iterdir():
        (folder / part.name).write_bytes(part.read_bytes())
    target = folder / where
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = Hostile(f"touch {sentinel}")
    if where == "model.pt":
        torch.save({"payload": payload}, target)  # a zip archive with a pickle inside
    else:
        target.write_bytes(pickle.dumps(payload))
    message = _refusal(folder, WINE)
    assert "pickle" in message
    assert where in message


def test_a_link_out_of_the_folder_is_refused(
    wine_torch: tuple[Path, torch.nn.Module, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "linked"
    folder.mkdir()
    for part in wine_torch[0].iterdir():
        (folder / part.name).write_bytes(part.read_bytes())
    (tmp_path / "outside.bin").write_bytes(b"secret")
    (folder / "data").symlink_to(tmp_path / "outside.bin")
    assert "links out of the model folder" in _refusal(folder, WINE)


def test_the_variant_folder_is_served(
    wine_torch: tuple[Path, torch.nn.Module, Path], wine: tuple[np.ndarray, ...], tmp_path: Path
) -> None:
    import tritonclient.http as triton

    from tests.serving.conftest import ServerProcess

    folder, module, heldout = wine_torch
    request = OptimizeRequest(eval_data=heldout, torch_factory=WINE, timed=False)
    variant = optimize_model(folder, tmp_path / "out", request).candidate
    server = ServerProcess(["--model", f"wine={variant.folder}"])
    try:
        client = triton.InferenceServerClient(server.host_port)
        rows = wine[1][:5].astype(np.float32)
        tensor = triton.InferInput("features", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        logits = client.infer("wine", [tensor]).as_numpy("logits")
        client.close()
    finally:
        assert server.stop() == 0
    assert logits.shape == (5, 3)
    # Served as the variant computes; how close the variant is to the module is the optimizer's
    # fidelity report (its int8 error moves with the exporter's and quantizer's versions).
    session = ort.InferenceSession(str(variant.folder / "model.onnx"))
    (local,) = session.run(["logits"], {"features": rows})
    np.testing.assert_allclose(logits, local, rtol=1e-5, atol=1e-4)
    assert (logits.argmax(1) == _predict(module, rows).argmax(1)).all()


def test_integer_inputs_are_generated_as_valid_indices(tmp_path: Path) -> None:
    torch.manual_seed(2)
    module = torch_factories.token_bag().eval()
    manifest = {
        "task": "embedding",
        "inputs": [{"name": "tokens", "datatype": "INT64", "shape": [-1, -1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 8]}],
    }
    folder = _write_folder(tmp_path / "bag", module, manifest)
    factory = "tests.optimize.torch_factories:token_bag"
    source = load_source(folder, torch_factory=factory)
    tokens = source.eval_set.feeds["tokens"]
    assert tokens.dtype == np.int64
    assert tokens.min() >= 0
    assert tokens.max() < 16
    report = optimize_model(folder, tmp_path / "out", OptimizeRequest(torch_factory=factory))
    fp32 = report.variants[0].fidelity
    assert fp32.cosine_min is not None
    assert fp32.cosine_min > 0.9999
    assert report.kind == "torch"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {
                "outputs": [
                    *WINE_MANIFEST["outputs"],
                    {"name": "extra", "datatype": "FP32", "shape": [-1, 3]},
                ]
            },
            "must return 2 tensor(s)",
        ),
        (
            {"outputs": [{"name": "logits", "datatype": "INT64", "shape": [-1, 3]}]},
            "declared INT64",
        ),
        (
            {"inputs": [{"name": "features", "datatype": "BYTES", "shape": [-1, 13]}]},
            "torch models take",
        ),
        ({"path": "../model.safetensors"}, "stay inside its folder"),
        ({"loader_module": "os"}, "unknown keys"),
    ],
)
def test_manifests_that_do_not_fit_the_module_are_refused(
    wine_torch: tuple[Path, torch.nn.Module, Path],
    tmp_path: Path,
    change: dict[str, Any],
    expected: str,
) -> None:
    module = wine_torch[1]
    folder = _write_folder(tmp_path / "m", module, {**WINE_MANIFEST, **change})
    assert expected in _refusal(folder, WINE)


def test_eval_data_of_the_wrong_shape_is_refused(
    wine_torch: tuple[Path, torch.nn.Module, Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, features=np.zeros((4, 12), np.float32))
    with pytest.raises(InvalidParameter, match=r"shape \[4, 12\]"):
        load_source(wine_torch[0], torch_factory=WINE, eval_data=bad)
