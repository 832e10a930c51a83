"""GPU detection through NVML.

The driver-present paths run against :class:`FakeNvml`, a small in-memory NVML with
the calls :mod:`shamal.executors._nvml` makes (raising pynvml's real error types);
the real library is tested on whichever side this machine is: without a driver here,
with one on a GPU machine.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from shamal.executors import _nvml
from shamal.executors._nvml import describe_gpus, detect_local_gpus, mig_device_uuid

GIB = 1024**3


@dataclass
class FakeMig:
    uuid: str
    slices: int
    memory_mb: int
    start: int | None  # None: NVML will not reveal the placement (unprivileged)


@dataclass
class FakeGpu:
    name: bytes | str
    memory_bytes: int
    uuid: str
    mig: bool | None = False  # None: the GPU does not support MIG at all
    slices: int = 7
    migs: list[FakeMig] = field(default_factory=list)
    broken: bool = False


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """The subset of pynvml that GPU detection uses, over a list of fake GPUs."""

    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_GPU_INSTANCE_PROFILE_1_SLICE = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _error(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ("gpu", index)

    def _gpu(self, handle: tuple[Any, ...]) -> FakeGpu:
        gpu = self.gpus[int(handle[1])]
        if gpu.broken:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _mig(self, handle: tuple[Any, ...]) -> FakeMig:
        return self._gpu(handle).migs[int(handle[2])]

    def nvmlDeviceGetName(self, handle: tuple[Any, ...]) -> bytes | str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        return SimpleNamespace(total=self._gpu(handle).memory_bytes)

    def nvmlDeviceGetUUID(self, handle: tuple[Any, ...]) -> str:
        return self._mig(handle).uuid if handle[0] == "mig" else self._gpu(handle).uuid

    def nvmlDeviceGetMigMode(self, handle: tuple[Any, ...]) -> list[int]:
        gpu = self._gpu(handle)
        if gpu.mig is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = int(gpu.mig)
        return [mode, mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: tuple[Any, ...], profile: int
    ) -> SimpleNamespace:
        assert profile == self.NVML_GPU_INSTANCE_PROFILE_1_SLICE
        return SimpleNamespace(instanceCount=self._gpu(handle).slices)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple[Any, ...]) -> int:
        return self._gpu(handle).slices

    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, handle: tuple[Any, ...], index: int
    ) -> tuple[str, int, int]:
        if index >= len(self._gpu(handle).migs):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], index)

    def nvmlDeviceGetAttributes(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        mig = self._mig(handle)
        return SimpleNamespace(gpuInstanceSliceCount=mig.slices, memorySizeMB=mig.memory_mb)

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[Any, ...]) -> int:
        return int(handle[2]) + 1

    def nvmlDeviceGetGpuInstanceById(
        self, handle: tuple[Any, ...], instance_id: int
    ) -> tuple[str, int, int]:
        mig_handle = ("gi", handle[1], instance_id - 1)
        if self._mig(mig_handle).start is None:
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        return mig_handle

    def nvmlGpuInstanceGetInfo(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        return SimpleNamespace(placement=SimpleNamespace(start=self._mig(handle).start, size=1))


def a100() -> FakeGpu:
    return FakeGpu(b"NVIDIA A100-SXM4-80GB", 80 * GIB, "GPU-aaaa", mig=None)


def h100_mig(*migs: FakeMig) -> FakeGpu:
    return FakeGpu("NVIDIA H100 80GB HBM3", 80 * GIB, "GPU-hhhh", mig=True, migs=list(migs))


@pytest.fixture
def fresh_absence_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget that an earlier test already reported the missing driver."""
    monkeypatch.setattr(_nvml, "_absence_reported", False)


