"""What CPU this is, which build of a variant set it loads, and the checks on variant sets and
OpenVINO graphs read as hostile input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shamal.errors import InvalidParameter
from shamal.modelformat import (
    VARIANTS_MANIFEST,
    CpuInfo,
    VariantEntry,
    VariantSet,
    check_openvino_ir,
    host_cpu,
    parse_cpuinfo,
    pick_variant,
    read_variant_set,
    write_variant_set,
)

# /proc/cpuinfo entries as these CPUs print them (flags trimmed to the ones that matter and a
# few that do not).
_AMX_FLAGS = (
    "fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx_vnni avx512_bf16 "
    "avx512_fp16 amx_bf16 amx_tile amx_int8"
)
SAPPHIRE_RAPIDS = "".join(
    f"processor\t: {n}\nvendor_id\t: GenuineIntel\n"
    f"model name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: {_AMX_FLAGS}\n\n"
    for n in range(2)
)
GENOA = """processor\t: 0
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx_vnni
"""
CASCADE_LAKE = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni
"""
ROME = """processor\t: 0
model name\t: AMD EPYC 7R32
flags\t\t: fpu sse4_2 avx avx2 fma f16c
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimddp sve i8mm bf16
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


@pytest.mark.parametrize(
    ("text", "arch", "kind"),
    [
        (SAPPHIRE_RAPIDS, "x86_64", "x86-amx"),
        (GENOA, "x86_64", "x86-avx512-vnni-bf16"),
        (CASCADE_LAKE, "x86_64", "x86-avx512-vnni"),
        (ROME, "x86_64", "x86-avx2"),
        (GRAVITON3, "aarch64", "arm-sve-i8mm"),
        ("", "riscv64", "portable"),
    ],
)
def test_a_cpu_is_told_by_its_instruction_sets(text: str, arch: str, kind: str) -> None:
    cpu = parse_cpuinfo(text, arch)
    assert cpu.kind == kind
    assert cpu.arch == arch
    assert not {"fpu", "evtstrm"} & cpu.isa  # only what inference cares for


def test_cpu_details_are_read_from_cpuinfo() -> None:
    amx = parse_cpuinfo(SAPPHIRE_RAPIDS, "x86_64")
    assert amx.model == "Intel(R) Xeon(R) Platinum 8488C"
    assert amx.cores == 2
    assert amx.native_bf16
    assert amx.native_fp16
    genoa = parse_cpuinfo(GENOA, "x86_64")
    assert genoa.native_bf16
    assert not genoa.native_fp16
    assert not parse_cpuinfo(ROME, "x86_64").native_bf16
    assert "0xd40" in parse_cpuinfo(GRAVITON3, "aarch64").model
    assert "amx_int8" in amx.describe()
    assert "x86-amx" in amx.describe()


def test_this_machine_has_a_cpu_record_that_round_trips() -> None:
    here = host_cpu()
    assert here.model
    again = CpuInfo.from_json(json.loads(json.dumps(here.to_json())))
    assert again == here
    if os.path.exists("/proc/cpuinfo"):
        assert here.cores >= 1


def test_a_forged_kind_is_recomputed_from_the_flags() -> None:
    forged = {"model": "X", "arch": "x86_64", "kind": "x86-amx", "isa": ["avx2", "fma", "nope"]}
    cpu = CpuInfo.from_json(forged)
    assert cpu.kind == "x86-avx2"
    assert "nope" not in cpu.isa


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        {"model": 3, "isa": []},
        {"model": "x", "isa": "avx2"},
        {"model": "x" * 500, "isa": []},
    ],
)
def test_a_malformed_cpu_record_is_refused(raw: object) -> None:
    with pytest.raises(InvalidParameter):
        CpuInfo.from_json(raw)


def _member(folder: Path, name: str) -> str:
    (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / name / "shamal-model.json").write_text("{}")
    return name


def _set(folder: Path, *cpus: CpuInfo) -> VariantSet:
    entries = tuple(
        VariantEntry(_member(folder, cpu.kind), f"build-for-{cpu.kind}", cpu) for cpu in cpus
    )
    variants = VariantSet(_member(folder, "portable"), entries)
    write_variant_set(folder, variants)
    return read_variant_set(folder)


def test_a_server_loads_the_build_for_its_own_kind_of_cpu(tmp_path: Path) -> None:
    amx, genoa, rome = (
        parse_cpuinfo(SAPPHIRE_RAPIDS, "x86_64"),
        parse_cpuinfo(GENOA, "x86_64"),
        parse_cpuinfo(ROME, "x86_64"),
    )
    variants = _set(tmp_path, amx, genoa)
    assert pick_variant(variants, amx).path == "x86-amx"
    assert pick_variant(variants, genoa).path == "x86-avx512-vnni-bf16"
    fallback = pick_variant(variants, rome)
    assert (fallback.path, fallback.variant) == ("portable", "portable")
    assert "x86-avx2" in fallback.reason
    graviton = parse_cpuinfo(GRAVITON3, "aarch64")
    assert pick_variant(variants, graviton).path == "portable"


def test_a_build_for_a_lesser_cpu_serves_a_greater_one(tmp_path: Path) -> None:
    cascade = parse_cpuinfo(CASCADE_LAKE, "x86_64")
    variants = _set(tmp_path, cascade)
    choice = pick_variant(variants, parse_cpuinfo(SAPPHIRE_RAPIDS, "x86_64"))
    assert choice.path == "x86-avx512-vnni"
    assert "whose instruction sets this CPU has" in choice.reason
    # ...and never the other way round: an AMX build is not served on a CPU without AMX.
    amx_only = _set(tmp_path / "amx", parse_cpuinfo(SAPPHIRE_RAPIDS, "x86_64"))
    assert pick_variant(amx_only, cascade).path == "portable"


def _write_raw(folder: Path, raw: object) -> None:
    (folder / VARIANTS_MANIFEST).write_text(json.dumps(raw))


@pytest.mark.parametrize(
    "entry",
    [
        {"path": "../outside", "cpu": {"model": "x", "isa": []}},
        {"path": "/etc", "cpu": {"model": "x", "isa": []}},
        {"path": "missing", "cpu": {"model": "x", "isa": []}},
        {"path": "portable", "cpu": {"model": "x", "isa": []}, "code": "os.system"},
        {"path": "portable", "cpu": {"model": "x", "isa": []}, "figures": {"p50": float("nan")}},
        {"path": "portable", "cpu": {"model": "x", "isa": []}, "figures": {"p50": "fast"}},
        {"path": "portable"},
    ],
)
def test_a_hostile_variant_set_is_refused(tmp_path: Path, entry: dict[str, object]) -> None:
    _member(tmp_path, "portable")
    (tmp_path.parent / "outside").mkdir(exist_ok=True)
    _write_raw(tmp_path, {"schema": 1, "portable": "portable", "variants": [entry]})
    with pytest.raises(InvalidParameter):
        read_variant_set(tmp_path)


def test_a_variant_set_member_that_links_out_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _member(outside, "real")
    inside = tmp_path / "set"
    _member(inside, "portable")
    (inside / "linked").symlink_to(outside / "real")
    _write_raw(
        inside,
        {
            "schema": 1,
            "portable": "portable",
            "variants": [{"path": "linked", "cpu": {"model": "x", "isa": []}}],
        },
    )
    with pytest.raises(InvalidParameter, match="inside its folder"):
        read_variant_set(inside)


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {"schema": 2, "portable": "portable"},
        {"schema": 1, "portable": "portable", "variants": {}},
        {"schema": 1, "portable": "nowhere", "variants": []},
        {"schema": 1, "portable": "portable", "variants": [], "exec": "x"},
    ],
)
def test_a_malformed_variant_set_is_refused(tmp_path: Path, raw: object) -> None:
    _member(tmp_path, "portable")
    _write_raw(tmp_path, raw)
    with pytest.raises(InvalidParameter):
        read_variant_set(tmp_path)


def test_an_oversized_or_broken_variant_manifest_is_refused(tmp_path: Path) -> None:
    _member(tmp_path, "portable")
    (tmp_path / VARIANTS_MANIFEST).write_text("{" * 10)
    with pytest.raises(InvalidParameter, match="not JSON"):
        read_variant_set(tmp_path)
    (tmp_path / VARIANTS_MANIFEST).write_text(" " * (2 << 20))
    with pytest.raises(InvalidParameter, match="too large"):
        read_variant_set(tmp_path)


# ---------------------------------------------------------------- OpenVINO IR as hostile input
IR = """<?xml version="1.0"?>
<net name="tiny" version="11">
  <layers>
    <layer id="0" name="x" type="Parameter" version="opset1">
      <data shape="?,2" element_type="f32"/>
    </layer>
    <layer id="1" name="w" type="Const" version="opset1">
      <data element_type="f32" shape="2" offset="{offset}" size="{size}"/>
    </layer>
  </layers>
  <edges/>
