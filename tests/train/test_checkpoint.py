"""Checkpointer and stores in-process: completeness, retention, safety, ranks."""

from __future__ import annotations

import io
import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from tests import needs

needs.module("torch")

import torch  # noqa: E402

from shamal.train import Checkpointer, LocalCheckpointStore, warmup_cosine  # noqa: E402


def _setup() -> tuple[torch.nn.Sequential, torch.optim.Optimizer, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = warmup_cosine(optimizer, 2, 10)
    loss = model(torch.randn(3, 4)).sum()
    loss.backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def test_resume_restores_model_optimizer_scheduler_rng_and_data(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model, optimizer, scheduler = _setup()
    ckpt = Checkpointer(LocalCheckpointStore(tmp_path))
    ckpt.save(
        7,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data_state={"epoch": 2, "position": 48},
        extra={"note": "x"},
    )
    expected_next = (torch.rand(3), random.random())
    expected_weights = {k: v.clone() for k, v in model.state_dict().items()}
    expected_opt = optimizer.state_dict()["state"][0]["exp_avg"].clone()

    torch.manual_seed(99)
    random.seed(99)
    fresh, fresh_opt, fresh_sched = _setup()  # different weights, moments and RNG
    resumed = ckpt.resume(model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    assert resumed is not None
    assert (resumed.step, resumed.data_state, resumed.extra) == (
        7,
        {"epoch": 2, "position": 48},
        {"note": "x"},
    )
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, expected_weights[name])
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], expected_opt)
    assert fresh_sched.state_dict()["last_epoch"] == scheduler.state_dict()["last_epoch"]
    assert torch.equal(torch.rand(3), expected_next[0])
    assert random.random() == expected_next[1]


def test_nothing_to_resume_changes_nothing(tmp_path: Path) -> None:
    model, _, _ = _setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert Checkpointer(LocalCheckpointStore(tmp_path)).resume(model=model) is None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_torn_and_corrupt_checkpoints_are_skipped(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path)
    ckpt = Checkpointer(store, keep_last=5)
    model, _, _ = _setup()
    ckpt.save(1, model=model)
    good = model.state_dict()["0.weight"].clone()
    with torch.no_grad():
        model.state_dict()["0.weight"].add_(1.0)
    ckpt.save(2, model=model)
    ckpt.save(3, model=model)
    store.delete("ckpt-000000000003/manifest.json")  # killed before the manifest
    data = bytearray(store.get("ckpt-000000000002/model.safetensors"))
    data[-1] ^= 0xFF
    store.put("ckpt-000000000002/model.safetensors", bytes(data))  # bit rot
    resumed = ckpt.resume(model=model)
    assert resumed is not None
    assert resumed.step == 1
    assert torch.equal(model.state_dict()["0.weight"], good)


def test_keeps_the_last_k_and_the_best(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path)
    ckpt = Checkpointer(store, keep_last=2, best_metric="val_loss", mode="min")
    model, _, _ = _setup()
    store.put("ckpt-000000000000/model.safetensors", b"left by a killed save")
    store.put("ckpt-notes/readme.txt", b"not a checkpoint: left alone")
    for step, loss in zip(range(1, 6), [5.0, 1.0, 4.0, 3.0, 2.0], strict=True):
        ckpt.save(step, model=model, metrics={"val_loss": loss})
    listed = store.keys()
    folders = sorted({key.split("/")[0] for key in listed})
    assert folders == [
        "ckpt-000000000002",
        "ckpt-000000000004",
        "ckpt-000000000005",
        "ckpt-notes",
    ]
    best = ckpt.best()
    assert best is not None
    assert best["step"] == 2


def test_tied_weights_are_stored_once_and_stay_tied(tmp_path: Path) -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    ckpt = Checkpointer(LocalCheckpointStore(tmp_path))
    ckpt.save(1, model=model)
    fresh = Tied()
    assert ckpt.resume(model=fresh) is not None
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    assert fresh.head.weight is fresh.embed.weight
    manifest = json.loads((tmp_path / "ckpt-000000000001" / "manifest.json").read_text())
    assert manifest["aliases"] == {"head.weight": "embed.weight"}


class _Gadget:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def test_state_is_loaded_without_unpickling_arbitrary_objects(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path)
    ckpt = Checkpointer(store)
    model, _, _ = _setup()
    ckpt.save(1, model=model)
    buffer = io.BytesIO()
    torch.save({"optimizer": _Gadget()}, buffer)
    evil = buffer.getvalue()
    manifest = json.loads(store.get("ckpt-000000000001/manifest.json"))
    import hashlib

    manifest["files"]["state.pt"] = hashlib.sha256(evil).hexdigest()
    store.put("ckpt-000000000001/state.pt", evil)
    store.put("ckpt-000000000001/manifest.json", json.dumps(manifest).encode())
    with pytest.raises(pickle.UnpicklingError):
        ckpt.resume(model=model)


def test_only_rank_zero_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    store = LocalCheckpointStore(tmp_path)
    model, _, _ = _setup()
    assert Checkpointer(store).save(1, model=model) is None
    assert store.keys() == []
    monkeypatch.setenv("RANK", "0")
    assert Checkpointer(store).save(1, model=model) == "ckpt-000000000001"
    assert len(store.keys()) == 3


def test_local_store_rejects_escaping_keys(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path / "root")
    for bad in ("../x", "a//b", "/abs", "a/./b", ""):
        with pytest.raises(ValueError, match="invalid checkpoint key"):
            store.put(bad, b"x")
    with pytest.raises(KeyError):
        store.get("missing")
