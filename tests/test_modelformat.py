"""The model folder format is read by one set of rules, whoever reads it.

The model server (:func:`shamal.serving._modelfiles.read_model_files`) and the optimizer
(:func:`shamal.optimize.read_model_folder`, :func:`shamal.optimize._torch.read_torch_manifest`)
all go through :mod:`shamal.modelformat`: a manifest one of them refuses, the others refuse too,
and a file is told by its bytes the same way everywhere (hostile-inputs.md §4).
"""

from __future__ import annotations

import json
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from shamal.errors import InvalidParameter
from shamal.modelformat import MANIFEST, TensorSpec, read_manifest, sniff_format
from shamal.optimize import read_model_folder
from shamal.optimize._torch import read_torch_manifest, refuse_pickles
from shamal.serving._backends import BackendOptions
from shamal.serving._repository import ModelSource, load_repository
from shamal.serving._types import TensorSpec as ServedTensorSpec
from tests.serving.models import identity_model

_TENSOR = {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}
_OUT = {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}


def _safetensors(path: Path, header: bytes) -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


def _write(folder: Path, **fields: Any) -> Path:
    manifest = {"schema": 1, "format": "onnx", "path": "model.onnx", "task": "other"}
    manifest |= {"inputs": [_TENSOR], "outputs": [_OUT]} | fields
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def _served(folder: Path, tmp_path: Path) -> None:
    load_repository(
        [ModelSource("m", None, str(folder))],
        BackendOptions(threads=1),
        trusted=[],
        work_dir=tmp_path / "work",
    )


# ---------------------------------------------------------------------- bytes, not names
@pytest.mark.parametrize("protocol", range(6))
def test_pickles_of_every_protocol_are_pickles(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(pickle.dumps({"weights": [1.0, 2.0], "name": "x"}, protocol=protocol))
    assert sniff_format(path) == "pickle"


def test_a_protocol_0_global_pickle_is_a_pickle(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"cos\nsystem\n(S'touch /tmp/x'\ntR.")  # os.system('touch /tmp/x')
    assert sniff_format(path) == "pickle"


def test_kinds_are_told_by_their_bytes(tmp_path: Path) -> None:
    onnx_file = identity_model(tmp_path / "weights.pkl", "FP32")
    assert sniff_format(onnx_file) == "onnx"
    archive = tmp_path / "model.onnx"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("archive/data.pkl", b"\x80\x04N.")
    assert sniff_format(archive) == "zip"
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    assert sniff_format(empty) == "empty"
    card = tmp_path / "README.onnx"
    card.write_text("cats are the model's subject.")  # starts with c, ends with ".": still text
    assert sniff_format(card) == "text"
    assert sniff_format(_safetensors(tmp_path / "w", b'{"__metadata__":{}}')) == "safetensors"


def test_safetensors_whose_header_length_starts_like_a_pickle_are_safetensors(
    tmp_path: Path,
) -> None:
    # A 640-byte header is written 80 02 00 ..., as a protocol-2 pickle begins.
    header = b'{"__metadata__":{"note":"' + b"x" * 598 + b'"}}'
    header += b" " * (640 - len(header))
    path = _safetensors(tmp_path / "model.safetensors", header)
    assert path.read_bytes()[:2] == b"\x80\x02"
    assert sniff_format(path) == "safetensors"


def test_a_torch_folder_with_an_old_protocol_pickle_anywhere_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "torch"
    (folder / "extra").mkdir(parents=True)
    _safetensors(folder / "model.safetensors", b'{"__metadata__":{}}')
    refuse_pickles(folder)
    (folder / "extra" / "tokenizer.txt").write_bytes(pickle.dumps(["a"], protocol=0))
    with pytest.raises(InvalidParameter, match=r"extra/tokenizer\.txt is a pickle"):
        refuse_pickles(folder)


# ---------------------------------------------------------------------- one manifest rule set
def test_the_server_and_the_optimizer_describe_tensors_with_one_class() -> None:
    assert ServedTensorSpec is TensorSpec


def test_a_good_manifest_reads_the_same_everywhere(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    identity_model(folder / "model.onnx", "FP32")
    _write(folder, labels={"OUTPUT0": ["a", "b", "c", "d"]}, source={"model_uri": "models:/m/1"})
    manifest = read_model_folder(folder)
    assert manifest == read_manifest(folder)
    assert manifest.inputs == (TensorSpec("INPUT0", "FP32", (-1, 4)),)
    assert manifest.labels == {"OUTPUT0": ["a", "b", "c", "d"]}
    assert manifest.to_json() == json.loads((folder / MANIFEST).read_text()) | {"max_batch_size": 0}
    _served(folder, tmp_path)  # loads


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"schema": 2}, "schema 1"),
        ({"loader_module": "os"}, "unknown keys"),
        ({"format": "pickle"}, "format"),
        ({"task": "segmentation"}, "task"),
        ({"max_batch_size": -1}, "max_batch_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"source": {"model_uri": 7}}, "source"),
        ({"source": "models:/m/1"}, "source"),
        ({"inputs": [_TENSOR, _TENSOR]}, "share a name"),
        ({"inputs": [_TENSOR | {"shape": [1] * 17}]}, "shape"),
        ({"inputs": [_TENSOR | {"datatype": "FP8"}]}, "datatype"),
        ({"inputs": [_TENSOR | {"loader": "os"}]}, "name, datatype and shape"),
        ({"inputs": [_TENSOR] * 300}, "at most 256"),
        ({"labels": {"OUTPUT0": [1, 2]}}, "labels"),
        ({"path": "../model.onnx"}, "inside its folder"),
        ({"path": "missing.onnx"}, "missing"),
        ({"path": None}, "inside its folder"),
    ],
)
def test_a_bad_manifest_is_refused_by_every_reader(
    tmp_path: Path, fields: dict[str, Any], words: str
) -> None:
    folder = tmp_path / "m"
    identity_model(folder / "model.onnx", "FP32")
    _write(folder, **fields)
    with pytest.raises(InvalidParameter, match=words):
        read_model_folder(folder)
    with pytest.raises(InvalidParameter, match=words):
        read_torch_manifest(folder)
    with pytest.raises(InvalidParameter, match=f"Model 'm': .*{words}"):
        _served(folder, tmp_path)


def test_an_oversized_manifest_is_refused_unread(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    identity_model(folder / "model.onnx", "FP32")
    _write(folder, labels={"OUTPUT0": ["a"] * 400_000})
    with pytest.raises(InvalidParameter, match="too large"):
        read_model_folder(folder)
    with pytest.raises(InvalidParameter, match="Model 'm': .*too large"):
        _served(folder, tmp_path)


def test_each_reader_keeps_to_its_own_format(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    identity_model(folder / "model.onnx", "FP32")
    _write(folder)
    with pytest.raises(InvalidParameter, match="expected format torch"):
        read_torch_manifest(folder)
    _safetensors(folder / "model.safetensors", b'{"__metadata__":{}}')
    _write(folder, format="torch", path="model.safetensors")
    assert read_torch_manifest(folder).inputs == (TensorSpec("INPUT0", "FP32", (-1, 4)),)
    with pytest.raises(InvalidParameter, match="expected format onnx"):
        read_model_folder(folder)
