"""shard_model and ShardedCheckpointer in one process (a one-worker group over gloo).

Hostile checkpoints (a tampered or missing shard, a manifest naming a path outside the
checkpoint, an index that asks the unpickler for code) are refused with a clear error
before anything is changed: parameters, optimizer state and RNG stay as they were.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import needs

needs.module("torch")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402

from shamal.train import (  # noqa: E402
    LocalCheckpointStore,
    ShardedCheckpointer,
    ShardedCheckpointError,
    ShardingError,
    shard_model,
    warmup_cosine,
)
from tests.train._fsdp_worker import Block, Net  # noqa: E402

FOLDER = "ckpt-000000000003"


@pytest.fixture(autouse=True)
def one_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No gang in the environment; the group shard_model makes is gone after the test."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = shard_model(Net())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = warmup_cosine(optimizer, 2, 10)
    for _ in range(3):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    found = {f"model.{k}": v.full_tensor().clone() for k, v in model.state_dict().items()}
    for index, moments in optimizer.state_dict()["state"].items():
        for key, value in moments.items():
            local = value.full_tensor() if hasattr(value, "full_tensor") else value
            found[f"optim.{index}.{key}"] = local.clone()
    return found


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _saved(tmp_path: Path) -> tuple[LocalCheckpointStore, dict[str, torch.Tensor]]:
    store = LocalCheckpointStore(tmp_path / "store")
    model, optimizer, scheduler = _trained(1)
    ShardedCheckpointer(store).save(
        3, model=model, optimizer=optimizer, scheduler=scheduler, data_state={"position": 12}
    )
    return store, _snapshot(model, optimizer)


def _manifest(store: LocalCheckpointStore) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(store.get(f"{FOLDER}/manifest.json"))
    return data


# ---------------------------------------------------------------- shard_model
def test_blocks_are_the_repeated_children_or_the_given_classes() -> None:
    model = shard_model(Net())
    assert isinstance(model, FSDPModule)
    assert all(isinstance(block, FSDPModule) for block in model.blocks)  # type: ignore[attr-defined]
    assert not isinstance(model.embed, FSDPModule)  # type: ignore[attr-defined]
    dist.destroy_process_group()

    given = shard_model(Net(), blocks=[Block, torch.nn.Linear])
    # outermost matches only: the Linear layers inside a Block are not sharded apart
    assert isinstance(given.embed, FSDPModule)  # type: ignore[attr-defined]
    assert isinstance(given.blocks[0], FSDPModule)  # type: ignore[attr-defined,index]
    assert not isinstance(given.blocks[0].up, FSDPModule)  # type: ignore[attr-defined,index]
    dist.destroy_process_group()

    mixed = shard_model(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    assert isinstance(mixed, FSDPModule)
    assert not isinstance(mixed[0], FSDPModule)  # no repeated children: the root only


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_mixed_precision_computes_in_its_dtype_and_keeps_fp32_shards(
    precision: str, dtype: torch.dtype
) -> None:
    model = shard_model(Net(), mixed_precision=precision)
    seen: list[torch.dtype] = []
    up = model.blocks[0].up  # type: ignore[attr-defined,index]
    up.register_forward_hook(lambda module, inputs, output: seen.append(module.weight.dtype))
    out = model(torch.randn(4, 8))
    out.float().pow(2).mean().backward()
    assert seen == [dtype]
    assert out.dtype == dtype
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.float32}


def test_activation_checkpointing_keeps_gradients_and_parameter_names() -> None:
    grads = []
    names = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = shard_model(Net(), activation_checkpointing=checkpointing)
        model(torch.ones(4, 8)).pow(2).mean().backward()
        grads.append({n: p.grad.full_tensor() for n, p in model.named_parameters()})
        names.append(sorted(get_model_state_dict(model)))
        wrapped = type(model.blocks[0]).__name__  # type: ignore[attr-defined,index]
        assert ("CheckpointWrapper" in wrapped) is checkpointing
        dist.destroy_process_group()
    assert names[0] == names[1]
    assert "blocks.0.up.weight" in names[1]
    plain = {n.replace("_checkpoint_wrapped_module.", ""): g for n, g in grads[1].items()}
    assert _equal(grads[0], plain)


def test_cpu_offload_needs_an_accelerator() -> None:
    if torch.accelerator.is_available():
        model = shard_model(Net(), cpu_offload=True)
        assert {p.device.type for p in model.parameters()} == {"cpu"}
        return
    with pytest.raises(ShardingError, match="cpu_offload needs an accelerator") as error:
        shard_model(Net(), cpu_offload=True)
    assert "drop cpu_offload=True" in str(error.value)
    assert not dist.is_initialized()  # refused before anything was set up


def test_misuse_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ShardingError, match="mixed_precision must be None, 'fp32', 'bf16' or"):
        shard_model(Net(), mixed_precision="fp8")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ShardingError, match=r"call shamal.train.init_distributed\(\) before"):
        shard_model(Net())
    monkeypatch.delenv("WORLD_SIZE")
    model = shard_model(Net())
    with pytest.raises(ShardingError, match="sharded already"):
        shard_model(model)
    with pytest.raises(ShardingError, match="no submodule of the block class"):
        shard_model(Net(), blocks=[torch.nn.Conv2d])
    with pytest.raises(ShardingError, match="needs blocks and none were found"):
        shard_model(torch.nn.Linear(2, 2), activation_checkpointing=True)


# ---------------------------------------------------------------- checkpoints
def test_resume_restores_model_optimizer_scheduler_rng_and_data(tmp_path: Path) -> None:
    store, saved = _saved(tmp_path)
    expected_rand = torch.rand(3)  # the draw right after the save
    dist.destroy_process_group()

    model, optimizer, scheduler = _trained(7)  # other weights, moments and RNG
    assert not _equal(_snapshot(model, optimizer), saved)
    resumed = ShardedCheckpointer(store).resume(
        model=model, optimizer=optimizer, scheduler=scheduler
    )
    assert resumed is not None
    assert (resumed.step, resumed.world_size, resumed.data_state) == (3, 1, {"position": 12})
    assert _equal(_snapshot(model, optimizer), saved)
    assert scheduler.state_dict()["last_epoch"] == 3
    assert torch.equal(torch.rand(3), expected_rand)


def test_nothing_to_resume_returns_none(tmp_path: Path) -> None:
    model, optimizer, _ = _trained(1)
    before = _snapshot(model, optimizer)
    store = LocalCheckpointStore(tmp_path)
    assert ShardedCheckpointer(store).resume(model=model, optimizer=optimizer) is None
    assert _equal(_snapshot(model, optimizer), before)


def test_retention_keeps_the_newest_and_the_best(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path)
    checkpointer = ShardedCheckpointer(store, keep_last=1, best_metric="loss")
    model, optimizer, _ = _trained(1)
    for step, loss in ((1, 0.5), (2, 0.1), (3, 0.7), (4, 0.9)):
        checkpointer.save(step, model=model, optimizer=optimizer, metrics={"loss": loss})
    assert [m["name"] for m in checkpointer.manifests()] == [
        "ckpt-000000000002",
        "ckpt-000000000004",
    ]
    assert {key.split("/")[0] for key in store.keys("ckpt-")} == {
        "ckpt-000000000002",
        "ckpt-000000000004",
    }


def _refused(store: LocalCheckpointStore, match: str) -> None:
    """Resuming raises ``match`` and leaves weights, moments and the RNG untouched."""
    model, optimizer, scheduler = _trained(7)
    before = _snapshot(model, optimizer)
    rng = torch.get_rng_state()
    with pytest.raises(ShardedCheckpointError, match=match):
        ShardedCheckpointer(store).resume(model=model, optimizer=optimizer, scheduler=scheduler)
    assert _equal(_snapshot(model, optimizer), before)
    assert torch.equal(torch.get_rng_state(), rng)
    assert scheduler.state_dict()["last_epoch"] == 3


@pytest.mark.parametrize("file", ["__0_0.distcp", ".metadata", "state-0.pt"])
def test_a_tampered_file_is_refused(tmp_path: Path, file: str) -> None:
    store, _ = _saved(tmp_path)
    dist.destroy_process_group()
    data = bytearray(store.get(f"{FOLDER}/{file}"))
    data[-1] ^= 0x01
    store.put(f"{FOLDER}/{file}", bytes(data))
    _refused(store, rf"{file} does not match the sha256 in its manifest .*refusing to load it")


def test_a_missing_shard_is_refused(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    dist.destroy_process_group()
    store.delete(f"{FOLDER}/__0_0.distcp")
    _refused(store, "is missing __0_0.distcp, which its manifest lists")


@pytest.mark.parametrize("name", ["../ckpt-000000000001/__0_0.distcp", "/etc/passwd", "a/b.pt"])
def test_a_manifest_naming_a_path_outside_is_refused(tmp_path: Path, name: str) -> None:
    store, _ = _saved(tmp_path)
    dist.destroy_process_group()
    manifest = _manifest(store)
    manifest["files"][name] = manifest["files"]["__0_0.distcp"]
    store.put(f"{FOLDER}/manifest.json", json.dumps(manifest).encode())
    _refused(store, "which is not a file of a sharded checkpoint")


class _Payload:
    """An index that would create a folder when unpickled by a plain unpickler."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (str(self.target),))


