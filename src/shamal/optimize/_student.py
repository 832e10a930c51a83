"""A smaller student of a transformer encoder, made of the teacher's own layers, and the text it
learns from.

The student is a Hugging Face folder like its teacher's: the same config with fewer layers
(``num_hidden_layers``), the embeddings, pooler and the chosen encoder layers' weights copied
from the teacher's safetensors (layer ``keep[j]`` of the teacher becomes layer ``j``), and the
tokenizer and sentence-transformers files copied as they are. Nothing is unpickled and no code
named by a file runs: weights are read as safetensors (checked by their bytes), the rest is
JSON and text.

The text is either the user's (a UTF-8 file, one sentence per line, read as hostile input:
size, line and count caps, no binary) or generated, seeded sentences that never include the
optimizer's probe sentences (the default held-out set of its fidelity gate).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._safety import contained, sniff_format
from shamal.optimize._transformer import WEIGHTS, is_transformer_folder, probe_sentences

__all__ = [
    "MAX_TEXT_BYTES",
    "build_student",
    "choose_layers",
    "generated_sentences",
    "read_sentences",
    "student_weights",
    "vocabulary_words",
]

logger = logging.getLogger(__name__)

#: What a user's text file may hold: bytes, sentences, characters per line.
MAX_TEXT_BYTES = 64 << 20
MAX_SENTENCES = 200_000
MAX_LINE_CHARS = 4096
#: Fewer sentences than this teach nothing and leave nothing to hold out.
MIN_SENTENCES = 16

#: The files of a model folder the student keeps as they are (tokenizer, sentence-transformers
#: modules); ``config.json`` and the weights are written anew.
_COMPANIONS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
_MAX_COMPANION_BYTES = 64 << 20
#: A BERT-like encoder's layer weights: ``[prefix.]encoder.layer.N.rest``.
_LAYER_KEY = re.compile(r"^((?:.+\.)?encoder\.layer\.)(\d+)(\..+)$")


def choose_layers(total: int, count: int) -> tuple[int, ...]:
    """``count`` of a teacher's ``total`` layers: the first and the last, the rest evenly
    between (6 -> 3 keeps 0, 3, 5; 6 -> 2 keeps 0, 5; one layer is the last).

    The last layer is kept because the pooled embedding is read from it: on all-MiniLM-L6-v2,
    before any training, keeping layers 0, 3, 5 gives a mean cosine of 0.73 to the teacher on
    the probe sentences, layers 0, 2, 4 only 0.40.

    Raises:
        InvalidParameter: ``count`` is not between 1 and ``total - 1``.
    """
    if not 1 <= count < total:
        raise InvalidParameter(
            f"--layers takes 1 to {total - 1} for a teacher of {total} layers, not {count}."
        )
    if count == 1:
        return (total - 1,)
    return tuple(int(i * (total - 1) / (count - 1) + 0.5) for i in range(count))


def _checked_keep(keep: Sequence[int], total: int) -> tuple[int, ...]:
    chosen = tuple(sorted(set(keep)))
    if not chosen or len(chosen) >= total or chosen[0] < 0 or chosen[-1] >= total:
        raise InvalidParameter(
            f"The layers to keep must be fewer than the teacher's {total}, each 0 to {total - 1}."
        )
    return chosen


def student_weights(tensors: Mapping[str, Any], keep: Sequence[int]) -> dict[str, Any]:
    """The teacher's tensors renamed for a student of the layers ``keep`` (teacher layer
    ``keep[j]`` becomes layer ``j``); other layers are left out, every other tensor kept."""
    position = {layer: j for j, layer in enumerate(keep)}
    out: dict[str, Any] = {}
    for name, tensor in tensors.items():
        match = _LAYER_KEY.match(name)
        if match is None:
            out[name] = tensor
        elif int(match.group(2)) in position:
            out[f"{match.group(1)}{position[int(match.group(2))]}{match.group(3)}"] = tensor
    return out


def _read_config(folder: Path) -> dict[str, Any]:
    path = contained(folder, "config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InvalidParameter("config.json is missing or is not JSON.") from None
    if not isinstance(config, dict):
        raise InvalidParameter("config.json must hold an object.")
    return config


def _layer_count(config: Mapping[str, Any], tensors: Mapping[str, Any]) -> int:
    total = config.get("num_hidden_layers")
    found = {int(m.group(2)) for m in map(_LAYER_KEY.match, tensors) if m is not None}
    if not isinstance(total, int) or isinstance(total, bool) or total < 2:
        raise InvalidParameter("Distillation needs an encoder whose config names its layers.")
    if found != set(range(total)):
        raise InvalidParameter(
            "Distillation takes BERT-like encoders (weights named encoder.layer.N); this "
            "model's weights do not match its config's layers."
        )
    return total


def _module_paths(folder: Path) -> list[str]:
    """The folders of a sentence-transformers model's modules (pooling etc.) that hold a
    config.json, from modules.json."""
    if not (folder / "modules.json").is_file():
        return []
    try:
        modules = json.loads(contained(folder, "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InvalidParameter("modules.json is not JSON.") from None
    if not isinstance(modules, list):
        raise InvalidParameter("modules.json must be a list of modules.")
    paths = [str(m.get("path") or "") for m in modules if isinstance(m, dict)]
    return [f"{p}/config.json" for p in paths if p and (folder / p / "config.json").is_file()]


def _copy_companions(teacher: Path, dest: Path) -> None:
    names = [n for n in _COMPANIONS if (teacher / n).is_file()] + _module_paths(teacher)
    for name in names:
        source = contained(teacher, name)
        if not source.is_file() or source.stat().st_size > _MAX_COMPANION_BYTES:
            raise InvalidParameter(f"{name} is not a plain file of at most 64 MiB.")
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def build_student(
    teacher: Path, dest: Path, *, layers: int = 3, keep: Sequence[int] | None = None
) -> tuple[tuple[int, ...], int]:
    """Write a student of ``teacher`` (a Hugging Face encoder folder) into ``dest``.

    Args:
        layers: how many layers the student has (spread as :func:`choose_layers` does).
        keep: the teacher's layers to keep instead (0-based), e.g. ``(0, 2, 4)``.

    Returns:
        (the teacher's layers kept, in order; how many layers the teacher has).

    Raises:
        InvalidParameter: not a transformer folder, weights that are not safetensors by their
            bytes, an encoder that is not BERT-like, or layers that do not fit the teacher.
    """
    from safetensors.torch import load_file, save_file

    teacher = Path(teacher).resolve()
    if not is_transformer_folder(teacher):
        raise InvalidParameter(
            "The teacher must be a Hugging Face encoder folder (config.json, model.safetensors, "
            "tokenizer.json)."
        )
    weights = contained(teacher, WEIGHTS)
    kind = sniff_format(weights)
    if kind != "safetensors":
        raise InvalidParameter(f"{WEIGHTS} is not a safetensors file (its bytes look like {kind}).")
    config = _read_config(teacher)
    tensors = load_file(str(weights))
    total = _layer_count(config, tensors)
    chosen = _checked_keep(keep, total) if keep is not None else choose_layers(total, layers)
    dest.mkdir(parents=True, exist_ok=True)
    _copy_companions(teacher, dest)
    student = {k: v.contiguous() for k, v in student_weights(tensors, chosen).items()}
    save_file(student, str(dest / WEIGHTS), metadata={"format": "pt"})
    (dest / "config.json").write_text(
        json.dumps({**config, "num_hidden_layers": len(chosen)}, indent=2) + "\n"
    )
    logger.info("student of %d layers %s built from %s", len(chosen), chosen, teacher)
    return chosen, total


# ---------------------------------------------------------------------- text
def read_sentences(path: Path, *, limit: int = MAX_SENTENCES) -> list[str]:
    """The distinct non-blank lines of a UTF-8 text file, in file order.

    Raises:
        InvalidParameter: not a readable regular file, over 64 MiB, binary (a NUL byte, or a
            pickle, archive or weights file by its first bytes), not UTF-8, a line over 4096
            characters, more than ``limit`` sentences, or fewer than 16.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidParameter(f"{path.name}: not a readable file.")
    if path.stat().st_size > MAX_TEXT_BYTES:
        raise InvalidParameter(f"{path.name}: over {MAX_TEXT_BYTES >> 20} MiB of text.")
    kind = sniff_format(path)
    if kind in ("pickle", "zip", "safetensors", "onnx"):
        raise InvalidParameter(f"{path.name}: expected text, one sentence a line (got {kind}).")
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise InvalidParameter(f"{path.name}: holds NUL bytes; expected text.")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidParameter(f"{path.name}: not UTF-8 text.") from None
    sentences = list(dict.fromkeys(s for s in (line.strip() for line in text.splitlines()) if s))
    too_long = next((i for i, s in enumerate(sentences) if len(s) > MAX_LINE_CHARS), None)
    if too_long is not None:
        raise InvalidParameter(f"{path.name}: a line is over {MAX_LINE_CHARS} characters.")
    if len(sentences) > limit:
        raise InvalidParameter(f"{path.name}: over {limit} sentences; give a smaller sample.")
    if len(sentences) < MIN_SENTENCES:
        raise InvalidParameter(f"{path.name}: at least {MIN_SENTENCES} distinct sentences needed.")
    return sentences


_SUBJECTS = (
    "The committee", "A young engineer", "Our neighbour", "The old bridge", "Every student",
    "The quarterly report", "A tired nurse", "The city council", "My grandmother", "The robot",
    "A small bakery", "The research team", "The pilot", "An anxious investor", "The museum",
    "A stray dog", "The new software", "The farmer", "Her lawyer", "The football club",
    "A local artist", "The weather service", "The hotel manager", "Our teacher",
)  # fmt: skip
_VERBS = (
    "questioned", "celebrated", "postponed", "repaired", "described", "ignored", "measured",
    "painted", "approved", "criticised", "photographed", "rebuilt", "translated", "sold",
    "discovered", "predicted", "cancelled", "welcomed",
)  # fmt: skip
_OBJECTS = (
    "the annual budget", "a broken window", "the long winter", "three rare books",
    "the harbour lights", "an unexpected letter", "the final exam", "a crowded train",
    "the garden fence", "the election results", "a forgotten song", "the mountain trail",
    "the price of bread", "an ancient coin", "the night shift", "a wooden boat",
    "the company website", "the missing keys", "a spicy curry", "the river flood",
)  # fmt: skip
_ENDINGS = (
    "yesterday", "after the meeting", "without any warning", "in the rain", "last spring",
    "for the second time", "with great care", "before lunch", "near the station",
    "despite the noise", "on Sunday morning", "at the last minute",
)  # fmt: skip


def vocabulary_words(tokenizer: Any, limit: int = 20_000) -> list[str]:
    """Whole ASCII words (2+ letters) of a tokenizer's vocabulary, in id order: the material of
    generated sentences that cover more of what the encoder reads than templates do."""
    vocab = tokenizer.get_vocab()
    words = [w for w, _ in sorted(vocab.items(), key=lambda item: item[1])]
    return [w for w in words if w.isascii() and w.isalpha() and len(w) >= 2][:limit]


def _templated(pick: int) -> str:
    rest, ending = divmod(pick, len(_ENDINGS))
    rest, obj = divmod(rest, len(_OBJECTS))
    subject, verb = divmod(rest, len(_VERBS))
    return f"{_SUBJECTS[subject]} {_VERBS[verb]} {_OBJECTS[obj]} {_ENDINGS[ending]}."


def generated_sentences(count: int, *, seed: int = 0, words: Sequence[str] = ()) -> list[str]:
    """``count`` distinct generated sentences (seeded), none of them a probe sentence of the
    optimizer's default fidelity check (those are held out).

    Without ``words`` all are templated sentences; with them, every other one is 4 to 14 words
    drawn from ``words`` (see :func:`vocabulary_words`), so that the student meets more of the
    vocabulary than a few templates hold.
    """
    total = len(_SUBJECTS) * len(_VERBS) * len(_OBJECTS) * len(_ENDINGS)
    if not 0 < count <= total:
        raise InvalidParameter(f"Between 1 and {total} generated sentences, not {count}.")
    held_out = set(probe_sentences(10_000))
    rng = np.random.default_rng(seed)
    picks = rng.permutation(total)[:count].tolist()
    out: list[str] = []
    for i, pick in enumerate(picks):
        sentence = _templated(pick)
        if words and i % 2:
            drawn = [words[j] for j in rng.integers(0, len(words), int(rng.integers(4, 15)))]
            sentence = " ".join(drawn).capitalize() + "."
        if sentence not in held_out:
            out.append(sentence)
    return list(dict.fromkeys(out))
