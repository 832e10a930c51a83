"""What the optimizer reports: each variant's fidelity and timings, and the chosen set."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from shamal.modelformat import CpuInfo
from shamal.optimize._measure import Fidelity, Timing

__all__ = ["ChosenSet", "OptimizeReport", "VariantReport"]


@dataclass(frozen=True)
class VariantReport:
    """One variant: where it was written, how faithful and how fast it is."""

    name: str
    folder: Path
    size_bytes: int
    fidelity: Fidelity
    timings: tuple[Timing, ...]
    provider: str
    note: str = ""

    @property
    def verdict(self) -> str:
        return "BLOCKED" if self.fidelity.blocked else "OK"

    def timing(self, batch: int, threads: int) -> Timing | None:
        return next((t for t in self.timings if (t.batch, t.threads) == (batch, threads)), None)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (NaN becomes null)."""
        fidelity = {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in asdict(self.fidelity).items()
        }
        return {
            "name": self.name,
            "folder": str(self.folder),
            "size_bytes": self.size_bytes,
            "verdict": self.verdict,
            "fidelity": fidelity,
            "timings": [asdict(t) for t in self.timings],
            "provider": self.provider or None,
            "note": self.note,
        }


@dataclass(frozen=True)
class OptimizeReport:
    """Every variant built, the requested one last (``kind``: sklearn, transformer, torch or
    onnx)."""

    source: str
    kind: str
    task: str
    variants: tuple[VariantReport, ...]

    chosen: ChosenSet | None = None
    skipped: tuple[str, ...] = ()

    @property
    def candidate(self) -> VariantReport:
        """The requested variant; with ``choose``, the one chosen (its folder: the set)."""
        if self.chosen is not None:
            return self.chosen.as_variant()
        return self.variants[-1]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "task": self.task,
            "candidate": self.candidate.name,
            "variants": [v.to_json() for v in self.variants],
            **({"chosen": self.chosen.to_json()} if self.chosen is not None else {}),
            **({"skipped": list(self.skipped)} if self.skipped else {}),
        }


@dataclass(frozen=True)
class ChosenSet:
    """The fastest variant that passed, written as a variant set with a portable build.

    Attributes:
        winner: the chosen variant's report (its own folder, as built).
        folder: the variant set (``shamal-variants.json``, the winner's folder for this CPU's
            kind, ``portable/``, and any builds kept from ``merge``).
        cpu: the CPU it was measured on.
        portable: the variant copied as the portable build.
        kept: CPU kinds whose builds came from the merged set.
        why: one line on how it won (score and the runner-up).
    """

    winner: VariantReport
    folder: Path
    cpu: CpuInfo
    portable: str
    kept: tuple[str, ...] = ()
    why: str = ""

    def as_variant(self) -> VariantReport:
        """The winner's report with the set as its folder (what gets registered)."""
        return replace(self.winner, folder=self.folder)

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.winner.name,
            "folder": str(self.folder),
            "cpu": self.cpu.to_json(),
            "portable": self.portable,
            "kept": list(self.kept),
            "why": self.why,
        }
