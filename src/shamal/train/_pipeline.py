"""Pipeline parallelism: a model cut into stages, one rank each, fed with microbatches.

Built on PyTorch's pipelining (:mod:`torch.distributed.pipelining`): :class:`PipelineStage`
for each stage and a 1F1B schedule (``"1f1b"``: one stage per rank) or an interleaved one
(``"interleaved"``: ``stages_per_rank`` stages per rank, rank ``r`` holding stages ``r``,
``r + W``, ...). The stages come either from an :class:`torch.nn.Sequential` cut into
contiguous runs of layers (balanced by parameter count), or from a list of modules the
user cut by hand, one per stage.

The loss is the mean over microbatches of ``loss_fn`` (PyTorch scales the gradients by
``1 / n_microbatches``), so with a mean-reducing loss one pipeline step computes the same
loss and gradients as the unsplit model on the whole batch, up to float rounding.

Checkpoints: every rank saves its own stages (:meth:`Pipeline.checkpointer`, one folder
per stage rank in the store) and resume agrees on the newest step that every rank has.
Preemption works as for DDP: :meth:`PreemptionGuard.should_stop` is collective.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from shamal.train._checkpoint import Checkpointer, Resumed
from shamal.train._dist import rank, world_size
from shamal.train._store import CheckpointStore

__all__ = ["Pipeline", "StageCheckpointer", "pipeline_stages", "split_sequential"]

logger = logging.getLogger(__name__)

ScheduleName = Literal["1f1b", "interleaved"]
_SCHEDULES = ("1f1b", "interleaved")


def split_sequential(model: nn.Sequential, parts: int) -> list[nn.Sequential]:
    """Cut ``model`` into ``parts`` contiguous runs of its layers, balanced by parameters.

    Each part keeps its layers' names from ``model`` (``"2"``, ``"3"``...), so the keys of
    a part's ``state_dict`` are keys of the unsplit model's. Layers are shared, not copied.

    Raises:
        ValueError: ``parts`` < 1 or more parts than layers.
    """
    layers = list(model.named_children())
    if parts < 1 or parts > len(layers):
        raise ValueError(
            f"cannot cut a Sequential of {len(layers)} layer(s) into {parts} stage(s): "
            "give at least one layer per stage"
        )
    sizes = [sum(p.numel() for p in layer.parameters()) for _, layer in layers]
    total = sum(sizes)
    bounds = [0]
    seen = 0
    for i, size in enumerate(sizes):
        seen += size
        cuts = len(bounds) - 1
        left_layers = len(layers) - (i + 1)
        left_parts = parts - (cuts + 1)
        if left_parts <= 0:
            break
        # Cut after this layer once it holds its share, or when the rest only has one
        # layer per part left; never leave a later part empty.
        if left_layers == left_parts or (total and seen * parts >= total * (cuts + 1)):
            bounds.append(i + 1)
    bounds.append(len(layers))
    return [
        nn.Sequential(OrderedDict(layers[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)
    ]


class _Prefixed:
    """A view of a :class:`CheckpointStore` under ``prefix`` (one folder per stage rank)."""

    def __init__(self, store: CheckpointStore, prefix: str) -> None:
        self._store = store
        self._prefix = prefix

    def put(self, key: str, data: bytes) -> None:
        self._store.put(self._prefix + key, data)

    def get(self, key: str) -> bytes:
        return self._store.get(self._prefix + key)

    def keys(self, prefix: str = "") -> list[str]:
        cut = len(self._prefix)
        return [k[cut:] for k in self._store.keys(self._prefix + prefix)]

    def delete(self, key: str) -> None:
        self._store.delete(self._prefix + key)


class Pipeline:
    """This rank's stages of a pipeline and the schedule that runs them.

    Build it with :func:`pipeline_stages`. Optimise :attr:`module`'s parameters (this
    rank's stages only); checkpoint through :meth:`checkpointer`.
    """

    def __init__(
        self,
        stages: Sequence[nn.Module],
        indices: Sequence[int],
        n_stages: int,
        schedule: Any,
        module: nn.Module,
        *,
        n_microbatches: int,
        broadcast_loss: bool,
    ) -> None:
        self.stages = list(stages)
        self.indices = tuple(indices)
        self.n_stages = n_stages
        self.schedule = schedule
        self.module = module
        self.n_microbatches = n_microbatches
        self.broadcast_loss = broadcast_loss
        self.rank = rank()
        self.world_size = world_size()

    @property
    def is_first(self) -> bool:
        """Whether this rank holds stage 0 (it is given the inputs)."""
        return 0 in self.indices

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the last stage (it is given the targets, computes the loss)."""
        return self.n_stages - 1 in self.indices

    @property
    def last_rank(self) -> int:
        return (self.n_stages - 1) % self.world_size

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's parameters (what its optimizer updates)."""
        return self.module.parameters()

    def train(self, mode: bool = True) -> Pipeline:
        self.module.train(mode)
        return self

    def eval(self) -> Pipeline:
        return self.train(False)

    def _check_batch(self, what: str, tensor: torch.Tensor | None) -> None:
        if tensor is None:
            raise ValueError(f"the rank holding the {what} stage must be given the {what}s")
        size = tensor.shape[0] if tensor.dim() else 0
        if size < self.n_microbatches or size % self.n_microbatches:
            raise ValueError(
                f"a batch of {size} {what}s does not split into {self.n_microbatches} "
                "equal microbatches: make the batch a multiple of n_microbatches"
            )

    def _run(
        self, inputs: torch.Tensor | None, targets: torch.Tensor | None, *, train: bool
    ) -> float | None:
        if self.is_first:
            self._check_batch("input", inputs)
        if self.is_last:
            self._check_batch("target", targets)
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first else ()
        kwargs: dict[str, Any] = {"target": targets, "losses": losses} if self.is_last else {}
        if train:
            self.schedule.step(*args, **kwargs)
        else:
            self.schedule.eval(*args, **kwargs)
        loss = torch.stack([x.detach().float() for x in losses]).mean() if losses else None
        if not self.broadcast_loss or self.world_size == 1:
            return None if loss is None else float(loss)
        value = loss.reshape(1) if loss is not None else torch.zeros(1)
        dist.broadcast(value, src=self.last_rank)
        return float(value)

    def step(
        self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None
    ) -> float | None:
        """Forward and backward of one batch through the pipeline (gradients accumulate).

        Every rank calls it at the same time; the first stage's rank passes ``inputs``,
        the last stage's rank ``targets`` (others may pass them too: they are ignored).
        Returns the batch's loss (mean over microbatches) on every rank when
        ``broadcast_loss`` (the default), else on the last stage's rank only (``None``
        elsewhere). Call the optimizer afterwards as usual.

        Raises:
            ValueError: the batch does not split into ``n_microbatches`` equal parts.
        """
        return self._run(inputs, targets, train=True)

    def evaluate(
        self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None
    ) -> float | None:
        """The loss of one batch without gradients (as :meth:`step` returns it)."""
        with torch.no_grad():
            return self._run(inputs, targets, train=False)

    def checkpointer(self, store: CheckpointStore, **options: Any) -> StageCheckpointer:
        """A checkpointer that saves this rank's stages under ``stage-RR/`` of ``store``."""
        return StageCheckpointer(self, store, **options)


