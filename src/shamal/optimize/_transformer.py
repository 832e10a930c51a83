"""Hugging Face transformer folders to ONNX.

A folder with ``config.json``, ``model.safetensors`` and ``tokenizer.json`` is built with
``transformers`` from the config and the safetensors weights only: no remote code, no pickle
(``pytorch_model.bin`` is never read). A sentence-transformers folder (``modules.json`` and
``1_Pooling/config.json``) exports as an embedding model with mean pooling over the attention
mask and L2 normalisation inside the graph.

Exporter: the TorchScript-based ``torch.onnx.export(..., dynamo=False)`` still exists in torch
2.13 and gives, for BERT-like encoders, a graph that ONNX Runtime's quantizer handles and that is
~4x faster to produce than the dynamo exporter; both were checked to give the same embeddings.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._safety import contained, sniff_format

__all__ = ["TransformerSource", "export_transformer", "is_transformer_folder"]

logger = logging.getLogger(__name__)

OPSET = 17
WEIGHTS = "model.safetensors"
_REQUIRED = ("config.json", WEIGHTS, "tokenizer.json")
INPUT_NAMES = ("input_ids", "attention_mask")


def is_transformer_folder(folder: Path) -> bool:
    """Whether ``folder`` looks like a Hugging Face model folder (by file names only; the
    weights are checked by their bytes when loaded)."""
    return all((folder / name).is_file() for name in _REQUIRED)


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _read_json(folder: Path, relpath: str) -> Any:
    path = contained(folder, relpath)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InvalidParameter(f"{relpath} is missing or is not JSON.") from None


def _sentence_pooling(folder: Path) -> tuple[bool, bool]:
    """(is a sentence-transformers embedding model, normalise) from modules.json."""
    if not (folder / "modules.json").is_file():
        return False, False
    modules = _read_json(folder, "modules.json")
    if not isinstance(modules, list):
        raise InvalidParameter("modules.json must be a list of modules.")
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    pooling = [
        m for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling")
    ]
    if not pooling:
        return False, False
    config = _read_json(folder, str(pooling[0].get("path") or "1_Pooling") + "/config.json")
    if not isinstance(config, dict) or not config.get("pooling_mode_mean_tokens"):
        raise InvalidParameter("Only mean pooling of sentence-transformers models is exported.")
    return True, any(t.endswith(".Normalize") for t in types)


@dataclass(frozen=True)
class TransformerSource:
    """A loaded transformer: the torch module to export, and what it computes."""

    module: Any  # torch.nn.Module taking (input_ids, attention_mask)
    task: str
    output_name: str
    tokenizer: Any
    hidden_size: int

    def reference(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The original model's outputs in PyTorch fp32 (the fidelity reference)."""
        import torch

        with torch.inference_mode():
            out = self.module(*(torch.from_numpy(feeds[n]) for n in INPUT_NAMES))
        return {self.output_name: out.numpy()}


def _wrap(model: Any, embedding: bool, normalize: bool) -> Any:
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask)[0]
            if not embedding:
                return cast(torch.Tensor, hidden)
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return cast(torch.Tensor, pooled)

    return Encoder().eval()


def load_transformer(folder: Path) -> TransformerSource:
    """Build the torch model of a transformer folder from config.json + safetensors.

    Raises:
        InvalidParameter: weights that are not safetensors by their bytes (a pickle named
            ``model.safetensors``), or a config transformers cannot build without remote code.
    """
    _offline()
    folder = Path(folder).resolve()
    weights = contained(folder, WEIGHTS)
    kind = sniff_format(weights)
    if kind != "safetensors":
        raise InvalidParameter(f"{WEIGHTS} is not a safetensors file (its bytes look like {kind}).")
    embedding, normalize = _sentence_pooling(folder)
    from tokenizers import Tokenizer
    from transformers import AutoModel

    try:
        # A local folder, never the hub (offline, no remote code).
        model = AutoModel.from_pretrained(  # nosec B615
            str(folder), use_safetensors=True, trust_remote_code=False, local_files_only=True
        )
        tokenizer = Tokenizer.from_file(str(contained(folder, "tokenizer.json")))
    except (OSError, ValueError) as exc:
        logger.info("transformer load failed: %r", exc)
        raise InvalidParameter("The transformer folder could not be loaded.") from None
    return TransformerSource(
        module=_wrap(model.eval(), embedding, normalize),
        task="embedding" if embedding else "other",
        output_name="sentence_embedding" if embedding else "last_hidden_state",
        tokenizer=tokenizer,
        hidden_size=int(model.config.hidden_size),
    )


def export_transformer(source: TransformerSource) -> Any:
    """The ONNX graph (opset 17, dynamic batch and sequence axes) of a loaded transformer."""
    import onnx
    import torch

    dummy = torch.ones((2, 16), dtype=torch.int64)
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES}
    axes[source.output_name] = (
        {0: "batch"}
        if source.task == "embedding"
        else {
            0: "batch",
            1: "sequence",
        }
    )
    with tempfile.TemporaryDirectory(prefix="shamal-export-") as tmp, warnings.catch_warnings():
        # The exporter warns about tracing details of transformers' attention code.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            source.module,
            (dummy, dummy),
            str(Path(tmp) / "model.onnx"),
            input_names=list(INPUT_NAMES),
            output_names=[source.output_name],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
        graph = onnx.load_model(str(Path(tmp) / "model.onnx"))
    # The tracer leaves the hidden dimension symbolic; it is fixed by the config.
    dims = graph.graph.output[0].type.tensor_type.shape.dim
    dims[-1].Clear()
    dims[-1].dim_value = source.hidden_size
    return graph


def tokenize(tokenizer: Any, texts: list[str], length: int) -> dict[str, np.ndarray]:
    """``input_ids`` and ``attention_mask`` padded or truncated to exactly ``length`` tokens."""
    tok = tokenizer.__class__.from_str(tokenizer.to_str())  # a copy: padding is tokenizer state
    padding = tok.padding or {}
    tok.enable_truncation(max_length=length)
    tok.enable_padding(
        length=length,
        pad_id=int(padding.get("pad_id", 0)),
        pad_token=str(padding.get("pad_token", "[PAD]")),
    )
    encoded = tok.encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
    }


def probe_sentences(count: int) -> list[str]:
    """A fixed, generated set of sentences for the default fidelity check."""
    subjects = (
        "The report",
        "A new library",
        "Our kitchen",
        "The storm",
        "My manager",
        "This proof",
        "The orchestra",
        "An old map",
    )
    verbs = ("describes", "ignores", "improves", "delays", "explains", "follows")
    objects = (
        "the budget for next year",
        "a quiet street at dusk",
        "the failing test",
        "three hungry cats",
        "the road to the harbour",
        "an unusual chess opening",
        "the results of the survey",
    )
    out = [f"{s} {v} {o}." for s in subjects for v in verbs for o in objects]
    return out[:count]
