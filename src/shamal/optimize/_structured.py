"""Structured pruning: whole attention heads, feed-forward neurons, dense units and
convolution channels are removed, so the weight matrices shrink and the model runs faster on
any runtime (zeroed weights, as :func:`shamal.optimize._variants.prune_magnitude` leaves them,
cost ONNX Runtime's CPU kernels exactly as much as non-zero ones).

Two entry points:

- :func:`prune_transformer` works on the PyTorch module of a BERT-family encoder before it is
  exported. A unit's importance is the error its removal adds to its layer's output, measured
  on calibration inputs: for an FFN neuron, the variance of its activation times the squared
  norm of its output weights; for a head, the variance of its projected output. The lowest
  fraction in each layer goes, and the layer that read the removed units is refitted on the
  same inputs (ridge least squares towards its old weights, free bias), so its output changes
  as little as it can. No training happens: past ~10% of MiniLM's units the embeddings drift
  below the fidelity gate (``bench/prune_cpu.py`` measures it); fine-tuning or distillation
  is what recovers more.
- :func:`prune_onnx_units` works on an ONNX graph: hidden units between two weight layers
  joined only by elementwise activations (``MatMul``/``Gemm`` (+ ``Add`` bias) -> ``Relu`` ->
  ``MatMul``/``Gemm``; ``Conv`` -> ``Relu`` (-> pooling) -> ``Conv``). With no data at hand a
  unit's importance is the product of the norms of its incoming and outgoing weights (the
  product, unlike the sum, does not change when a unit's in-weights are scaled up and its
  out-weights down). Anything it cannot prove safe is left as it is: a shared weight, an
  intermediate tensor read twice or returned, grouped convolutions, unknown ops on the path.
"""

from __future__ import annotations

import copy
import logging
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shamal.errors import InvalidParameter
from shamal.optimize._measure import Timing
from shamal.optimize._transformer import INPUT_NAMES, TransformerSource

__all__ = [
    "PruneSummary",
    "count_parameters",
    "latency_ratio",
    "prune_onnx_units",
    "prune_transformer",
]

logger = logging.getLogger(__name__)

#: Ridge strength of the least-squares refit, relative to the mean input second moment. On
#: MiniLM with 128 calibration sentences (~1,300 tokens for 1,536 FFN inputs) a plain least-squares
#: fit overfits (cosine mean 0.94 at 10% pruned, vs 0.98 with this ridge); a much stronger one is
#: the mean correction alone and gives about the same.
RIDGE = 0.3
HEADS = "attention heads"
NEURONS = "FFN neurons"
DENSE = "dense units"
CHANNELS = "conv channels"

#: Elementwise ops with one input: a hidden unit's value depends on that unit only.
_ELEMENTWISE = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Elu",
        "Selu",
        "Celu",
        "Softplus",
        "Softsign",
        "Gelu",
        "Mish",
        "ThresholdedRelu",
        "Identity",
    }
)
#: Per-channel ops of a convolutional path (pooling keeps channels apart).
_PER_CHANNEL = _ELEMENTWISE | {"MaxPool", "AveragePool", "LpPool"}


@dataclass(frozen=True, slots=True)
class PruneSummary:
    """What structured pruning removed.

    Attributes:
        fraction: the fraction of units asked for, per layer.
        removed: (kind, removed, total) per kind of unit (attention heads, FFN neurons, dense
            units, conv channels); a kind with no prunable layer is absent.
        params_before: float parameters before pruning.
        params_after: float parameters after.
    """

    fraction: float
    removed: tuple[tuple[str, int, int], ...]
    params_before: int
    params_after: int

    @property
    def changed(self) -> bool:
        return any(count for _, count, _ in self.removed)

    def describe(self) -> str:
        """One line for a variant's note."""
        if not self.changed:
            return "structured: no prunable heads, neurons or channels found"
        parts = ", ".join(f"{kind} {count}/{total}" for kind, count, total in self.removed)
        return (
            f"structured: removed {parts}; parameters {_millions(self.params_before)} -> "
            f"{_millions(self.params_after)}"
        )