class StageCheckpointer:
    """Checkpoints of a pipeline: every rank saves its own stages; resume agrees on a step.

    Each rank keeps a :class:`Checkpointer` over ``store`` under ``stage-RR/`` (its rank).
    :meth:`save` is called by every rank with the same step and metrics; :meth:`resume`
    loads, on every rank, the newest step that every rank has complete (a rank killed
    mid-save leaves a torn checkpoint that the others' newer one must not outrun).
    """

    def __init__(self, pipeline: Pipeline, store: CheckpointStore, **options: Any) -> None:
        self.pipeline = pipeline
        prefix = f"stage-{pipeline.rank:02d}/"
        self.local = Checkpointer(_Prefixed(store, prefix), all_ranks=True, **options)

    def save(self, step: int, **kwargs: Any) -> str | None:
        """As :meth:`Checkpointer.save` with ``model`` = this rank's stages."""
        return self.local.save(step, model=self.pipeline.module, **kwargs)

    def resume(self, **kwargs: Any) -> Resumed | None:
        """As :meth:`Checkpointer.resume`, at the newest step complete on every rank."""
        steps = {int(m["step"]) for m in self.local.manifests()}
        common = _common_steps(steps)
        loaded = False
        while common:
            wanted = max(common)
            resumed = self.local.resume(model=self.pipeline.module, at_most=wanted, **kwargs)
            loaded = loaded or resumed is not None
            got = -1 if resumed is None else resumed.step
            if _all_equal(got):
                return resumed
            common = {s for s in common if s <= _min_over_ranks(got)}  # what all may hold
        if _any_rank(loaded):  # some stage holds a checkpoint's state, another none
            raise RuntimeError(
                "the pipeline's stages have no intact checkpoint step in common: delete the "
                "stage-*/ checkpoints of this run to start afresh"
            )
        if steps:
            logger.warning("no checkpoint step is complete on every stage: starting afresh")
        return None


def _gather(value: Any) -> list[Any]:
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    found: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(found, value)
    return found


def _common_steps(steps: set[int]) -> set[int]:
    common: set[int] | None = None
    for theirs in _gather(sorted(steps)):
        common = set(theirs) if common is None else common & set(theirs)
    return common or set()


def _all_equal(value: int) -> bool:
    return len(set(_gather(value))) == 1


def _any_rank(flag: bool) -> bool:
    return any(_gather(flag))


