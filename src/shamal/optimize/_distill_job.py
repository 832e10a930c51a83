"""Distillation against the platform: the teacher from the registry, training tracked in a run,
checkpoints that survive a preemption, and the student registered as a variant of its teacher.

What ``shamal distill`` runs, in a job (its default) or in-process (``--local``). The run that
tracked the training (experiment ``shamal-distill``, named after the variant) is the run the
student's version is registered from, so the registry's lineage leads from the version to the run
that made it; the version's tags name the teacher (``shamal.source_model_uri``,
``shamal.source_version``) as every optimizer variant's do, plus what distillation adds
(``shamal.distill.*``: layers kept, data, steps, loss; ``shamal.teacher.*``: the teacher's size and
latency beside the student's).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shamal.client import ModelRef, ShamalClient
from shamal.errors import InvalidParameter
from shamal.optimize._distill import DistillReport, DistillRequest, distill_encoder
from shamal.optimize._pipeline import VariantReport
from shamal.optimize._register import fetch_source, variant_tags
from shamal.optimize._transformer import is_transformer_folder

if TYPE_CHECKING:
    from shamal.train import CheckpointStore, PreemptionGuard, Tracker

__all__ = [
    "DISTILL_EXPERIMENT",
    "DistillOutcome",
    "distill_model",
    "distill_tags",
    "job_checkpoints",
    "teacher_folder",
]

logger = logging.getLogger(__name__)

DISTILL_EXPERIMENT = "shamal-distill"
#: How deep below a downloaded version the encoder folder may sit (an MLflow
#: sentence-transformers model keeps it in ``model.sentence_transformer/``).
_SEARCH_DEPTH = 3


def teacher_folder(folder: Path) -> Path:
    """The Hugging Face encoder folder in a downloaded version: ``folder`` itself, or the
    shallowest folder below it (3 levels at most) with config.json, model.safetensors and
    tokenizer.json.

    Raises:
        InvalidParameter: none there.
    """
    folder = Path(folder)
    for depth in range(_SEARCH_DEPTH + 1):
        pattern = "/".join(["*"] * depth)
        found = [folder] if depth == 0 else sorted(folder.glob(pattern))
        holders = [p for p in found if p.is_dir() and not p.is_symlink()]
        match = next((p for p in holders if is_transformer_folder(p)), None)
        if match is not None:
            return match
    raise InvalidParameter(
        "The teacher holds no Hugging Face encoder folder (config.json, model.safetensors and "
        "tokenizer.json): distillation takes sentence-transformers / BERT-like encoders."
    )


class _TrackedLog:
    """Training metrics in a run of the tracking server (:class:`shamal.train.Tracker`),
    created when training starts, or reopened from a resumed checkpoint's run id."""

    def __init__(self, client: ShamalClient | None, run_name: str, tags: Mapping[str, str]) -> None:
        self._client = client
        self._run_name = run_name
        self._tags = dict(tags)
        self.tracker: Tracker | None = None

    def started(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        if self._client is None:
            return {}
        import httpx

        from shamal.train import Tracker

        headers = {"Authorization": f"Bearer {self._client.token}"} if self._client.token else {}
        http = httpx.Client(base_url=self._client.url, headers=headers, timeout=30.0)
        run_id = saved.get("run_id")
        self.tracker = Tracker(
            DISTILL_EXPERIMENT,
            run_name=self._run_name,
            tags=self._tags,
            http=http,
            run_id=str(run_id) if run_id else None,
        )
        return {"run_id": self.tracker.run_id}

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        if self.tracker is not None:
            self.tracker.log_metrics(values, step)


def job_checkpoints() -> CheckpointStore | None:
    """In a scheduler job of a team (``SHAMAL_JOB_ID``, ``SHAMAL_TEAM``): checkpoints in the
    team's artifact store, kept across the job's attempts. Elsewhere none."""
    job = os.environ.get("SHAMAL_JOB_ID", "")
    if not job or not os.environ.get("SHAMAL_TEAM"):
        return None
    from shamal.train import ArtifactCheckpointStore

    return ArtifactCheckpointStore(f"distill/{job}")


def _job_guard() -> PreemptionGuard | None:
    """In a scheduler job: a guard that turns the scheduler's SIGTERM into a checkpoint and a
    requeue."""
    if not os.environ.get("SHAMAL_JOB_ID"):
        return None
    from shamal.train import PreemptionGuard

    return PreemptionGuard().install()


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def distill_tags(report: DistillReport, request: DistillRequest) -> dict[str, str]:
    """What distillation adds to a variant's tags: the layers, the data, the training and the
    teacher's own figures."""
    tags = {
        "shamal.distill.teacher_layers": str(report.teacher_layers),
        "shamal.distill.student_layers": str(len(report.keep)),
        "shamal.distill.kept_layers": ",".join(map(str, report.keep)),
        "shamal.distill.sentences": str(report.sentences),
        "shamal.distill.data": report.origin[:250],
        "shamal.distill.steps": str(len(report.losses)),
        "shamal.distill.holdout": str(report.holdout),
        "shamal.distill.layer_choice": "measured" if report.choice else "given or spread",
    }
    if report.choice is not None:
        tags["shamal.distill.untrained_cosine_mean"] = f"{report.choice.cosine_mean:.6f}"
    if report.losses:
        tags["shamal.distill.loss_first"] = f"{report.losses[0]:.6f}"
        tags["shamal.distill.loss_last"] = f"{report.losses[-1]:.6f}"
    if request.data is not None:
        tags["shamal.distill.data_sha256"] = _digest(request.data)
    teacher = report.teacher
    if teacher is not None:
        tags["shamal.teacher.size_bytes"] = str(teacher.size_bytes)
        for t in teacher.timings:
            tags[f"shamal.teacher.latency.p50_ms.b{t.batch}.t{t.threads}"] = f"{t.p50_ms:.3f}"
    return tags


def _figures(report: DistillReport) -> dict[str, float]:
    """The run's metrics (step 0) besides the loss curve."""
    figures: dict[str, float] = {}
    for prefix, variant in (("student", report.candidate), ("teacher", report.teacher)):
        if variant is None:
            continue
        figures[f"{prefix}_size_bytes"] = float(variant.size_bytes)
        f = variant.fidelity
        if f.cosine_mean is not None and f.cosine_min is not None:
            figures[f"{prefix}_cosine_mean"] = f.cosine_mean
            figures[f"{prefix}_cosine_min"] = f.cosine_min
        for t in variant.timings:
            figures[f"{prefix}_p50_ms_b{t.batch}_t{t.threads}"] = t.p50_ms
    return figures


@dataclass(frozen=True)
class DistillOutcome:
    """A distillation and, when it passed its gate and was asked for, the registered version."""

    report: DistillReport
    registered: ModelRef | None
    run_id: str | None


def _lineage_tags(variant: str, source_uri: str, source: ModelRef | None) -> dict[str, str]:
    tags = {"shamal.source_model_uri": source_uri, "shamal.variant": variant}
    if source is not None:
        tags["shamal.source_version"] = str(source.version)
    return tags


def _register(
    client: ShamalClient,
    outcome: DistillReport,
    request: DistillRequest,
    log: _TrackedLog,
    where: tuple[str, str, ModelRef | None],
) -> ModelRef:
    """Upload the student to the tracked run, end the run and register the version."""
    model_name, source_uri, source = where
    tracker = log.tracker
    assert tracker is not None  # training started, so the run exists
    variant: VariantReport = outcome.candidate
    tags = variant_tags(outcome.report, variant, source_uri, source) | distill_tags(
        outcome, request
    )
    client.log_run_values(tracker.run_id, {"variant": variant.name}, _figures(outcome), _now_ms())
    model_uri = client.upload_run_folder(tracker.run_id, variant.folder, "model")
    client.upload_run_folder(tracker.run_id, outcome.student, "student")
    tracker.close()
    client.ensure_registered_model(model_name)
    fidelity = variant.fidelity
    description = (
        f"{variant.name}: {len(outcome.keep)} of the {outcome.teacher_layers} layers of "
        f"{source_uri}, distilled ({fidelity.metric} {fidelity.variant:.4f})"
    )
    return client.create_model_version(model_name, model_uri, tracker.run_id, tags, description)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def _distill_tracked(
    teacher: Path,
    dest: Path,
    request: DistillRequest,
    log: _TrackedLog,
    checkpoints: CheckpointStore | None,
) -> DistillReport:
    """:func:`distill_encoder` with the job's checkpoints and guard; a failure ends the tracked
    run as FAILED, a preemption as KILLED (the next attempt resumes it)."""
    from shamal.train import REQUEUE_EXIT_CODE

    guard = _job_guard()
    try:
        return distill_encoder(
            teacher, dest, request, log=log, checkpoints=checkpoints, guard=guard
        )
    except BaseException as exc:
        requeued = isinstance(exc, SystemExit) and exc.code == REQUEUE_EXIT_CODE
        if log.tracker is not None:
            log.tracker.close("KILLED" if requeued else "FAILED")
        raise
    finally:
        if guard is not None:
            guard.uninstall()


def distill_model(
    client: ShamalClient | None,
    model_uri: str,
    dest: Path,
    request: DistillRequest | None = None,
    *,
    register_as: str | None = None,
    register: bool = True,
) -> DistillOutcome:
    """Distill a teacher, track the training in a run, and register the student when it passes
    its gate.

    Args:
        client: the platform; None for a local teacher that is not registered (nothing is
            tracked then).
        model_uri: ``models:/NAME/VERSION`` (or ``@ALIAS``, ``/latest``), downloaded beside
            ``dest``; or a local encoder folder.
        dest: an empty or absent folder: the student and the variants go there (the teacher
            is downloaded into a temporary folder).
        register_as: the registered model the student becomes a version of (default: the
            teacher's; a local teacher is registered only when this is given).
        register: False to keep the student out of the registry whatever its verdict.

    Raises:
        InvalidParameter: see :func:`distill_encoder`; a teacher that holds no encoder folder.
    """
    request = request or DistillRequest()
    request.check()
    source: ModelRef | None = None
    with tempfile.TemporaryDirectory(prefix="shamal-distill-") as tmp:
        location = Path(model_uri)
        if model_uri.startswith("models:/"):
            if client is None:
                raise InvalidParameter("A models:/ teacher is read from the platform.")
            source, location = fetch_source(client, model_uri, Path(tmp))
            request = replace(request, source_uri=source.uri)
        source_uri = source.uri if source is not None else model_uri
        teacher = teacher_folder(location)
        tags = _lineage_tags(request.variant, source_uri, source)
        log = _TrackedLog(client, f"distill-{request.variant}", tags)
        checkpoints = job_checkpoints()
        report = _distill_tracked(teacher, dest, request, log, checkpoints)
    name = register_as or (source.name if source is not None else None)
    run_id = log.tracker.run_id if log.tracker is not None else None
    if client is None or not register or name is None or report.candidate.fidelity.blocked:
        if client is not None and log.tracker is not None:
            client.log_run_values(log.tracker.run_id, {}, _figures(report), _now_ms())
            log.tracker.close()
        _discard(checkpoints)
        return DistillOutcome(report, None, run_id)
    made = _register(client, report, request, log, (name, source_uri, source))
    _discard(checkpoints)
    return DistillOutcome(report, made, run_id)


def _discard(checkpoints: CheckpointStore | None) -> None:
    """Checkpoints serve a requeued attempt only: once the student is judged (and
    registered) they would only take room in the team's store."""
    if checkpoints is None:
        return
    for key in checkpoints.keys("ckpt-"):
        checkpoints.delete(key)
    close = getattr(checkpoints, "close", None)  # the artifact store holds a client
    if close is not None:
        close()
