"""Distillation of a transformer encoder into a smaller student, with the training runtime.

:func:`distill_encoder` builds a student of fewer layers from the teacher's own (see
:mod:`shamal.optimize._student`), trains it to give the teacher's sentence embeddings on
unlabeled text (cosine + MSE against the teacher's outputs, computed once), then judges it as the
optimizer judges any variant: exported to ONNX, run on held-out sentences it never trained on,
compared with the teacher in PyTorch fp32 (:func:`shamal.optimize._measure.compare`, the
:class:`Thresholds` gate), and timed. The result is an :class:`OptimizeReport` whose candidate is
the model folder ``distilled-<N>l``, so it registers like any variant.

Training uses :mod:`shamal.train`: :class:`~shamal.train.Stepper` (precision, clipping, the
warmup-cosine schedule), :class:`~shamal.train.Checkpointer` (resume after a preemption at the
exact step, data order included) and a :class:`~shamal.train.PreemptionGuard` when one is given.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._folder import MODEL_FILE, write_model_folder
from shamal.optimize._layer_choice import LayerChoice, encoder_layers, measure_layers
from shamal.optimize._measure import (
    Thresholds,
    Timing,
    compare,
    measure_latency,
    run_batches,
    session,
)
from shamal.optimize._pipeline import CPU, OptimizeReport, VariantReport
from shamal.optimize._student import (
    build_student,
    choose_layers,
    generated_sentences,
    read_sentences,
    vocabulary_words,
)
from shamal.optimize._transformer import (
    INPUT_NAMES,
    TransformerSource,
    export_transformer,
    load_transformer,
    probe_sentences,
    tokenize,
)
from shamal.optimize._variants import graph_optimize

if TYPE_CHECKING:
    from shamal.train import CheckpointStore, PreemptionGuard

__all__ = ["DistillLog", "DistillReport", "DistillRequest", "distill_encoder"]

logger = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]
#: Held-out sentences when the user gives none: the optimizer's own probe set.
PROBE_HOLDOUT = 64
#: A user's text keeps this share (at most ``DistillRequest.holdout`` lines) for the gate.
HOLDOUT_SHARE = 0.1
TEACHER_VARIANT = "teacher-fp32"
#: Training sentences the choice of layers is measured on.
CHOICE_SAMPLE = 256
#: How the layers are chosen when ``keep`` is not given.
CHOICES = ("measured", "spread")


@dataclass(frozen=True)
class DistillRequest:
    """What student to make and how to train and judge it.

    Attributes:
        layers: the student's layer count.
        keep: the teacher's layers to keep instead (0-based), e.g. ``(0, 2, 4)``.
        choose: how ``layers`` layers are chosen when ``keep`` is None: ``measured`` (the
            subset whose untrained embeddings stay closest to the teacher's on a sample of the
            training sentences, :mod:`shamal.optimize._layer_choice`) or ``spread`` (evenly,
            first and last kept).
        data: a UTF-8 text file, one sentence a line; None = generated sentences.
        sentences: how many sentences to generate when ``data`` is None.
        epochs: passes over the training sentences.
        max_steps: stop after this many optimizer steps (None = every epoch).
        batch_size, learning_rate, max_length: of training (``max_length`` in tokens, also
            the held-out sentences' length).
        holdout: at most this many of the user's lines are held out for the gate.
        thresholds: what blocks the student (its minimum cosine to the teacher).
        seed: data order and generated sentences.
        timed: time the teacher and the student (ONNX Runtime) at ``batches`` x ``threads``.
        precision: fp32 or bf16 (as :class:`~shamal.train.Stepper` takes it).
        token_weight: the weight of a second loss, the MSE between the student's and the
            teacher's last hidden states token by token (0 = embeddings only): many more
            targets per sentence than one embedding, which helps when sentences are few.
        source_uri: the teacher's ``models:/`` URI, written into the variant's manifest.
    """

    layers: int = 3
    keep: tuple[int, ...] | None = None
    choose: str = "measured"
    data: Path | None = None
    sentences: int = 2000
    epochs: int = 3
    max_steps: int | None = None
    batch_size: int = 32
    learning_rate: float = 2e-4
    max_length: int = 128
    holdout: int = 256
    thresholds: Thresholds = field(default_factory=Thresholds)
    seed: int = 0
    timed: bool = True
    batches: tuple[int, ...] = (1, 32)
    threads: tuple[int, ...] = (2,)
    repeats: int = 20
    precision: str = "fp32"
    token_weight: float = 1.0
    source_uri: str | None = None

    def check(self) -> None:
        """Raises InvalidParameter for values that make no sense."""
        limits = (
            (1 <= self.layers <= 256, "--layers takes 1 or more (fewer than the teacher has)."),
            (1 <= self.epochs <= 1000, "--epochs takes 1 to 1000."),
            (self.max_steps is None or self.max_steps >= 1, "--max-steps takes 1 or more."),
            (1 <= self.batch_size <= 4096, "--batch-size takes 1 to 4096."),
            (
                math.isfinite(self.learning_rate) and 0 < self.learning_rate < 1,
                "--learning-rate takes a number between 0 and 1.",
            ),
            (8 <= self.max_length <= 512, "--max-length takes 8 to 512 tokens."),
            (1 <= self.sentences <= 100_000, "--sentences takes 1 to 100000."),
            (8 <= self.holdout <= 10_000, "--holdout takes 8 to 10000."),
            (self.precision in ("fp32", "bf16"), "--precision takes fp32 or bf16."),
            (self.choose in CHOICES, "--choose-layers takes measured or spread."),
            (
                math.isfinite(self.token_weight) and 0 <= self.token_weight <= 100,
                "--token-weight takes 0 to 100.",
            ),
        )
        for ok, message in limits:
            if not ok:
                raise InvalidParameter(message)

    @property
    def variant(self) -> str:
        """The student variant's name: ``distilled-<N>l``."""
        count = len(set(self.keep)) if self.keep is not None else self.layers
        return f"distilled-{count}l"


class DistillLog(Protocol):
    """Where training reports: a tracked run in a job, nothing by default."""

    def started(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        """Training starts (``saved``: what the resumed checkpoint carried, else empty);
        returns what to carry in checkpoints (e.g. the tracked run's id)."""
        ...

    def metrics(self, step: int, values: Mapping[str, float]) -> None: ...


class _Quiet:
    def started(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        return None


@dataclass(frozen=True)
class DistillReport:
    """A distillation: the student, how it trained, and its judged variant(s).

    Attributes:
        student: the trained student as a Hugging Face folder (safetensors weights).
        keep: the teacher's layers the student started from (its layer ``j`` was ``keep[j]``).
        teacher_layers: the teacher's layer count.
        sentences: how many sentences it trained on; ``origin`` says where they came from.
        holdout: how many held-out sentences judged it.
        losses: the training loss after each optimizer step (a resumed run's included).
        report: the teacher's fp32 ONNX (when timed) and the student's variant, last.
        choice: how the layers were measured and chosen (None: given, or spread evenly).
    """

    student: Path
    keep: tuple[int, ...]
    teacher_layers: int
    sentences: int
    origin: str
    holdout: int
    losses: tuple[float, ...]
    report: OptimizeReport
    choice: LayerChoice | None = None

    @property
    def candidate(self) -> VariantReport:
        return self.report.candidate

    @property
    def teacher(self) -> VariantReport | None:
        first = self.report.variants[0]
        return first if first.name == TEACHER_VARIANT else None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.report.to_json(),
            "student": str(self.student),
            "keep": list(self.keep),
            "teacher_layers": self.teacher_layers,
            "sentences": self.sentences,
            "origin": self.origin,
            "holdout": self.holdout,
            "steps": len(self.losses),
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "layer_choice": self.choice.to_json() if self.choice else None,
        }


# ---------------------------------------------------------------------- data
def _texts(request: DistillRequest, tokenizer: Any) -> tuple[list[str], list[str], str]:
    """(training sentences, held-out sentences, where they came from)."""
    if request.data is None:
        words = vocabulary_words(tokenizer)
        train = generated_sentences(request.sentences, seed=request.seed, words=words)
        return train, probe_sentences(PROBE_HOLDOUT), f"{len(train)} generated sentences"
    given = read_sentences(request.data)
    count = max(8, min(request.holdout, int(len(given) * HOLDOUT_SHARE)))
    order = np.random.default_rng(request.seed).permutation(len(given))
    held = set(order[:count].tolist())
    train = [s for i, s in enumerate(given) if i not in held]
    holdout = [given[i] for i in sorted(held)]
    return train, holdout, f"{request.data.name} ({len(train)} + {count} held out)"


def _trimmed(feeds: Feeds, rows: np.ndarray) -> Feeds:
    """Rows of the token feeds, cut to the longest sentence among them (padding costs time and
    changes no masked mean)."""
    mask = feeds["attention_mask"][rows]
    width = max(1, int(mask.sum(axis=1).max()))
    return {name: np.ascontiguousarray(feeds[name][rows, :width]) for name in INPUT_NAMES}


def _embed(source: TransformerSource, feeds: Feeds, batch: int = 128) -> np.ndarray:
    rows = len(feeds["input_ids"])
    parts = [
        source.reference(_trimmed(feeds, np.arange(start, min(rows, start + batch))))
        for start in range(0, rows, batch)
    ]
    return np.concatenate([next(iter(p.values())) for p in parts])


def _token_states(source: TransformerSource, feeds: Feeds, batch: int = 128) -> list[np.ndarray]:
    """The teacher's last hidden states, one ``[tokens, hidden]`` fp16 array per sentence
    (its own length, no padding)."""
    import torch

    rows = len(feeds["input_ids"])
    lengths = feeds["attention_mask"].sum(axis=1)
    out: list[np.ndarray] = []
    for start in range(0, rows, batch):
        chunk = _trimmed(feeds, np.arange(start, min(rows, start + batch)))
        with torch.inference_mode():
            hidden = source.module.model(
                input_ids=torch.from_numpy(chunk["input_ids"]),
                attention_mask=torch.from_numpy(chunk["attention_mask"]),
            )[0].numpy()
        for i, states in enumerate(hidden):
            out.append(states[: int(lengths[start + i])].astype(np.float16))
    return out


def _choose(
    request: DistillRequest, teacher: TransformerSource, feeds: Feeds
) -> LayerChoice | None:
    """The measured choice of layers, when it is asked for and the encoder is BERT-like."""
    if request.keep is not None or request.choose != "measured":
        return None
    layers = encoder_layers(teacher.module.model)
    if layers is None:
        return None
    spread = choose_layers(len(layers), request.layers)
    count = len(feeds["input_ids"])
    rows = np.sort(np.random.default_rng(request.seed).permutation(count)[:CHOICE_SAMPLE])
    sample = {name: feeds[name][rows] for name in INPUT_NAMES}
    return measure_layers(
        teacher.module.model, lambda: _embed(teacher, sample), request.layers, spread
    )


# ---------------------------------------------------------------------- training
@dataclass
class _Training:
    """What the loop needs besides the model."""

    feeds: Feeds
    targets: np.ndarray
    states: list[np.ndarray]
    request: DistillRequest
    log: DistillLog
    checkpoints: CheckpointStore | None
    guard: PreemptionGuard | None
    #: The teacher's layers the student started from; a resumed run reports its checkpoint's.
    keep: tuple[int, ...] = ()

    @property
    def per_epoch(self) -> int:
        return math.ceil(len(self.targets) / self.request.batch_size)

    @property
    def total_steps(self) -> int:
        steps = self.per_epoch * self.request.epochs
        return min(steps, self.request.max_steps) if self.request.max_steps else steps

    def rows(self, step: int) -> np.ndarray:
        """The rows of optimizer step ``step``: a seeded shuffle per epoch, so a resumed run
        sees the same batches as an uninterrupted one."""
        epoch, index = divmod(step, self.per_epoch)
        order = np.random.default_rng((self.request.seed, epoch)).permutation(len(self.targets))
        size = self.request.batch_size
        return order[index * size : (index + 1) * size]


def _loss(student: Any, teacher: Any) -> Any:
    """Cosine distance plus MSE between student and teacher embeddings."""
    import torch

    cosine = torch.nn.functional.cosine_similarity(student, teacher, dim=1)
    return (1.0 - cosine).mean() + torch.nn.functional.mse_loss(student, teacher)


def _optimizer(module: Any, learning_rate: float) -> Any:
    """AdamW over the student's weights but its word embeddings, which stay the teacher's: the
    student keeps its input space, and their 30k-row gradient and optimizer state would cost
    more than the rest of a step."""
    import torch

    trained = []
    for name, parameter in module.named_parameters():
        parameter.requires_grad_("word_embeddings" not in name)
        if parameter.requires_grad:
            trained.append(parameter)
    return torch.optim.AdamW(trained, lr=learning_rate, foreach=True)


def _resumed(saver: Any, state: dict[str, Any]) -> tuple[int, list[float], dict[str, Any]]:
    """(the step to start from, the losses so far, what the checkpoint carried)."""
    resumed = saver.resume(**state) if saver is not None else None
    if resumed is None:
        return 0, [], {}
    return resumed.step, [float(x) for x in resumed.extra.get("losses", [])], resumed.extra


#: The teacher's token states are kept in memory (fp16) up to this size.
MAX_TOKEN_STATE_BYTES = 1 << 30


def _token_loss(request: DistillRequest, feeds: Feeds, width: int) -> bool:
    """Whether the token-state loss is on: asked for, and its targets (``width`` numbers a
    token, fp16) fit in memory."""
    if request.token_weight <= 0:
        return False
    tokens = int(feeds["attention_mask"].sum())
    if tokens * width * 2 > MAX_TOKEN_STATE_BYTES:
        logger.warning("%d tokens: too many for the token-state loss; embeddings only", tokens)
        return False
    return True


def _state_targets(job: _Training, rows: np.ndarray, width: int) -> np.ndarray:
    """The teacher's token states of ``rows``, zero-padded to ``width`` tokens."""
    first = job.states[int(rows[0])]
    out = np.zeros((len(rows), width, first.shape[-1]), dtype=np.float32)
    for i, row in enumerate(rows.tolist()):
        states = job.states[row][:width]
        out[i, : len(states)] = states
    return out


def _step(module: Any, stepper: Any, job: _Training, step: int) -> float:
    """One optimizer step on the rows of ``step``; returns its loss."""
    import torch

    rows = job.rows(step)
    feeds = _trimmed(job.feeds, rows)
    captured: list[Any] = []
    hook = module.model.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
    try:
        with stepper.micro_step():
            out = module(*(torch.from_numpy(feeds[n]) for n in INPUT_NAMES))
            loss = _loss(out.float(), torch.from_numpy(job.targets[rows]))
            if job.states:
                width = feeds["input_ids"].shape[1]
                target = torch.from_numpy(_state_targets(job, rows, width))
                mask = torch.from_numpy(feeds["attention_mask"]).unsqueeze(-1).float()
                error = ((captured[0].float() - target) ** 2 * mask).sum()
                loss = loss + job.request.token_weight * error / (mask.sum() * target.shape[-1])
    finally:
        hook.remove()
    stepper.backward(loss)
    return float(loss.detach())


def _train(module: Any, job: _Training) -> list[float]:
    """Train ``module`` (the student's pooled encoder) toward the targets; returns the loss of
    every step, a resumed run's earlier ones included."""
    from shamal.train import Checkpointer, Stepper, warmup_cosine

    total = job.total_steps
    optimizer = _optimizer(module, job.request.learning_rate)
    scheduler = warmup_cosine(optimizer, max(1, total // 10), total)
    stepper = Stepper(
        module, optimizer, precision=job.request.precision, clip_norm=1.0, scheduler=scheduler
    )
    state = {"model": module, "optimizer": optimizer, "scheduler": scheduler}
    saver = None if job.checkpoints is None else Checkpointer(job.checkpoints, keep_last=1)
    start, losses, saved = _resumed(saver, state)
    if saved.get("keep"):
        job.keep = tuple(int(layer) for layer in saved["keep"])
    carried = job.log.started(saved)
    # Dropout stays off: the student copies a fixed function, and on a short run the noise
    # only slows it down. Gradients flow in eval mode all the same.
    module.eval()
    for step in range(start, total):
        losses.append(_step(module, stepper, job, step))
        job.log.metrics(step + 1, {"loss": losses[-1], "lr": float(scheduler.get_last_lr()[0])})
        stop = job.guard is not None and job.guard.should_stop()
        if saver is not None and (stop or (step + 1) % job.per_epoch == 0 or step + 1 == total):
            extra = {**carried, "losses": losses, "keep": list(job.keep)}
            saver.save(step + 1, **state, extra=extra)
        if stop and job.guard is not None:
            job.guard.exit()
    return losses


def _save_student(module: Any, folder: Path) -> None:
    """The trained weights, as the teacher's were stored (safetensors, same names)."""
    from safetensors.torch import save_file

    state = {k: v.detach().clone().contiguous() for k, v in module.model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


# ---------------------------------------------------------------------- the gate
def _variant(
    name: str,
    source: TransformerSource,
    reference: dict[str, np.ndarray],
    evals: tuple[Feeds, str],
    request: DistillRequest,
    dest: Path,
) -> VariantReport:
    """Export ``source`` as the model folder ``dest/name``, judge it against ``reference`` and
    time it."""
    feeds, origin = evals
    graph = graph_optimize(export_transformer(source))
    folder = dest / name
    where = {"model_uri": request.source_uri, "variant": name} if request.source_uri else None
    write_model_folder(folder, graph, task=source.task, source=where)
    path = folder / MODEL_FILE
    outputs = run_batches(session(path, max(request.threads)), feeds)
    fidelity = compare(source.task, reference, outputs, None, request.thresholds, origin)
    timings: tuple[Timing, ...] = ()
    if request.timed:
        timings = tuple(
            measure_latency(path, feeds, request.batches, request.threads, repeats=request.repeats)
        )
    return VariantReport(name, folder, path.stat().st_size, fidelity, timings, CPU)


def distill_encoder(
    teacher: Path,
    dest: Path,
    request: DistillRequest | None = None,
    *,
    log: DistillLog | None = None,
    checkpoints: CheckpointStore | None = None,
    guard: PreemptionGuard | None = None,
) -> DistillReport:
    """Distill ``teacher`` (a Hugging Face / sentence-transformers encoder folder) into a
    student of fewer layers, and judge it.

    Writes ``dest/student`` (the trained student, a Hugging Face folder), ``dest/<variant>``
    (its ONNX model folder, e.g. ``distilled-3l``) and, when timed, ``dest/teacher-fp32``.

    Args:
        log: receives the loss and learning rate of every step.
        checkpoints: where training checkpoints go; a checkpoint found there is resumed.
        guard: a preemption guard: when it is tripped, the step's checkpoint is written and
            the process exits to be requeued.

    Raises:
        InvalidParameter: a bad request, a teacher that is not a BERT-like encoder folder, or
            hostile text (see :func:`~shamal.optimize._student.read_sentences`).
    """
    request = request or DistillRequest()
    request.check()
    if dest.exists() and any(dest.iterdir()):
        raise InvalidParameter(f"{dest} is not empty; choose another output folder.")
    teacher_model = load_transformer(teacher)
    if teacher_model.task != "embedding":
        raise InvalidParameter(
            "Distillation takes sentence embedding models (a sentence-transformers folder "
            "with mean pooling)."
        )
    train, holdout, origin = _texts(request, teacher_model.tokenizer)
    feeds = tokenize(teacher_model.tokenizer, train, request.max_length)
    choice = _choose(request, teacher_model, feeds)
    keep, total = build_student(
        teacher,
        dest / "student",
        layers=request.layers,
        keep=choice.keep if choice else request.keep,
    )
    targets = _embed(teacher_model, feeds)
    states: list[np.ndarray] = []
    if _token_loss(request, feeds, teacher_model.hidden_size):
        states = _token_states(teacher_model, feeds)
    job = _Training(feeds, targets, states, request, log or _Quiet(), checkpoints, guard, keep)
    student = load_transformer(dest / "student")
    losses = _train(student.module, job)
    if job.keep != keep:  # resumed from a checkpoint whose student started elsewhere
        logger.warning("resumed a student of layers %s (measured now: %s)", job.keep, keep)
        keep, choice = job.keep, None
    _save_student(student.module, dest / "student")
    held = tokenize(teacher_model.tokenizer, holdout, request.max_length)
    evals = (_trimmed(held, np.arange(len(holdout))), f"{len(holdout)} held-out sentences")
    reference = teacher_model.reference(evals[0])
    variants = []
    if request.timed:
        variants.append(_variant(TEACHER_VARIANT, teacher_model, reference, evals, request, dest))
    student = load_transformer(dest / "student")  # from the saved file: what is registered
    variants.append(_variant(request.variant, student, reference, evals, request, dest))
    source = str(request.source_uri or teacher)
    report = OptimizeReport(source, "transformer", "embedding", tuple(variants))
    return DistillReport(
        dest / "student",
        keep,
        total,
        len(train),
        origin,
        len(holdout),
        tuple(losses),
        report,
        choice,
    )
