"""Throughput and model FLOPs utilization (MFU).

MFU = model FLOPs per sample (or token) x samples (tokens) per second / device peak.
Model FLOPs count the forward and backward pass of the model as written (6 x params
per token for a dense transformer plus attention, :func:`transformer_flops_per_token`),
not recomputation, so MFU compares across implementations. Peaks are dense (no
sparsity) tensor-core figures from the vendors' data sheets; on a CPU, or an unknown
GPU, MFU is ``None`` rather than a guess.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["PEAK_FLOPS", "Throughput", "peak_flops", "transformer_flops_per_token"]

logger = logging.getLogger(__name__)

PEAK_FLOPS: dict[str, dict[str, float]] = {
    # device-name fragment -> dtype -> dense peak FLOP/s (data-sheet figures)
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H100 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12},
}


def peak_flops(device_name: str | None, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of a GPU by (a fragment of) its name, e.g. "NVIDIA H100 80GB HBM3".

    The most specific fragment wins ("H100 PCIe" before "H100"). None for CPUs and
    unknown devices.
    """
    if not device_name:
        return None
    for fragment in sorted(PEAK_FLOPS, key=len, reverse=True):
        if fragment.lower() in device_name.lower():
            return PEAK_FLOPS[fragment].get(dtype)
    return None


def current_device_peak(dtype: str = "bf16") -> float | None:
    """Peak of ``cuda:0`` if there is a GPU (scaled by SHAMAL_GPU_FRACTION), else None."""
    import os

    import torch

    if not torch.cuda.is_available():
        return None
    peak = peak_flops(torch.cuda.get_device_name(0), dtype)
    if peak is None:
        return None
    return peak * float(os.environ.get("SHAMAL_GPU_FRACTION", "1") or 1)


def transformer_flops_per_token(
    n_params: int, n_layers: int, d_model: int, seq_len: int, *, causal: bool = False
) -> float:
    """Training FLOPs per token of a decoder: 6N for the matmuls plus 12·L·d·T attention.

    (Kaplan et al. / PaLM appendix B accounting; ``causal=True`` halves the attention
    term for implementations that skip the masked half.) N excludes embeddings that
    are only looked up; pass the non-embedding count plus any output projection.
    """
    attention = 12.0 * n_layers * d_model * seq_len
    return 6.0 * n_params + (attention / 2 if causal else attention)


@dataclass
class _Window:
    start: float
    samples: int = 0
    tokens: int = 0


class Throughput:
    """Samples/s, tokens/s and MFU over the window since the last :meth:`report`.

    Args:
        flops_per_sample / flops_per_token: model FLOPs per unit (give one of them).
        peak: device peak FLOP/s; None disables MFU (e.g. CPU).
    """

    def __init__(
        self,
        *,
        flops_per_sample: float | None = None,
        flops_per_token: float | None = None,
        peak: float | None = None,
        clock: Any = time.perf_counter,
    ) -> None:
        self.flops_per_sample = flops_per_sample
        self.flops_per_token = flops_per_token
        self.peak = peak
        self._clock = clock
        self._window = _Window(clock())

    def update(self, samples: int, tokens: int = 0) -> None:
        """Count a finished step's samples (and tokens)."""
        self._window.samples += samples
        self._window.tokens += tokens

    def report(self) -> dict[str, float]:
        """Rates over the window, then start a new one. MFU only with a peak and FLOPs."""
        now = self._clock()
        window, self._window = self._window, _Window(now)
        elapsed = max(now - window.start, 1e-9)
        out = {"samples_per_s": window.samples / elapsed}
        flops = 0.0
        if window.tokens:
            out["tokens_per_s"] = window.tokens / elapsed
        if self.flops_per_token is not None:
            flops = self.flops_per_token * window.tokens
        elif self.flops_per_sample is not None:
            flops = self.flops_per_sample * window.samples
        if flops:
            out["model_flops_per_s"] = flops / elapsed
            if self.peak:
                out["mfu"] = flops / elapsed / self.peak
        return out