</net>
"""


def _ir(folder: Path, offset: int = 0, size: int = 8, weights: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.xml").write_text(IR.format(offset=offset, size=size))
    (folder / "model.bin").write_bytes(b"\x00" * weights)
    return folder / "model.xml"


def test_a_well_formed_ir_passes_and_names_its_weights(tmp_path: Path) -> None:
    assert check_openvino_ir(_ir(tmp_path), tmp_path) == (tmp_path / "model.bin").resolve()


def test_an_ir_that_names_weights_past_the_end_of_its_bin_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match="past the end"):
        check_openvino_ir(_ir(tmp_path, offset=4, size=8, weights=8), tmp_path)


def test_an_ir_with_entities_is_refused_before_parsing(tmp_path: Path) -> None:
    path = _ir(tmp_path)
    laughs = '<?xml version="1.0"?><!DOCTYPE net [<!ENTITY a "aaaaaaaaaa">'
    laughs += '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><net><layers/>&b;</net>'
    path.write_text(laughs)
    with pytest.raises(InvalidParameter, match="DTD"):
        check_openvino_ir(path, tmp_path)


def test_an_ir_whose_weights_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x01" * 64)
    folder = tmp_path / "model"
    path = _ir(folder)
    (folder / "model.bin").unlink()
    (folder / "model.bin").symlink_to(secret)
    with pytest.raises(InvalidParameter, match="inside the folder"):
        check_openvino_ir(path, folder)


@pytest.mark.parametrize(
    "content",
    [b"\x80\x04\x95.", b"<html><body/></html>", b"<net><nolayers/></net>", b"not xml at all <"],
)
def test_what_is_not_an_ir_is_refused(tmp_path: Path, content: bytes) -> None:
    path = _ir(tmp_path)
    path.write_bytes(content)
    with pytest.raises(InvalidParameter):
        check_openvino_ir(path, tmp_path)


def test_a_non_numeric_weights_range_is_refused(tmp_path: Path) -> None:
    path = _ir(tmp_path)
    path.write_text(IR.replace('offset="{offset}"', 'offset="-1"').format(size=8))
    with pytest.raises(InvalidParameter, match="not a number"):
        check_openvino_ir(path, tmp_path)
