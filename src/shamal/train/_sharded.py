"""Sharded checkpoints: PyTorch's distributed checkpoint (DCP) through a checkpoint store.

Every worker writes its own shard of the model and optimizer state, once; rank 0 writes
DCP's index and, after every worker reported its files, the manifest. Layout in a
:class:`~shamal.train.CheckpointStore`, one folder per checkpoint::

    ckpt-000000000120/__0_0.distcp    worker 0's shard (DCP's file; tensors saved one by one)
    ckpt-000000000120/__1_0.distcp    worker 1's shard, and so on
    ckpt-000000000120/.metadata       DCP's index of every shard (rank 0)
    ckpt-000000000120/state-0.pt      worker 0's RNG, scheduler, scaler, data position, extra
    ckpt-000000000120/state-1.pt      ... one per worker (plain values; weights_only loads)
    ckpt-000000000120/manifest.json   written LAST by rank 0: step, metrics, world size,
                                      the sha256 of every file above

**Storage.** DCP's own ``FileSystemWriter`` writes each worker's files into a private
staging folder, which the worker then uploads key by key and deletes. This keeps DCP's
file format (its planner, deduplication of replicated tensors, resharding) untouched and
needs only the store's whole-file ``put``/``get``; a custom ``StorageWriter`` would have
re-implemented the file layout for no gain, since the store has no ranged or streamed
writes. Loading subclasses ``FileSystemReader`` over a staging folder. First the workers
verify every file between them (worker ``k mod M`` the shard and state of saving worker
``k``, every worker the index) and agree, so a bad file is refused on all workers before
anything changes; then DCP plans the reads and each worker downloads (verified again) only
the further shard files its own plan touches. The store has no ranged reads, so a file is
fetched whole: with an unchanged number of workers a worker fetches its own shard, and also
the file of the worker DCP's de-duplication chose to hold the replicated values (optimizer
step counts and hyperparameters), which holds that worker's shard too.

**What "resumes correctly" means, across worker counts.** DCP reshards on load: a
checkpoint saved by N workers loads into M. After :meth:`ShardedCheckpointer.resume` the
full parameters and optimizer state equal, bitwise, those at the save; given the same
global batch per step (each worker takes its ``1/M`` of it), the following steps' losses
equal those of a run that never stopped, up to float summation order (gradients are
averaged over a different number of partial means). With the same number of workers each
worker gets its own RNG state and data position back (exact resume); with a different
number, every worker gets worker 0's, and :attr:`ShardedResumed.world_size` says how many
workers saved, so the caller can map a per-worker data position to the new split.

**No unpickling of untrusted bytes.** DCP's ``.metadata`` is a pickle and its default
loader reads non-tensor values with ``torch.load(weights_only=False)``. Here nothing is
deserialised before the manifest (JSON) checks out and every file a worker will read
matches the manifest's sha256 (so a torn, swapped or tampered file is refused before any
tensor is touched); the index is then read with an unpickler that admits only DCP's own
metadata classes, ``torch.Size`` and dtypes (any other global is refused), tensors with
``weights_only=True`` (as DCP does), and non-tensor values with ``weights_only=True`` too
(a load planner overrides DCP's). The hashes guard against corruption and against a
file replaced on its own; the allow-listed unpickler guards against a store writer who
rewrote manifest and index together. Workers exchange file digests as JSON in tensors;
DCP's own collectives between the job's workers are its business (process memory, not
stored bytes).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle  # nosec B403 - only the allow-listing unpickler below, after hash checks
import re
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from shamal.train._checkpoint import Checkpointer, Resumed, rng_state, set_rng_state
from shamal.train._dist import any_rank, barrier, rank, world_size
from shamal.train._store import CheckpointStore

__all__ = ["ShardedCheckpointError", "ShardedCheckpointer", "ShardedResumed"]

logger = logging.getLogger(__name__)

_MANIFEST = "manifest.json"
_METADATA = ".metadata"
_KIND = "sharded"
_FILE = re.compile(r"\.metadata|__\d{1,6}_\d{1,6}\.distcp|state-\d{1,6}\.pt")
_SHARD = re.compile(r"__(\d{1,6})_\d{1,6}\.distcp")
_HEX = re.compile(r"[0-9a-f]{64}")


class ShardedCheckpointError(RuntimeError):
    """A sharded checkpoint cannot be written or is refused on load; nothing was changed."""


@dataclass(frozen=True)
class ShardedResumed(Resumed):
    """What :meth:`ShardedCheckpointer.resume` restored; ``world_size`` is how many
    workers saved the checkpoint."""

    world_size: int = 1


# ---------------------------------------------------------------- safe reading
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib._local", "PosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Admits only the globals DCP's index is made of (its dataclasses, sizes, dtypes)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise ShardedCheckpointError(
            f"the checkpoint index refers to {module}.{name}, which DCP's index never "
            "holds; refusing to load it"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise ShardedCheckpointError("the checkpoint index holds persistent ids; refusing it")


def _read_index(data: bytes) -> Metadata:
    try:
        value = _MetadataUnpickler(io.BytesIO(data)).load()  # nosec B301 - allow-listed
    except ShardedCheckpointError:
        raise
    except Exception as exc:
        raise ShardedCheckpointError(
            f"the checkpoint index is unreadable ({type(exc).__name__})"
        ) from None
    if not isinstance(value, Metadata) or not isinstance(value.storage_data, dict):
        raise ShardedCheckpointError("the checkpoint index is not DCP metadata")
    return value


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, reading non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Fetcher:
    """Downloads checkpoint files into a staging folder, each verified against the manifest."""

    def __init__(self, store: CheckpointStore, name: str, files: dict[str, str], root: Path):
        self.store = store
        self.name = name
        self.files = files
        self.root = root

    def path(self, file: str) -> Path:
        if file not in self.files:
            raise ShardedCheckpointError(
                f"checkpoint {self.name}: its index names {file!r}, which its manifest does "
                "not list; refusing to load it"
            )
        target = self.root / file
        if target.exists():
            return target
        try:
            data = self.store.get(f"{self.name}/{file}")
        except KeyError:
            raise ShardedCheckpointError(
                f"checkpoint {self.name} is missing {file}, which its manifest lists; it "
                "cannot be loaded (delete the folder to resume from an older checkpoint)"
            ) from None
        if _sha256(data) != self.files[file]:
            raise ShardedCheckpointError(
                f"checkpoint {self.name}: {file} does not match the sha256 in its manifest "
                "(it changed after the checkpoint was written); refusing to load it (delete "
                "the folder to resume from an older checkpoint)"
            )
        partial = self.root / f".part-{file}"
        partial.write_bytes(data)
        os.replace(partial, target)
        return target

    def check_index(self, metadata: Metadata) -> None:
        for info in metadata.storage_data.values():
            relative = getattr(info, "relative_path", None)
            if not isinstance(relative, str) or relative not in self.files:
                raise ShardedCheckpointError(
                    f"checkpoint {self.name}: its index names {relative!r}, which its manifest "
                    "does not list; refusing to load it"
                )


class _StoreReader(FileSystemReader):
    """DCP's file reader over the staging folder; the plan's files are fetched (verified)
    when the plan is made, before DCP copies anything into the model."""

    def __init__(self, fetcher: _Fetcher, metadata: Metadata) -> None:
        super().__init__(fetcher.root)
        self._fetcher = fetcher
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if getattr(self._metadata, "storage_meta", None) is None:
            self._metadata.storage_meta = StorageMeta()
        assert self._metadata.storage_meta is not None  # nosec B101 - set just above
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        for item in plan.items:
            self._fetcher.path(self.storage_data[item.storage_index].relative_path)
        return plan


# ---------------------------------------------------------------- helpers
@contextmanager
def _dcp_errors(what: str) -> Iterator[None]:
    """DCP's collective errors (tracebacks of every rank) as one clear message."""
    from torch.distributed.checkpoint.api import CheckpointException

    with warnings.catch_warnings():
        # a single process outside any group: DCP warns that it assumes so, which it should
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            yield
        except CheckpointException as exc:
            inner = [failure[0] for failure in exc.failures.values()]
            ours = [e for e in inner if isinstance(e, ShardedCheckpointError)]
            if ours:
                raise ShardedCheckpointError(str(ours[0])) from None
            first = inner[0] if inner else exc
            raise ShardedCheckpointError(
                f"{what} failed on worker(s) {sorted(exc.failures)}: {type(first).__name__}: "
                f"{first}"
            ) from None


