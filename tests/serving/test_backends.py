"""One contract suite for every :class:`Backend` (ONNX Runtime and torch), run in-process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from shamal.serving._backends import Backend, BackendOptions, load_backend
from shamal.serving._datatypes import DATATYPES, numpy_dtype
from shamal.serving._modelfiles import read_model_files
from tests.serving.models import gated_model, scale_model

Builder = Callable[[Path, BackendOptions], Backend]


def _onnx(tmp_path: Path, options: BackendOptions) -> Backend:
    path = scale_model(tmp_path / "scale.onnx", 2.0)
    files = read_model_files(path, name="m", trusted=False, work_dir=tmp_path)
    return load_backend("m", files, options)


def _torch(tmp_path: Path, options: BackendOptions) -> Backend:
    folder = gated_model(tmp_path / "torch", factor=2.0)  # no gate folder set: never waits
    files = read_model_files(folder, name="m", trusted=False, work_dir=tmp_path)
    factories = {"m": "tests.serving.factories:gated"}
    return load_backend(
        "m",
        files,
        BackendOptions(
            threads=options.threads,
            default_max_batch_size=options.default_max_batch_size,
            torch_factories=factories,
        ),
    )


BACKENDS: dict[str, Builder] = {"onnx": _onnx, "torch": _torch}


@pytest.fixture(params=sorted(BACKENDS))
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Builder:
    monkeypatch.delenv("SERVE_TEST_GATE", raising=False)
    return BACKENDS[request.param]


def test_metadata_uses_oip_names(build: Builder, tmp_path: Path) -> None:
    backend = build(tmp_path, BackendOptions(threads=1))
    assert [(s.name, s.datatype, s.shape) for s in backend.inputs] == [("x", "FP32", (-1, 2))]
    assert [(s.name, s.datatype, s.shape) for s in backend.outputs] == [("y", "FP32", (-1, 2))]
    assert all(s.datatype in DATATYPES for s in backend.inputs + backend.outputs)
    assert backend.platform


def test_run_returns_every_output_with_declared_dtype(build: Builder, tmp_path: Path) -> None:
    backend = build(tmp_path, BackendOptions(threads=1))
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    out = backend.run({"x": x})
    assert set(out) == {s.name for s in backend.outputs}
    for spec in backend.outputs:
        assert out[spec.name].dtype == numpy_dtype(spec.datatype)
        assert out[spec.name].shape[0] == 5
    np.testing.assert_array_equal(out["y"], x * 2)


def test_batch_size_follows_variable_first_dim_and_option(build: Builder, tmp_path: Path) -> None:
    assert build(tmp_path / "a", BackendOptions(default_max_batch_size=16)).max_batch_size == 16
    assert build(tmp_path / "b", BackendOptions(default_max_batch_size=0)).max_batch_size == 0


def test_runs_from_worker_threads(build: Builder, tmp_path: Path) -> None:
    backend = build(tmp_path, BackendOptions(threads=1))
    results: list[np.ndarray] = []

    def work(value: float) -> None:
        results.append(backend.run({"x": np.full((3, 2), value, np.float32)})["y"])

    threads = [threading.Thread(target=work, args=(float(i),)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(float(r[0, 0]) for r in results) == [0.0, 2.0, 4.0, 6.0]
    backend.close()
