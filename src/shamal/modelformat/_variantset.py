"""A variant set: one model, several builds, each measured fastest on a kind of CPU.

``shamal optimize --choose`` measures every candidate on the CPU it runs on and keeps the fastest
that passes the fidelity gate; run again on another kind of CPU (``--merge``), it adds that CPU's
winner to the set. The model server loads the build made for its own CPU, or the portable one.
The folder::

    shamal-variants.json
    portable/            a model folder every CPU runs (ONNX Runtime)
    x86-avx512-vnni-bf16/  a model folder (any format), built and measured on such a CPU

and the manifest::

    {"schema": 1, "portable": "portable",
     "variants": [{"path": "x86-avx512-vnni-bf16", "variant": "openvino-int8",
                   "cpu": {"model": "AMD EPYC 9R14", "arch": "x86_64",
                           "kind": "x86-avx512-vnni-bf16", "isa": ["avx2", ...], "cores": 2},
                   "figures": {"p50_ms_b1": 3.4, "cosine_min": 0.987}}]}

Read as hostile input like every model file: size-capped, key by key, every path a folder inside
the set, and the CPU ``kind`` recomputed from its flags, never trusted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shamal.errors import InvalidParameter
from shamal.modelformat._cpu import CpuInfo, kind_rank
from shamal.modelformat._format import MANIFEST, contained

__all__ = [
    "VARIANTS_MANIFEST",
    "VariantChoice",
    "VariantEntry",
    "VariantSet",
    "is_variant_set",
    "pick_variant",
    "read_variant_set",
    "write_variant_set",
]

VARIANTS_MANIFEST = "shamal-variants.json"
_MAX_BYTES = 1 << 20
_MAX_ENTRIES = 64
_MAX_FIGURES = 64
_KEYS = frozenset({"schema", "portable", "variants"})
_ENTRY_KEYS = frozenset({"path", "variant", "cpu", "figures"})


@dataclass(frozen=True, slots=True)
class VariantEntry:
    """One build in a set: its folder (relative), the variant it is, and the CPU it won on."""

    path: str
    variant: str
    cpu: CpuInfo
    figures: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "variant": self.variant,
            "cpu": self.cpu.to_json(),
            "figures": dict(self.figures),
        }


@dataclass(frozen=True, slots=True)
class VariantSet:
    """Builds by CPU kind, and the portable build that any CPU loads."""

    portable: str
    variants: tuple[VariantEntry, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "portable": self.portable,
            "variants": [entry.to_json() for entry in self.variants],
        }


@dataclass(frozen=True, slots=True)
class VariantChoice:
    """What a server loads from a set, and why (said in its log and its model metadata)."""

    path: str
    variant: str
    reason: str


def is_variant_set(folder: Path) -> bool:
    """Whether ``folder`` holds a variant set manifest."""
    return (folder / VARIANTS_MANIFEST).is_file()


def _figures(raw: object) -> dict[str, float]:
    if raw is None:
        return {}
    if (
        not isinstance(raw, dict)
        or len(raw) > _MAX_FIGURES
        or not all(
            isinstance(k, str)
            and len(k) <= 64
            and isinstance(v, int | float)
            and not isinstance(v, bool)
            and math.isfinite(v)
            for k, v in raw.items()
        )
    ):
        raise InvalidParameter(f"{VARIANTS_MANIFEST}: figures must map names to finite numbers.")
    return {k: float(v) for k, v in raw.items()}


def _member(folder: Path, relpath: object) -> str:
    target = contained(folder, relpath)
    if not (target.is_dir() and (target / MANIFEST).is_file()):
        raise InvalidParameter(
            f"{VARIANTS_MANIFEST} names {relpath!r}, which is not a model folder in the set."
        )
    return str(relpath)


def _entry(folder: Path, raw: object) -> VariantEntry:
    if not isinstance(raw, dict) or set(raw) - _ENTRY_KEYS or not {"path", "cpu"} <= set(raw):
        raise InvalidParameter(f"{VARIANTS_MANIFEST}: a variant needs path and cpu, and no more.")
    variant = raw.get("variant", "")
    if not isinstance(variant, str) or len(variant) > 200:
        raise InvalidParameter(f"{VARIANTS_MANIFEST}: a variant's name must be text.")
    return VariantEntry(
        _member(folder, raw["path"]),
        variant,
        CpuInfo.from_json(raw["cpu"]),
        _figures(raw.get("figures")),
    )


def read_variant_set(folder: Path) -> VariantSet:
    """Read and check ``folder``'s ``shamal-variants.json``.

    Raises:
        InvalidParameter: missing, over 1 MiB, not JSON, not schema 1, unknown keys, more than
            64 variants, or a path that is not a model folder inside the set.
    """
    path = folder / VARIANTS_MANIFEST
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise InvalidParameter(f"{VARIANTS_MANIFEST} is too large.")
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        raise InvalidParameter(f"{VARIANTS_MANIFEST} is missing or is not JSON.") from None
    if not isinstance(raw, dict) or raw.get("schema") != 1 or set(raw) - _KEYS:
        raise InvalidParameter(
            f"{VARIANTS_MANIFEST} must be an object with schema 1, portable and variants."
        )
    entries = raw.get("variants", [])
    if not isinstance(entries, list) or len(entries) > _MAX_ENTRIES:
        raise InvalidParameter(f"{VARIANTS_MANIFEST}: variants must be a list of at most 64.")
    return VariantSet(
        _member(folder, raw.get("portable")), tuple(_entry(folder, item) for item in entries)
    )


def write_variant_set(folder: Path, variants: VariantSet) -> None:
    """Write the manifest of a set whose member folders are already in ``folder``."""
    (folder / VARIANTS_MANIFEST).write_text(json.dumps(variants.to_json(), indent=2) + "\n")


def pick_variant(variants: VariantSet, host: CpuInfo) -> VariantChoice:
    """The build this CPU should load.

    In order: a build won on this very kind of CPU (the same model first); else the build for
    the most capable kind whose instruction sets this CPU all has; else the portable build.
    """
    same_arch = [v for v in variants.variants if not v.cpu.arch or v.cpu.arch == host.arch]
    exact = [v for v in same_arch if v.cpu.kind == host.kind]
    exact.sort(key=lambda v: v.cpu.model != host.model)
    if exact:
        best = exact[0]
        return VariantChoice(
            best.path, best.variant, f"built for this CPU kind ({best.cpu.describe()})"
        )
    runnable = [v for v in same_arch if host.supports(v.cpu.isa)]
    runnable.sort(key=lambda v: kind_rank(v.cpu.kind))
    if runnable:
        best = runnable[0]
        return VariantChoice(
            best.path,
            best.variant,
            f"built for {best.cpu.kind}, whose instruction sets this CPU has "
            f"({best.cpu.describe()})",
        )
    kinds = ", ".join(sorted({v.cpu.kind for v in variants.variants})) or "none"
    return VariantChoice(
        variants.portable,
        "portable",
        f"no build for this CPU's kind ({host.kind}; the set has: {kinds}): the portable one",
    )