@pytest.mark.usefixtures("fresh_absence_report")
def test_without_a_driver_nothing_is_detected_and_it_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = FakeNvml([a100()], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with caplog.at_level(logging.DEBUG, logger="shamal.executors._nvml"):
        assert detect_local_gpus(nvml) == []
        assert detect_local_gpus(nvml) == []
        described = describe_gpus(nvml)
        assert mig_device_uuid(0, 0, "1g.10gb", nvml) is None
    records = [r for r in caplog.records if r.name == "shamal.executors._nvml"]
    assert len(records) == 1
    assert records[0].levelno == logging.DEBUG
    assert described["nvml"] is False
    assert "LibraryNotFound" in described["error"]
    assert described["gpus"] == []
    assert nvml.shutdowns == 0  # nothing to shut down after a failed init


def test_detects_whole_and_mig_gpus() -> None:
    nvml = FakeNvml([a100(), h100_mig(FakeMig("MIG-one", 1, 9984, 0))])
    gpus = detect_local_gpus(nvml)
    assert [(g.index, g.model, g.memory_mib, g.uuid, g.mig_slices) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 80 * 1024, "GPU-aaaa", 0),
        (1, "NVIDIA H100 80GB HBM3", 80 * 1024, "GPU-hhhh", 7),
    ]
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_mig_mode_off_reports_no_slices() -> None:
    off = FakeGpu("NVIDIA A30", 24 * GIB, "GPU-cccc", mig=False, slices=4)
    assert detect_local_gpus(FakeNvml([off]))[0].mig_slices == 0


def test_a_broken_gpu_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    broken = FakeGpu("NVIDIA A100", 40 * GIB, "GPU-bbbb", broken=True)
    with caplog.at_level(logging.WARNING, logger="shamal.executors._nvml"):
        gpus = detect_local_gpus(FakeNvml([broken, a100()]))
    assert [g.index for g in gpus] == [1]
    assert any("skipping GPU 0" in r.getMessage() for r in caplog.records)


def test_describe_gpus_is_json_with_mig_devices() -> None:
    nvml = FakeNvml([h100_mig(FakeMig("MIG-a", 1, 9984, 0), FakeMig("MIG-b", 3, 40192, 4))])
    described = json.loads(json.dumps(describe_gpus(nvml)))
    assert described["nvml"] is True
    assert described["driver_version"] == "550.54.15"
    assert described["cuda_driver_version"] == 12040
    (gpu,) = described["gpus"]
    assert gpu["mig_slices"] == 7
    assert gpu["mig_devices"] == [
        {"uuid": "MIG-a", "slices": 1, "memory_mib": 9984, "start": 0},
        {"uuid": "MIG-b", "slices": 3, "memory_mib": 40192, "start": 4},
    ]


def test_mig_device_uuid_by_placement() -> None:
    nvml = FakeNvml([h100_mig(FakeMig("MIG-a", 1, 9984, 0), FakeMig("MIG-b", 1, 9984, 1))])
    assert mig_device_uuid(0, 1, "1g.10gb", nvml) == "MIG-b"
    assert mig_device_uuid(0, 0, "1g.10gb", nvml) == "MIG-a"
    with pytest.raises(LookupError, match="slice 2"):
        mig_device_uuid(0, 2, "1g.10gb", nvml)
    with pytest.raises(LookupError, match="3g.40gb"):
        mig_device_uuid(0, 0, "3g.40gb", nvml)  # the slice there has another size
    with pytest.raises(LookupError, match="GPU 5"):
        mig_device_uuid(5, 0, "1g.10gb", nvml)


def test_mig_device_uuid_when_placements_are_hidden() -> None:
    alone = FakeNvml([h100_mig(FakeMig("MIG-x", 2, 19968, None), FakeMig("MIG-y", 1, 9984, None))])
    assert mig_device_uuid(0, 2, "2g.20gb", alone) == "MIG-x"  # the only 2-slice one
    twins = FakeNvml([h100_mig(FakeMig("MIG-p", 1, 9984, None), FakeMig("MIG-q", 1, 9984, None))])
    with pytest.raises(LookupError):
        mig_device_uuid(0, 0, "1g.10gb", twins)  # ambiguous: refuse rather than guess


def _real_nvml_works() -> bool:
    return bool(describe_gpus()["nvml"])


def test_real_library_on_a_machine_without_a_driver() -> None:
    if _real_nvml_works():
        pytest.skip("this machine has a working NVIDIA driver (see test_real_driver)")
    assert detect_local_gpus() == []
    described = describe_gpus()
    assert described["error"]
    assert described["gpus"] == []


def test_real_driver() -> None:
    if not _real_nvml_works():
        pytest.skip("NVML does not initialise here (no NVIDIA driver); runs on GPU machines")
    gpus = detect_local_gpus()
    assert gpus, "NVML initialised but reported no GPU"
    assert [g.index for g in gpus] == list(range(len(gpus)))
    for gpu in gpus:
        assert gpu.model
        assert gpu.memory_mib > 1024
        assert gpu.uuid.startswith("GPU-")
        assert gpu.mig_slices in (0, 4, 7)
    assert len(describe_gpus()["gpus"]) == len(gpus)
