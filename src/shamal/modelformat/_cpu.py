"""What CPU this is: its model and the instruction sets that decide which model variant is
fastest on it (AVX2, AVX-512, VNNI, bf16, AMX on x86; NEON, SVE, dot-product and i8mm on Arm).

The optimizer records a :class:`CpuInfo` with every variant it measures, and the model server
reads its own to pick the variant built for it. Standard library only: ``/proc/cpuinfo`` on
Linux (where the server runs), :mod:`platform` elsewhere.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shamal.errors import InvalidParameter

__all__ = ["CPU_KINDS", "CpuInfo", "host_cpu", "kind_rank", "parse_cpuinfo"]

#: Instruction sets that matter for inference, in the names Linux gives them.
ISA_FLAGS: frozenset[str] = frozenset(
    {
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        "amx_fp16",
        # Arm (``Features`` in /proc/cpuinfo)
        "asimd",
        "asimddp",
        "sve",
        "sve2",
        "i8mm",
        "bf16",
    }
)

#: CPU kinds from the most capable to the portable baseline. A kind names what a variant was
#: built and measured for; each needs every flag of its own entry.
CPU_KINDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("x86-amx", frozenset({"amx_tile", "amx_int8", "amx_bf16", "avx512_vnni", "avx512_bf16"})),
    ("x86-avx512-vnni-bf16", frozenset({"avx512f", "avx512_vnni", "avx512_bf16"})),
    ("x86-avx512-vnni", frozenset({"avx512f", "avx512_vnni"})),
    ("x86-avx512", frozenset({"avx512f"})),
    ("x86-avx2-vnni", frozenset({"avx2", "avx_vnni"})),
    ("x86-avx2", frozenset({"avx2", "fma"})),
    ("arm-sve-i8mm", frozenset({"sve", "i8mm"})),
    ("arm-neon-dot", frozenset({"asimd", "asimddp"})),
    ("arm-neon", frozenset({"asimd"})),
    ("portable", frozenset()),
)
_KIND_NAMES = tuple(name for name, _ in CPU_KINDS)
_MAX_MODEL_CHARS = 200
_CPUINFO_LIMIT = 4 << 20


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """A CPU as far as inference cares.

    Attributes:
        model: the model name the OS reports (``AMD EPYC 9R14``, ``Intel(R) Xeon(R) ...``).
        arch: ``x86_64``, ``aarch64``, ...
        isa: the inference-relevant instruction sets it has (Linux flag names).
        cores: logical CPUs the OS reports.
    """

    model: str
    arch: str
    isa: frozenset[str]
    cores: int = 0

    @property
    def kind(self) -> str:
        """The most capable :data:`CPU_KINDS` entry whose flags this CPU has."""
        return next(name for name, needs in CPU_KINDS if needs <= self.isa)

    def supports(self, needs: frozenset[str] | set[str]) -> bool:
        """Whether every instruction set in ``needs`` is here."""
        return set(needs) <= self.isa

    @property
    def native_bf16(self) -> bool:
        """bf16 matrix arithmetic in hardware (AVX-512 BF16 or AMX)."""
        return bool(self.isa & {"avx512_bf16", "amx_bf16", "bf16"})

    @property
    def native_fp16(self) -> bool:
        """fp16 arithmetic in hardware (AVX-512 FP16 or AMX-FP16)."""
        return bool(self.isa & {"avx512_fp16", "amx_fp16"})

    def describe(self) -> str:
        """One line for logs and reports: model, kind and the flags that decide it."""
        flags = " ".join(sorted(self.isa - {"sse4_2", "avx", "fma", "f16c"})) or "none"
        return f"{self.model} [{self.kind}: {flags}]"

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "arch": self.arch,
            "kind": self.kind,
            "isa": sorted(self.isa),
            "cores": self.cores,
        }

    @classmethod
    def from_json(cls, raw: object) -> CpuInfo:
        """A CPU as :meth:`to_json` writes it (``kind`` is recomputed, never trusted).

        Raises:
            InvalidParameter: any other shape.
        """
        if not isinstance(raw, dict):
            raise InvalidParameter("A CPU record must be an object.")
        model, arch, isa = raw.get("model"), raw.get("arch", ""), raw.get("isa")
        cores = raw.get("cores", 0)
        if (
            not isinstance(model, str)
            or len(model) > _MAX_MODEL_CHARS
            or not isinstance(arch, str)
            or len(arch) > 32
            or not isinstance(isa, list)
            or not all(isinstance(flag, str) for flag in isa)
            or isinstance(cores, bool)
            or not isinstance(cores, int)
        ):
            raise InvalidParameter(
                "A CPU record needs a model (text), an arch and isa (a list of flag names)."
            )
        return cls(model, arch, frozenset(isa) & ISA_FLAGS, max(cores, 0))


def kind_rank(kind: str) -> int:
    """How capable a kind is: 0 for the most capable, larger for less (unknown: portable's)."""
    return _KIND_NAMES.index(kind) if kind in _KIND_NAMES else len(_KIND_NAMES) - 1


def parse_cpuinfo(text: str, arch: str = "") -> CpuInfo:
    """A :class:`CpuInfo` from the text of ``/proc/cpuinfo`` (the first processor's entry)."""
    fields: dict[str, str] = {}
    cores = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "processor":
            cores += 1
        fields.setdefault(key, value.strip())
    model = fields.get("model name") or fields.get("cpu model") or fields.get("hardware") or ""
    if not model and "cpu implementer" in fields:
        model = f"Arm implementer {fields['cpu implementer']} part {fields.get('cpu part', '?')}"
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    model = re.sub(r"\s+", " ", model)[:_MAX_MODEL_CHARS] or (arch or "unknown CPU")
    return CpuInfo(model, arch, frozenset(flags) & ISA_FLAGS, cores)


def host_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    """This machine's CPU (``/proc/cpuinfo`` where there is one; the model name and no
    instruction sets elsewhere, which selects portable variants)."""
    arch = platform.machine() or ""
    try:
        with cpuinfo.open("r", encoding="utf-8", errors="replace") as f:
            text = f.read(_CPUINFO_LIMIT)
    except OSError:
        return CpuInfo(platform.processor() or arch or "unknown CPU", arch, frozenset(), 0)
    return parse_cpuinfo(text, arch)