def _all_gather_json(value: Any) -> list[Any]:
    """Every rank's JSON-able ``value``, in rank order (bytes in tensors, no pickle)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    device = torch.device("cuda", 0) if dist.get_backend() == "nccl" else torch.device("cpu")
    data = json.dumps(value).encode()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    buffer = torch.zeros(longest, dtype=torch.uint8, device=device)
    buffer[: len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=device)
    gathered = [torch.zeros_like(buffer) for _ in sizes]
    dist.all_gather(gathered, buffer)
    pairs = zip(gathered, sizes, strict=True)
    return [json.loads(bytes(g[: int(n.item())].cpu().tolist())) for g, n in pairs]


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def _set_dcp_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any]
) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )


def _owned(file: str, me: int, world: int) -> bool:
    """Whether this rank verifies ``file`` up front (every file has one verifier)."""
    number = _SHARD.fullmatch(file) or re.fullmatch(r"state-(\d+)\.pt", file)
    if number is None:
        return True  # the index: every rank reads it
    return int(number.group(1)) % world == me


def _validated(manifest: dict[str, Any]) -> dict[str, Any]:
    name = manifest["name"]
    files, saved = manifest.get("files"), manifest.get("world_size")
    shapes = (
        isinstance(files, dict),
        isinstance(saved, int),
        isinstance(manifest.get("step"), int),
        isinstance(manifest.get("metrics", {}), dict),
    )
    if not all(shapes) or not isinstance(files, dict) or not isinstance(saved, int):
        raise ShardedCheckpointError(f"the manifest of {name} is malformed; refusing to load it")
    for file, digest in files.items():
        if not isinstance(file, str) or not _FILE.fullmatch(file):
            raise ShardedCheckpointError(
                f"the manifest of {name} names {file!r}, which is not a file of a sharded "
                "checkpoint (a path outside its folder or of an unknown kind); refusing to "
                "load it"
            )
        if not isinstance(digest, str) or not _HEX.fullmatch(digest):
            raise ShardedCheckpointError(f"the manifest of {name} has a malformed sha256")
    needed = {_METADATA, *(f"state-{r}.pt" for r in range(saved))}
    if saved < 1 or not needed <= files.keys():
        raise ShardedCheckpointError(
            f"the manifest of {name} lacks the index or a worker's state file; refusing it"
        )
    return manifest


# ---------------------------------------------------------------- the checkpointer
class ShardedCheckpointer(Checkpointer):
    """Saves and resumes sharded training state (FSDP, DDP or one process) via DCP.

    The same retention (``keep_last``) and ``best_metric`` as :class:`Checkpointer`.
    Every worker must call :meth:`save` and :meth:`resume` (both are collective).
    """

    def manifests(self) -> list[dict[str, Any]]:
        try:
            return super().manifests()
        except (ValueError, KeyError, TypeError):
            raise ShardedCheckpointError(
                "a checkpoint manifest in the store is not valid JSON with a step; remove it"
            ) from None

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
        """Write checkpoint ``step``: this worker's shard and state, then (rank 0) the
        manifest, and apply retention. Returns the checkpoint's folder name."""
        name = f"ckpt-{step:012d}"
        state = _dcp_state(model, optimizer)
        local = {
            "rng": rng_state(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "data": data_state or {},
            "extra": extra or {},
        }
        if rank() == 0:  # a step saved again: torn (older ones resume) until complete again
            self.store.delete(f"{name}/{_MANIFEST}")
        barrier()
        error: str | None = None
        written: dict[str, str] = {}
        with tempfile.TemporaryDirectory(prefix="shamal-dcp-") as staging:
            with _dcp_errors(f"saving checkpoint {name}"):
                dcp_save(state, storage_writer=FileSystemWriter(staging, sync_files=False))
            try:
                written = self._upload(name, Path(staging), local)
            except Exception as exc:  # every worker must hear of it, or they would wait
                error = f"checkpoint {name}: upload failed ({type(exc).__name__}: {exc})"
        self._agree(error, f"another worker failed to write checkpoint {name}")
        every = _all_gather_json(written)
        if rank() == 0:
            try:
                self._commit(name, step, every, metrics)
            except Exception as exc:
                error = f"checkpoint {name}: manifest failed ({type(exc).__name__}: {exc})"
        self._agree(error, f"worker 0 failed to complete checkpoint {name}")
        barrier()
        return name

    @staticmethod
    def _agree(error: str | None, elsewhere: str) -> None:
        if any_rank(error is not None):
            raise ShardedCheckpointError(error or f"{elsewhere}; its log says why")

    def _upload(self, name: str, staging: Path, local: dict[str, Any]) -> dict[str, str]:
        written = {}
        for path in sorted(staging.iterdir()):
            if not _FILE.fullmatch(path.name):
                raise ShardedCheckpointError(f"DCP wrote an unexpected file {path.name!r}")
            data = path.read_bytes()
            self.store.put(f"{name}/{path.name}", data)
            written[path.name] = _sha256(data)
        buffer = io.BytesIO()
        torch.save(local, buffer)
        blob = buffer.getvalue()
        own = f"state-{rank()}.pt"
        self.store.put(f"{name}/{own}", blob)
        written[own] = _sha256(blob)
        return written

    def _commit(
        self, name: str, step: int, every: list[dict[str, str]], metrics: dict[str, float] | None
    ) -> None:
        files: dict[str, str] = {}
        for part in every:
            files.update(part)
        manifest = {
            "format": 1,
            "kind": _KIND,
            "step": step,
            "time": time.time(),
            "world_size": len(every),
            "metrics": {k: float(v) for k, v in (metrics or {}).items()},
            "files": dict(sorted(files.items())),
        }
        self.store.put(f"{name}/{_MANIFEST}", json.dumps(manifest, indent=1).encode())
        logger.info("sharded checkpoint %s saved (%d files)", name, len(files))
        self._retain()

    # ------------------------------------------------------------------ resume
    def _newest(self, at_most: int | None = None) -> dict[str, Any] | None:
        for manifest in reversed(self.manifests()):
            if at_most is not None and int(manifest["step"]) > at_most:
                continue
            if manifest.get("kind") == _KIND:
                return _validated(manifest)
        return None

    def _verify(
        self, fetcher: _Fetcher, own: str
    ) -> tuple[Metadata | None, dict[str, Any] | None, str | None]:
        """Fetch and check this worker's share of the files, the index and its state."""
        me, world = rank(), world_size()
        try:
            for file in sorted(fetcher.files):
                if _owned(file, me, world):
                    fetcher.path(file)
            metadata = _read_index(fetcher.path(_METADATA).read_bytes())
            fetcher.check_index(metadata)
            local = torch.load(fetcher.path(own), map_location="cpu", weights_only=True)
        except ShardedCheckpointError as exc:
            return None, None, str(exc)
        except Exception as exc:
            return None, None, f"checkpoint {fetcher.name}: {own} is unreadable ({exc})"
        return metadata, local, None

    def resume(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
        scheduler: Any = None,
        restore_rng: bool = True,
        at_most: int | None = None,
    ) -> ShardedResumed | None:
        """Load the newest sharded checkpoint into the given (sharded) objects.

        Returns ``None`` and changes nothing when there is none. Raises
        :class:`ShardedCheckpointError`, on every worker and before anything is changed,
        when a file is missing, differs from its manifest or the manifest names a file
        that is not the checkpoint's. ``at_most`` ignores checkpoints of later steps.
        """
        manifest = self._newest(at_most)
        if manifest is None:
            return None
        name, saved = manifest["name"], int(manifest["world_size"])
        own = f"state-{rank()}.pt" if world_size() == saved else "state-0.pt"
        with tempfile.TemporaryDirectory(prefix="shamal-dcp-") as staging:
            fetcher = _Fetcher(self.store, name, manifest["files"], Path(staging))
            metadata, local, error = self._verify(fetcher, own)
            self._agree(error, f"another worker refused checkpoint {name}")
            assert metadata is not None  # nosec B101 - agreed above
            assert local is not None  # nosec B101 - agreed above
            state = _dcp_state(model, optimizer)
            with _dcp_errors(f"loading checkpoint {name}"):
                dcp_load(
                    state,
                    storage_reader=_StoreReader(fetcher, metadata),
                    planner=_SafeLoadPlanner(),
                )
            _set_dcp_state(model, optimizer, state)
        _restore(local, scaler=scaler, scheduler=scheduler, restore_rng=restore_rng)
        logger.info("resumed from sharded checkpoint %s (saved by %d worker(s))", name, saved)
        return ShardedResumed(
            step=int(manifest["step"]),
            data_state=local["data"],
            metrics=manifest.get("metrics", {}),
            extra=local["extra"],
            world_size=saved,
        )


def _restore(local: dict[str, Any], *, scaler: Any, scheduler: Any, restore_rng: bool) -> None:
    if scaler is not None and local["scaler"] is not None:
        scaler.load_state_dict(local["scaler"])
    if scheduler is not None and local["scheduler"] is not None:
        scheduler.load_state_dict(local["scheduler"])
    if restore_rng:
        set_rng_state(local["rng"])