def test_an_index_asking_for_code_is_refused_even_with_a_matching_hash(tmp_path: Path) -> None:
    """A writer who rewrote both the index and the manifest still gets no code run."""
    import hashlib

    store, _ = _saved(tmp_path)
    dist.destroy_process_group()
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(marker))
    store.put(f"{FOLDER}/.metadata", evil)
    manifest = _manifest(store)
    manifest["files"][".metadata"] = hashlib.sha256(evil).hexdigest()
    store.put(f"{FOLDER}/manifest.json", json.dumps(manifest).encode())
    _refused(store, r"the checkpoint index refers to (posix|os)\.mkdir, which DCP's index never")
    assert not marker.exists()


def test_an_index_naming_a_file_the_manifest_lacks_is_refused(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    dist.destroy_process_group()
    manifest = _manifest(store)
    del manifest["files"]["__0_0.distcp"]
    store.put(f"{FOLDER}/manifest.json", json.dumps(manifest).encode())
    _refused(store, r"its index names '__0_0.distcp', which its manifest does not list")


def test_a_plain_model_without_a_group_saves_and_resumes(tmp_path: Path) -> None:
    """One process, no process group, no FSDP: DCP's single-process mode, no warning."""
    store = LocalCheckpointStore(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    ShardedCheckpointer(store).save(5, model=model, optimizer=optimizer)
    assert not dist.is_initialized()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()

    torch.manual_seed(1)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    resumed = ShardedCheckpointer(store).resume(model=fresh, optimizer=fresh_optimizer)
    assert resumed is not None
    assert (resumed.step, resumed.world_size) == (5, 1)
    assert _equal(fresh.state_dict(), saved)
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["momentum_buffer"], momentum)


@pytest.mark.parametrize(
    ("manifest", "match"),
    [
        (b"not json", "a checkpoint manifest in the store is not valid JSON with a step"),
        (b'{"kind": "sharded", "step": 3, "world_size": "1", "files": {}}', "is malformed"),
        (b'{"kind": "sharded", "step": 3, "world_size": 1, "files": {}}', "lacks the index"),
    ],
)
def test_a_malformed_manifest_is_refused(tmp_path: Path, manifest: bytes, match: str) -> None:
    store, _ = _saved(tmp_path)
    dist.destroy_process_group()
    store.put(f"{FOLDER}/manifest.json", manifest)
    _refused(store, match)


class _FailingStore(LocalCheckpointStore):
    """Fails the put of one key once armed (a crash-like upload failure mid-save)."""

    def __init__(self, root: Path, key: str) -> None:
        super().__init__(root)
        self.key = key
        self.armed = False

    def put(self, key: str, data: bytes) -> None:
        if self.armed and key == self.key:
            raise OSError("disk full")
        super().put(key, data)


def test_a_failed_resave_of_a_step_leaves_the_older_checkpoint(tmp_path: Path) -> None:
    store = _FailingStore(tmp_path, f"{FOLDER}/__0_0.distcp")
    checkpointer = ShardedCheckpointer(store, keep_last=3)
    model, optimizer, _ = _trained(1)
    checkpointer.save(2, model=model, optimizer=optimizer)
    older = _snapshot(model, optimizer)
    checkpointer.save(3, model=model, optimizer=optimizer)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    store.armed = True
    with pytest.raises(ShardedCheckpointError, match=r"upload failed \(OSError: disk full\)"):
        checkpointer.save(3, model=model, optimizer=optimizer)  # the same step, new values
    assert f"{FOLDER}/manifest.json" not in store.keys(FOLDER)  # torn, not half-new
    dist.destroy_process_group()
    model, optimizer, _ = _trained(7)
    resumed = ShardedCheckpointer(store).resume(model=model, optimizer=optimizer)
    assert resumed is not None
    assert resumed.step == 2
    assert _equal(_snapshot(model, optimizer), older)