def _millions(count: int) -> str:
    return f"{count / 1e6:.2f}M" if count >= 100_000 else str(count)


def _check_fraction(fraction: float) -> None:
    if not 0.0 < fraction < 1.0:
        raise InvalidParameter("--prune-structured takes a fraction between 0 and 1 (e.g. 0.3).")


def _to_remove(units: int, fraction: float) -> int:
    """How many of ``units`` go: the floor of the fraction, always keeping one."""
    return max(0, min(math.floor(units * fraction + 1e-9), units - 1))


def latency_ratio(baseline: Sequence[Timing], timings: Sequence[Timing]) -> float | None:
    """The geometric mean of ``timings``' p50 over ``baseline``'s at the (batch, threads)
    points both measured (below 1: faster); None when they share none."""
    base = {(t.batch, t.threads): t.p50_ms for t in baseline if t.p50_ms > 0}
    ratios = [
        t.p50_ms / base[(t.batch, t.threads)]
        for t in timings
        if (t.batch, t.threads) in base and t.p50_ms > 0
    ]
    if not ratios:
        return None
    return float(math.exp(sum(math.log(r) for r in ratios) / len(ratios)))


# ---------------------------------------------------------------------- ONNX graphs
def count_parameters(model: Any) -> int:
    """Elements of the float initializers of an ONNX model (its weights)."""
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    return sum(math.prod(t.dims) for t in model.graph.initializer if t.data_type in floats)


@dataclass
class _Chain:
    """Hidden units between two weight layers: where their weights sit, by axis."""

    kind: str
    units: int
    weights_in: tuple[str, int]  # initializer, axis of the units
    bias_in: tuple[str, int] | None
    weights_out: tuple[str, int]
    tensors: list[str] = field(default_factory=list)  # intermediate tensors (shapes change)


