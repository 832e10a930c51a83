"""Checkpoints: model, optimizer, scaler, scheduler, RNG states and data position.

Layout in a :class:`~shamal.train.CheckpointStore`, one folder per checkpoint::

    ckpt-000000000120/model.safetensors   weights (safetensors; tied tensors stored once)
    ckpt-000000000120/state.pt            everything else: plain tensors, numbers, strings,
                                          dicts and lists only (loaded with weights_only=True)
    ckpt-000000000120/manifest.json       written LAST: step, metrics, sha256 of both files

A checkpoint is complete only when its manifest exists and the files match its digests;
:meth:`Checkpointer.resume` loads the newest complete one and ignores torn ones (a
process killed mid-save). Retention keeps the newest ``keep_last`` and the best one by
``best_metric``. In a distributed run only rank 0 writes; every rank reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from shamal.train._dist import barrier, rank, unwrap
from shamal.train._store import CheckpointStore

__all__ = ["Checkpointer", "Resumed", "rng_state", "set_rng_state"]

logger = logging.getLogger(__name__)

_MANIFEST = "manifest.json"
_MODEL = "model.safetensors"
_STATE = "state.pt"
_FOLDER = re.compile(r"ckpt-\d{12}")


@dataclass(frozen=True)
class Resumed:
    """What :meth:`Checkpointer.resume` restored besides the objects it was given."""

    step: int
    data_state: dict[str, Any]
    metrics: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)


def rng_state() -> dict[str, Any]:
    """Python, NumPy (if installed), torch CPU and CUDA generator states, checkpoint-safe."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64)},
        "python_gauss": gauss,
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # nosec B311
        state["numpy"] = {
            "name": name,
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        }
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    py = state["python"]
    internal = tuple(int(x) for x in py["state"].tolist())
    random.setstate((py["version"], internal, state["python_gauss"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        npy = state["numpy"]
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state((npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _weights_bytes(model: torch.nn.Module) -> tuple[bytes, dict[str, str]]:
    """Safetensors bytes of the state dict; tied tensors are stored once (aliases)."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, tensor in unwrap(model).state_dict().items():
        t = tensor.detach()
        ident = (t.data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.numel() and ident in seen:
            aliases[name] = seen[ident]
            continue
        seen[ident] = name
        tensors[name] = t.cpu().contiguous()
    return st_save(tensors, metadata={"aliases": json.dumps(aliases)}), aliases


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Checkpointer:
    """Saves and resumes training state through a :class:`CheckpointStore`.

    Args:
        store: where checkpoints go.
        keep_last: how many of the newest complete checkpoints to keep (>= 1).
        best_metric: a metric name passed to :meth:`save`; the best checkpoint by it is
            kept as well. ``mode`` says whether lower ("min") or higher ("max") is better.
        all_ranks: every rank writes (each into its own store: pipeline stages); by
            default only rank 0 does (DDP replicas are equal).
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        keep_last: int = 2,
        best_metric: str | None = None,
        mode: str = "min",
        all_ranks: bool = False,
    ) -> None:
        if keep_last < 1 or mode not in ("min", "max"):
            raise ValueError("keep_last must be >= 1 and mode 'min' or 'max'")
        self.store = store
        self.keep_last = keep_last
        self.best_metric = best_metric
        self.mode = mode
        self.all_ranks = all_ranks

    # ------------------------------------------------------------------ save
    def save(
        self,
        step: int,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
        scheduler: Any = None,
        data_state: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str | None:
        """Write checkpoint ``step`` (rank 0 only unless ``all_ranks``; other ranks wait)
        and apply retention.

        Returns the checkpoint's folder name where written, ``None`` elsewhere. Every
        rank of a distributed run must call it (it ends with a barrier).
        """
        name = None
        if self.all_ranks or rank() == 0:
            name = f"ckpt-{step:012d}"
            weights, aliases = _weights_bytes(model)
            state = {
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "rng": rng_state(),
                "data": data_state or {},
                "extra": extra or {},
            }
            buffer = io.BytesIO()
            torch.save(state, buffer)
            blob = buffer.getvalue()
            self.store.put(f"{name}/{_MODEL}", weights)
            self.store.put(f"{name}/{_STATE}", blob)
            manifest = {
                "format": 1,
                "step": step,
                "time": time.time(),
                "metrics": {k: float(v) for k, v in (metrics or {}).items()},
                "files": {_MODEL: _sha256(weights), _STATE: _sha256(blob)},
                "aliases": aliases,
            }
            self.store.put(f"{name}/{_MANIFEST}", json.dumps(manifest).encode())
            logger.info("checkpoint %s saved", name)
            self._retain()
        barrier()
        return name

    def manifests(self) -> list[dict[str, Any]]:
        """Manifests of the checkpoints that have one, oldest first (not yet verified)."""
        found = []
        for key in self.store.keys("ckpt-"):
            if key.endswith(f"/{_MANIFEST}") and _FOLDER.fullmatch(key.split("/")[0]):
                manifest = json.loads(self.store.get(key))
                manifest["name"] = key.split("/")[0]
                found.append(manifest)
        return sorted(found, key=lambda m: int(m["step"]))

    def best(self) -> dict[str, Any] | None:
        """The manifest of the best checkpoint by ``best_metric``, if any has it."""
        metric = self.best_metric
        scored = [m for m in self.manifests() if metric and metric in m["metrics"]]
        if not scored:
            return None
        sign = 1.0 if self.mode == "min" else -1.0
        return min(scored, key=lambda m: (sign * m["metrics"][metric], -int(m["step"])))

    def _retain(self) -> None:
        manifests = self.manifests()
        keep = {m["name"] for m in manifests[-self.keep_last :]}
        best = self.best()
        if best is not None:
            keep.add(best["name"])
        newest = int(manifests[-1]["step"]) if manifests else -1
        complete = {m["name"] for m in manifests}
        for key in self.store.keys("ckpt-"):
            folder = key.split("/")[0]
            if not _FOLDER.fullmatch(folder):
                continue  # not ours
            torn = folder not in complete and int(folder[5:]) < newest
            if folder in keep or (folder not in complete and not torn):
                continue
            if key.endswith(_MANIFEST):
                continue  # manifests go last so a folder is never complete-but-partial
            self.store.delete(key)
        for m in manifests:
            if m["name"] not in keep:
                self.store.delete(f"{m['name']}/{_MANIFEST}")
                logger.info("checkpoint %s dropped by retention", m["name"])

    # ------------------------------------------------------------------ resume
    def _load_verified(self, manifest: dict[str, Any]) -> tuple[bytes, bytes] | None:
        name = manifest["name"]
        try:
            weights = self.store.get(f"{name}/{_MODEL}")
            blob = self.store.get(f"{name}/{_STATE}")
        except KeyError:
            return None
        files = manifest["files"]
        if _sha256(weights) != files[_MODEL] or _sha256(blob) != files[_STATE]:
            logger.warning("checkpoint %s does not match its manifest; skipped", name)
            return None
        return weights, blob

    def resume(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
        scheduler: Any = None,
        restore_rng: bool = True,
        at_most: int | None = None,
    ) -> Resumed | None:
        """Load the newest complete checkpoint into the given objects.

        Returns ``None`` (and changes nothing) when there is none. RNG states are
        restored too unless ``restore_rng`` is false; the data position comes back in
        :attr:`Resumed.data_state` for the caller's sampler. ``at_most`` ignores
        checkpoints of later steps.
        """
        for manifest in reversed(self.manifests()):
            if at_most is not None and int(manifest["step"]) > at_most:
                continue
            loaded = self._load_verified(manifest)
            if loaded is None:
                continue
            weights, blob = loaded
            tensors = st_load(weights)
            for alias, original in manifest.get("aliases", {}).items():
                tensors[alias] = tensors[original]
            unwrap(model).load_state_dict(tensors)
            state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
            if optimizer is not None and state["optimizer"] is not None:
                optimizer.load_state_dict(state["optimizer"])
            if scaler is not None and state["scaler"] is not None:
                scaler.load_state_dict(state["scaler"])
            if scheduler is not None and state["scheduler"] is not None:
                scheduler.load_state_dict(state["scheduler"])
            if restore_rng:
                set_rng_state(state["rng"])
            logger.info("resumed from checkpoint %s", manifest["name"])
            return Resumed(
                step=int(manifest["step"]),
                data_state=state["data"],
                metrics=manifest["metrics"],
                extra=state["extra"],
            )
        return None
