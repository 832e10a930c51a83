"""Which of a teacher's layers a student starts from, chosen by measuring them.

Spreading the kept layers evenly (:func:`~shamal.optimize._student.choose_layers`) is a guess.
Which layers a model can lose depends on the model: on all-MiniLM-L6-v2, before any training,
the four layers 0, 2, 4, 5 give a mean cosine of 0.85 to the teacher's embeddings on real
sentences and the evenly spread 0, 2, 3, 5 only 0.77; among five layers, dropping layer 4 leaves
0.82 and dropping layer 2 leaves 0.94. The student learns from where it starts, so the choice
carries through training.

:func:`measure_layers` runs the teacher itself with layers left out (its encoder's layer list
swapped for a subset, restored after), on a sample of the training sentences, and keeps the
subset whose embeddings stay closest to the full teacher's (mean cosine, then minimum). Every
subset is tried when there are at most :data:`EXHAUSTIVE_LIMIT`; past that, layers are dropped
one at a time, each time the one whose loss costs least (backward elimination). Sentences held
out for the gate are never used here.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from shamal.optimize._measure import row_cosines

__all__ = ["EXHAUSTIVE_LIMIT", "LayerChoice", "encoder_layers", "measure_layers", "search_layers"]

logger = logging.getLogger(__name__)

#: Try every subset when there are at most this many; eliminate layer by layer past it.
EXHAUSTIVE_LIMIT = 64

#: (the kept layers) -> (mean cosine, minimum cosine) to the full teacher.
Score = Callable[[tuple[int, ...]], tuple[float, float]]


@dataclass(frozen=True)
class LayerChoice:
    """The measured choice, and what the even spread would have given.

    Attributes:
        keep: the teacher's layers the student starts from (ascending).
        cosine_mean, cosine_min: the untrained student's cosine to the teacher on the sample.
        spread: the evenly spread layers, and ``spread_mean`` their mean cosine.
        tried: how many subsets were measured; ``exhaustive`` whether that was all of them.
        sentences: how many training sentences the measurement ran on.
    """

    keep: tuple[int, ...]
    cosine_mean: float
    cosine_min: float
    spread: tuple[int, ...]
    spread_mean: float
    tried: int
    exhaustive: bool
    sentences: int

    def to_json(self) -> dict[str, Any]:
        """Every field, the layer tuples as lists."""
        return {**asdict(self), "keep": list(self.keep), "spread": list(self.spread)}

    def describe(self) -> str:
        """One line for people: what was kept and why."""
        how = "every subset" if self.exhaustive else "layer by layer"
        text = (
            f"kept layers {','.join(map(str, self.keep))}: before training, cosine "
            f"{self.cosine_mean:.3f} (min {self.cosine_min:.3f}) to the teacher on "
            f"{self.sentences} training sentences ({self.tried} subsets tried, {how})"
        )
        if self.spread != self.keep:
            text += (
                f"; evenly spread {','.join(map(str, self.spread))} gives {self.spread_mean:.3f}"
            )
        return text


def search_layers(
    total: int, count: int, score: Score
) -> tuple[tuple[int, ...], dict[tuple[int, ...], tuple[float, float]], bool]:
    """The best ``count`` of ``total`` layers by ``score`` (higher is better, compared as
    (mean, min)); returns (the layers, the score of every subset tried, whether all were)."""
    seen: dict[tuple[int, ...], tuple[float, float]] = {}

    def scored(keep: tuple[int, ...]) -> tuple[float, float]:
        if keep not in seen:
            seen[keep] = score(keep)
        return seen[keep]

    if math.comb(total, count) <= EXHAUSTIVE_LIMIT:
        best = max(itertools.combinations(range(total), count), key=scored)
        return best, seen, True
    current = tuple(range(total))
    while len(current) > count:
        options = [tuple(x for x in current if x != drop) for drop in current]
        current = max(options, key=scored)
    return current, seen, False


def encoder_layers(model: Any) -> Any | None:
    """The list of a BERT-like model's encoder layers (``model.encoder.layer``), or None."""
    import torch

    layers = getattr(getattr(model, "encoder", None), "layer", None)
    return layers if isinstance(layers, torch.nn.ModuleList) and len(layers) > 1 else None


@contextmanager
def _subset(model: Any, layers: Any, keep: tuple[int, ...]) -> Iterator[None]:
    """``model`` runs only the layers ``keep`` inside the block; all of them again after."""
    import torch

    model.encoder.layer = torch.nn.ModuleList([layers[i] for i in keep])
    try:
        yield
    finally:
        model.encoder.layer = layers


def measure_layers(
    model: Any,
    embed: Callable[[], np.ndarray],
    count: int,
    spread: tuple[int, ...],
) -> LayerChoice | None:
    """Choose ``count`` layers of ``model`` (the teacher's transformers model) by measuring.

    Args:
        embed: the teacher's sentence embeddings of the sample, computed by whatever layers
            ``model`` holds when it is called.
        spread: the evenly spread choice, measured too for the report.

    Returns:
        The choice, or None when the model's encoder layers cannot be found (not BERT-like):
        the caller keeps the even spread.
    """
    layers = encoder_layers(model)
    if layers is None:
        return None
    total = len(layers)
    reference = embed()

    def score(keep: tuple[int, ...]) -> tuple[float, float]:
        with _subset(model, layers, keep):
            cosines = row_cosines(reference, embed())
        return float(cosines.mean()), float(cosines.min())

    keep, seen, exhaustive = search_layers(total, count, score)
    mean, low = seen[keep]
    spread_mean = (seen[spread] if spread in seen else score(spread))[0]
    choice = LayerChoice(
        keep, mean, low, spread, spread_mean, len(seen), exhaustive, len(reference)
    )
    logger.info("distillation: %s", choice.describe())
    return choice