def _min_over_ranks(value: int) -> int:
    return min(int(v) for v in _gather(value))


def _stage_modules(
    model: nn.Sequential | Sequence[nn.Module], n_stages: int
) -> tuple[list[nn.Module], bool]:
    """The stages' modules, and whether they came from cutting a Sequential."""
    if isinstance(model, nn.Sequential):
        return list(split_sequential(model, n_stages)), True
    if isinstance(model, nn.Module):
        raise TypeError(
            "give an nn.Sequential (cut automatically) or a list of modules, one per stage"
        )
    modules = list(model)
    if len(modules) != n_stages or not all(isinstance(m, nn.Module) for m in modules):
        raise ValueError(
            f"{len(modules)} stage module(s) given for {n_stages} stage(s): give one "
            "nn.Module per stage (world size x stages_per_rank)"
        )
    return modules, False


def _local_module(
    modules: Sequence[nn.Module], indices: Sequence[int], from_sequential: bool
) -> nn.Module:
    """One module holding this rank's stages: the layers under their original names
    (cut from a Sequential) or a ModuleDict keyed by stage index."""
    if from_sequential:
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i in indices:
            layers.update(modules[i].named_children())
        return nn.Sequential(layers)
    return nn.ModuleDict({str(i): modules[i] for i in indices})


def _check_arguments(schedule: str, n_microbatches: int, stages_per_rank: int, world: int) -> None:
    if schedule not in _SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use '1f1b' or 'interleaved'")
    if n_microbatches < 1:
        raise ValueError("n_microbatches must be >= 1")
    if stages_per_rank < 1:
        raise ValueError("stages_per_rank must be >= 1")
    if schedule == "1f1b" and stages_per_rank != 1:
        raise ValueError("the 1f1b schedule runs one stage per rank: use 'interleaved'")
    if schedule == "interleaved" and stages_per_rank < 2:
        raise ValueError("the interleaved schedule needs stages_per_rank >= 2")
    if world < 2:
        raise ValueError(
            "a pipeline needs at least 2 ranks: submit the job with --workers >= 2 "
            "(or call init_distributed() first)"
        )
    if schedule == "interleaved" and n_microbatches % world:
        raise ValueError(
            f"the interleaved schedule needs n_microbatches ({n_microbatches}) to be a "
            f"multiple of the world size ({world})"
        )


def pipeline_stages(
    model: nn.Sequential | Sequence[nn.Module],
    *,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    schedule: ScheduleName = "1f1b",
    stages_per_rank: int = 1,
    device: torch.device | str | None = None,
    broadcast_loss: bool = True,
) -> Pipeline:
    """This rank's part of a pipeline over the process group (call init_distributed first).

    Args:
        model: an ``nn.Sequential`` (cut into ``world_size * stages_per_rank`` stages,
            balanced by parameters) or a list of modules, one per stage, in order. Every
            rank passes the same model (built with the same seed): each keeps only its
            stages, moved to ``device``.
        n_microbatches: how many microbatches a batch is cut into (the batch size must be
            a multiple of it).
        loss_fn: ``loss_fn(output, target)``, mean-reducing, applied per microbatch.
        schedule: ``"1f1b"`` (one stage per rank) or ``"interleaved"`` (interleaved 1F1B,
            ``stages_per_rank`` >= 2 and ``n_microbatches`` a multiple of the world size).
        device: where the stages live (default: ``cuda:0`` with a GPU, else CPU).
        broadcast_loss: return the loss on every rank (one small broadcast a step).

    Raises:
        ValueError: fewer than 2 ranks, a stage count that does not match the modules,
            an unknown schedule or impossible microbatch settings.
    """
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleInterleaved1F1B,
    )

    world = world_size()
    _check_arguments(schedule, n_microbatches, stages_per_rank, world)
    n_stages = world * stages_per_rank
    modules, from_sequential = _stage_modules(model, n_stages)
    here = torch.device(device) if device is not None else _default_device()
    me = rank()
    indices = [me + k * world for k in range(stages_per_rank)]
    stages: list[Any] = []
    for i in indices:
        modules[i].to(here)
        stages.append(PipelineStage(modules[i], i, n_stages, here))
    runner: Any
    if schedule == "1f1b":
        runner = Schedule1F1B(stages[0], n_microbatches, loss_fn=loss_fn)
    else:
        runner = ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=loss_fn)
    module = _local_module(modules, indices, from_sequential)
    logger.info(
        "pipeline: rank %d of %d holds stage(s) %s of %d (%s, %d microbatches)",
        me,
        world,
        indices,
        n_stages,
        schedule,
        n_microbatches,
    )
    return Pipeline(
        [modules[i] for i in indices],
        indices,
        n_stages,
        runner,
        module,
        n_microbatches=n_microbatches,
        broadcast_loss=broadcast_loss,
    )


def _default_device() -> torch.device:
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