class _Graph:
    """Indexes of an ONNX graph for finding chains."""

    def __init__(self, graph: Any, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.uses = Counter(_all_inputs(graph))
        self.outputs = {o.name for o in graph.output}
        # An initializer also declared as a graph input (old IR versions) can be fed by the
        # caller with its declared shape: it is not ours to shrink.
        self.inputs = {i.name for i in graph.input}

    def sole_consumer(self, tensor: str) -> Any | None:
        """The one node reading ``tensor`` (subgraphs counted), if it is not a graph output."""
        found = self.consumers.get(tensor, [])
        if len(found) != 1 or self.uses[tensor] != 1 or tensor in self.outputs:
            return None
        return found[0]

    def weight(self, name: str, ndim: tuple[int, ...]) -> np.ndarray | None:
        """The float initializer ``name`` with one of ``ndim`` dimensions, used once."""
        array = self.arrays.get(name)
        if array is None or array.dtype.kind != "f" or array.ndim not in ndim:
            return None
        return array if self.uses[name] == 1 and name not in self.inputs else None


def _all_inputs(graph: Any) -> Iterator[str]:
    """Every tensor name read by a node, subgraphs (If, Loop, Scan bodies) included."""
    for node in graph.node:
        yield from node.input
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _all_inputs(sub)


def _attr(node: Any, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def _producer(node: Any, g: _Graph) -> _Chain | None:
    """The chain a weight node starts (its weight and units), before following its output."""
    if len(node.input) < 2:
        return None
    bias = node.input[2] if len(node.input) > 2 else ""
    ndim: tuple[int, ...]
    if node.op_type in ("MatMul", "Gemm"):
        kind, ndim = DENSE, (2,)
        axis = 0 if node.op_type == "Gemm" and _attr(node, "transB", 0) else 1
    elif node.op_type == "Conv" and _attr(node, "group", 1) == 1:
        kind, ndim, axis = CHANNELS, (3, 4, 5), 0
    else:
        return None
    w = g.weight(node.input[1], ndim)
    if w is None:
        return None
    chain = _Chain(kind, w.shape[axis], (node.input[1], axis), None, ("", 0))
    return _with_bias(chain, bias, g)


def _with_bias(chain: _Chain, name: str, g: _Graph) -> _Chain | None:
    """``chain`` with its bias ``name`` (a vector, or a row for Gemm/Add), if it has one."""
    if not name:
        return chain
    bias = g.weight(name, (1, 2, 3))
    if bias is None or bias.shape[-1] != chain.units or bias.size != chain.units:
        return None
    chain.bias_in = (name, bias.ndim - 1)
    return chain


def _follow(node: Any, chain: _Chain, g: _Graph) -> Any | None:
    """Walk from ``node``'s output through a bias Add and per-unit ops to the node that reads
    the hidden units; record the tensors on the way. None when the path is not provably
    per-unit."""
    tensor = node.output[0]
    allowed = _ELEMENTWISE if chain.kind == DENSE else _PER_CHANNEL
    while True:
        chain.tensors.append(tensor)
        nxt = g.sole_consumer(tensor)
        if nxt is None:
            return None
        if nxt.op_type == "Add" and chain.bias_in is None and chain.kind == DENSE:
            other = nxt.input[1] if nxt.input[0] == tensor else nxt.input[0]
            if _with_bias(chain, other, g) is None:
                return None
        elif nxt.op_type not in allowed or len(nxt.input) != 1 or nxt.input[0] != tensor:
            return nxt
        if len([o for o in nxt.output if o]) != 1:
            return None
        tensor = nxt.output[0]


def _consumer(node: Any, chain: _Chain, g: _Graph) -> bool:
    """Whether ``node`` reads the hidden units as its data input; sets ``weights_out``."""
    if len(node.input) < 2 or node.input[0] != chain.tensors[-1]:
        return False
    if chain.kind == DENSE and node.op_type == "MatMul":
        w, axis = g.weight(node.input[1], (2,)), 0
    elif chain.kind == DENSE and node.op_type == "Gemm" and not _attr(node, "transA", 0):
        w, axis = g.weight(node.input[1], (2,)), 1 if _attr(node, "transB", 0) else 0
    elif chain.kind == CHANNELS and node.op_type == "Conv" and _attr(node, "group", 1) == 1:
        w, axis = g.weight(node.input[1], (3, 4, 5)), 1
    else:
        return False
    if w is None or w.shape[axis] != chain.units:
        return False
    chain.weights_out = (node.input[1], axis)
    return True


def _chains(graph: Any, arrays: dict[str, np.ndarray]) -> list[_Chain]:
    g = _Graph(graph, arrays)
    found = []
    for node in graph.node:
        chain = _producer(node, g)
        if chain is None or chain.units < 2:
            continue
        end = _follow(node, chain, g)
        if end is not None and _consumer(end, chain, g):
            found.append(chain)
    return found


def _unit_norms(array: np.ndarray, axis: int) -> np.ndarray:
    moved = np.moveaxis(array.astype(np.float64), axis, 0)
    norms: np.ndarray = np.sqrt((moved.reshape(len(moved), -1) ** 2).sum(axis=1))
    return norms


def _prune_chain(chain: _Chain, arrays: dict[str, np.ndarray], fraction: float) -> int:
    """Shrink the chain's weights (in ``arrays``) to its most important units; the count
    removed."""
    name_in, axis_in = chain.weights_in
    name_out, axis_out = chain.weights_out
    incoming = _unit_norms(arrays[name_in], axis_in) ** 2
    if chain.bias_in is not None:
        incoming = incoming + _unit_norms(arrays[chain.bias_in[0]], chain.bias_in[1]) ** 2
    score = np.sqrt(incoming) * _unit_norms(arrays[name_out], axis_out)
    drop = _to_remove(chain.units, fraction)
    if drop == 0:
        return 0
    keep = np.sort(np.argsort(score, kind="stable")[drop:])
    for name, axis in (chain.weights_in, chain.bias_in or ("", 0), chain.weights_out):
        if name:
            arrays[name] = np.ascontiguousarray(np.take(arrays[name], keep, axis=axis))
    return drop


def prune_onnx_units(model: Any, fraction: float) -> tuple[Any, PruneSummary]:
    """Remove the least important ``fraction`` of the hidden units of each prunable dense or
    convolutional pair of layers in an ONNX graph (see the module docstring).

    Returns:
        (a new, smaller model, what was removed); the model is unchanged in content when
        nothing could be pruned safely.

    Raises:
        InvalidParameter: ``fraction`` not strictly between 0 and 1.
    """
    import onnx
    from onnx import numpy_helper

    _check_fraction(fraction)
    pruned = onnx.ModelProto()
    pruned.CopyFrom(model)
    graph = pruned.graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    totals: Counter[str] = Counter()
    removed: Counter[str] = Counter()
    changed: set[str] = set()
    for chain in _chains(graph, arrays):
        drop = _prune_chain(chain, arrays, fraction)
        totals[chain.kind] += chain.units
        removed[chain.kind] += drop
        if drop:
            changed.update(chain.tensors)
            names = (chain.weights_in[0], chain.weights_out[0])
            for name in (*names, chain.bias_in[0] if chain.bias_in else ""):
                if name:
                    _replace_initializer(graph, arrays[name], name)
    # The intermediate tensors' recorded shapes no longer hold; the runtime infers them.
    kept = [v for v in graph.value_info if v.name not in changed]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    summary = PruneSummary(
        fraction,
        tuple((kind, removed[kind], totals[kind]) for kind in (DENSE, CHANNELS) if totals[kind]),
        count_parameters(model),
        count_parameters(pruned),
    )
    return pruned, summary


def _replace_initializer(graph: Any, array: np.ndarray, name: str) -> None:
    from onnx import numpy_helper

    for tensor in graph.initializer:
        if tensor.name == name:
            tensor.CopyFrom(numpy_helper.from_array(array, name))
            return


# ---------------------------------------------------------------------- transformer encoders
@dataclass(frozen=True)
class _Block:
    """The prunable parts of one BERT-family layer."""

    attention: Any  # the self-attention module (query, key, value)
    attention_out: Any  # nn.Linear: heads -> hidden
    ffn_in: Any  # nn.Linear: hidden -> intermediate
    ffn_out: Any  # nn.Linear: intermediate -> hidden
    owner_attention: Any  # the module holding ``attention`` (as ``.self``)
    owner_ffn: tuple[Any, Any]  # (the layer's ``intermediate``, its ``output``)


def _blocks(model: Any) -> list[_Block]:
    """The BERT-layout layers of ``model`` (attention.self.query/key/value, attention.output
    .dense, intermediate.dense, output.dense), self-attention only; others are not touched."""
    import torch

    found = []
    for layer in model.modules():
        attention = getattr(getattr(layer, "attention", None), "self", None)
        names = ("query", "key", "value")
        linears: list[Any] = [getattr(attention, n, None) for n in names]
        parts = [
            getattr(getattr(layer.attention, "output", None), "dense", None) if attention else None,
            getattr(getattr(layer, "intermediate", None), "dense", None),
            getattr(getattr(layer, "output", None), "dense", None),
        ]
        if not all(isinstance(m, torch.nn.Linear) for m in (*linears, *parts)):
            continue
        heads = int(getattr(attention, "num_attention_heads", 0))
        size = int(getattr(attention, "attention_head_size", 0))
        if heads < 1 or any(m.out_features != heads * size for m in linears):
            continue
        if getattr(layer, "add_cross_attention", False) or getattr(layer, "is_decoder", False):
            continue
        owner_ffn = (layer.intermediate, layer.output)
        found.append(_Block(attention, parts[0], parts[1], parts[2], layer.attention, owner_ffn))
    return found


class _Stats:
    """Second moments of a linear layer's inputs over the real (unmasked) tokens: the sum of
    ``[x, 1] [x, 1]^T``, which holds the token count, the mean and the covariance."""

    def __init__(self) -> None:
        self.gram: Any = None

    def add(self, x: Any) -> None:
        import torch

        ext = torch.cat([x, torch.ones((len(x), 1), dtype=x.dtype)], dim=1)
        gram = ext.T @ ext
        self.gram = gram if self.gram is None else self.gram + gram

    @property
    def moments(self) -> Any:
        """``E[[x, 1] [x, 1]^T]``."""
        return self.gram / self.gram[-1, -1].clamp(min=1.0)

    @property
    def covariance(self) -> Any:
        second = self.moments
        mean = second[-1, :-1]
        return second[:-1, :-1] - mean.unsqueeze(1) * mean.unsqueeze(0)


def _calibrate(
    module: Any, blocks: list[_Block], feeds: Mapping[str, np.ndarray], batch: int = 32
) -> list[tuple[_Stats, _Stats]]:
    """(heads' concatenated outputs, FFN activations) statistics of each block."""
    import torch

    mask: dict[str, Any] = {}
    stats = [(_Stats(), _Stats()) for _ in blocks]

    def observe(into: _Stats) -> Any:
        def hook(_module: Any, args: Any) -> None:
            into.add(args[0][mask["tokens"]].double())  # [real tokens, features]

        return hook

    hooks = [
        linear.register_forward_pre_hook(observe(into))
        for block, pair in zip(blocks, stats, strict=True)
        for linear, into in zip((block.attention_out, block.ffn_out), pair, strict=True)
    ]
    rows = len(feeds[INPUT_NAMES[0]])
    # Padding (on the right) is masked out of attention: trimming it changes no real token.
    width = max(1, int(np.asarray(feeds[INPUT_NAMES[1]]).sum(axis=1).max()))
    try:
        with torch.inference_mode():
            for start in range(0, rows, batch):
                chunk = [
                    torch.from_numpy(np.ascontiguousarray(feeds[n][start : start + batch, :width]))
                    for n in INPUT_NAMES
                ]
                mask["tokens"] = chunk[1].bool()
                module(*chunk)
    finally:
        for hook in hooks:
            hook.remove()
    return stats


def _linear(weight: Any, bias: Any | None, like: Any) -> Any:
    """A new nn.Linear with ``weight`` [out, in] and ``bias``, in ``like``'s dtype."""
    import torch

    out = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    out = out.to(dtype=like.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(weight)
        if bias is not None:
            out.bias.copy_(bias)
    return out


def _rows(layer: Any, index: Any) -> Any:
    """``layer`` keeping only the outputs ``index``."""
    bias = layer.bias.detach()[index] if layer.bias is not None else None
    return _linear(layer.weight.detach()[index], bias, layer)


def _refit(layer: Any, kept: Any, stats: _Stats) -> Any:
    """``layer`` reading only its inputs ``kept``, its weights and bias refitted so that its
    output on the calibration tokens changes as little as it can, with a ridge pull towards
    the original weights (the bias is free):
    ``[W' b'] = ([W b] M[:, K] + P [W b][:, K]) (M[K, K] + P)^-1``, ``M = E[[x, 1] [x, 1]^T]``,
    ``K`` the kept inputs plus the constant, ``P`` the ridge on the weights only."""
    import torch

    moments = stats.moments
    index = torch.cat([kept, torch.tensor([moments.shape[0] - 1])])
    bias = layer.bias.detach() if layer.bias is not None else torch.zeros(layer.out_features)
    full = torch.cat([layer.weight.detach().double(), bias.double().unsqueeze(1)], dim=1)
    inner = moments[index][:, index]
    scale = float(torch.diagonal(inner)[:-1].mean().clamp(min=1e-12))
    penalty = torch.full((len(index),), RIDGE * scale, dtype=inner.dtype)
    penalty[-1] = 0.0
    target = full @ moments[:, index] + full[:, index] * penalty  # [out, kept + 1]
    fitted = torch.linalg.solve(inner + torch.diag(penalty), target.T).T
    return _linear(fitted[:, :-1], fitted[:, -1], layer)


def _keep(scores: Any, drop: int) -> Any:
    """Indices of all but the ``drop`` lowest ``scores``, in order."""
    import torch

    order = torch.argsort(scores, stable=True)
    return torch.sort(order[drop:]).values


def _prune_heads(block: _Block, stats: _Stats, fraction: float) -> tuple[int, int]:
    import torch

    attention = block.attention
    heads, size = attention.num_attention_heads, attention.attention_head_size
    drop = _to_remove(heads, fraction)
    if drop == 0:
        return 0, heads
    # A head's importance: the variance of its share of the projected output.
    weight = block.attention_out.weight.detach().double()
    cov = stats.covariance
    score = torch.stack(
        [
            ((w @ cov[c][:, c]) * w).sum()
            for c in (torch.arange(h * size, (h + 1) * size) for h in range(heads))
            for w in [weight[:, c]]
        ]
    )
    kept_heads = _keep(score, drop)
    columns = (kept_heads.unsqueeze(1) * size + torch.arange(size)).reshape(-1)
    for name in ("query", "key", "value"):
        setattr(attention, name, _rows(getattr(attention, name), columns))
    block.owner_attention.output.dense = _refit(block.attention_out, columns, stats)
    attention.num_attention_heads = heads - drop
    attention.all_head_size = (heads - drop) * size
    return drop, heads


def _prune_ffn(block: _Block, stats: _Stats, fraction: float) -> tuple[int, int]:
    units = block.ffn_in.out_features
    drop = _to_remove(units, fraction)
    if drop == 0:
        return 0, units
    # A neuron's importance: its activation's variance times its output weights' norm.
    variance = stats.covariance.diagonal().clamp(min=0)
    kept = _keep(variance * (block.ffn_out.weight.detach().double() ** 2).sum(0), drop)
    intermediate, output = block.owner_ffn
    intermediate.dense = _rows(block.ffn_in, kept)
    output.dense = _refit(block.ffn_out, kept, stats)
    return drop, units


def prune_transformer(
    source: TransformerSource, fraction: float, calibration: Mapping[str, np.ndarray]
) -> tuple[TransformerSource, PruneSummary]:
    """A copy of ``source`` with ``fraction`` of the attention heads and of the FFN neurons of
    each BERT-family layer removed (at least one head is kept per layer), chosen and
    bias-compensated on ``calibration`` (``input_ids`` and ``attention_mask`` arrays); the
    original module is not changed. Export the result with ``export_transformer``.

    Raises:
        InvalidParameter: ``fraction`` not strictly between 0 and 1, or calibration arrays
            without the encoder's inputs.
    """
    _check_fraction(fraction)
    if any(n not in calibration for n in INPUT_NAMES) or not len(calibration[INPUT_NAMES[0]]):
        raise InvalidParameter("Structured pruning needs input_ids and attention_mask rows.")
    module = copy.deepcopy(source.module).eval()
    before = sum(p.numel() for p in module.parameters())
    blocks = _blocks(module)
    stats = _calibrate(module, blocks, calibration)
    heads = [_prune_heads(b, s[0], fraction) for b, s in zip(blocks, stats, strict=True)]
    ffn = [_prune_ffn(b, s[1], fraction) for b, s in zip(blocks, stats, strict=True)]
    after = sum(p.numel() for p in module.parameters())
    removed = (
        (HEADS, sum(d for d, _ in heads), sum(t for _, t in heads)),
        (NEURONS, sum(d for d, _ in ffn), sum(t for _, t in ffn)),
    )
    summary = PruneSummary(fraction, removed if blocks else (), before, after)
    logger.info("pruned transformer: %s", summary.describe())
    return replace(source, module=module), summary
