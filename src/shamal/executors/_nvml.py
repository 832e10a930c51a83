"""GPU detection on this node through NVML (``pynvml`` from ``nvidia-ml-py``).

Nothing here raises for want of a GPU: without an NVIDIA driver (or without
``pynvml``) :func:`detect_local_gpus` returns ``[]`` and says so once, at debug level.
A GPU that fails mid-enumeration (fallen off the bus) is skipped with a warning; the
others are still reported.

Every function takes an optional ``nvml`` argument: the NVML binding to use (default:
``pynvml``, imported on first use). Tests pass a small in-memory implementation of the
same calls to exercise the driver-present paths on machines without a GPU.

Indices are NVML's, i.e. PCI bus order; the executors set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
so that CUDA numbers the GPUs the same way.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from shamal.scheduler.core import Gpu

__all__ = ["describe_gpus", "detect_local_gpus", "mig_device_uuid"]

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_absence_lock = threading.Lock()
_absence_reported = False


def _load_nvml() -> Any:
    return importlib.import_module("pynvml")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _report_absent(reason: str) -> None:
    global _absence_reported
    with _absence_lock:
        if _absence_reported:
            return
        _absence_reported = True
    logger.debug("no NVIDIA GPUs detected on this node: %s", reason)


class _Session:
    """``nvmlInit`` ... ``nvmlShutdown``; ``ok`` is false when NVML is unavailable."""

    def __init__(self, nvml: Any | None) -> None:
        self.nvml: Any = None
        self.error = ""
        try:
            self.nvml = nvml if nvml is not None else _load_nvml()
            self.nvml.nvmlInit()
        except ImportError:
            self.nvml, self.error = None, "pynvml is not installed"
        except Exception as exc:  # NVMLError and its many subclasses, OSError
            self.nvml, self.error = None, f"NVML unavailable ({type(exc).__name__}: {exc})"

    @property
    def ok(self) -> bool:
        return self.nvml is not None

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # shutting down is best effort
                logger.debug("nvmlShutdown failed", exc_info=True)


def _mig_slices(nvml: Any, handle: Any) -> int:
    """Compute slices of a GPU in MIG mode (7 on A100/H100), 0 when MIG is off."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # NOT_SUPPORTED on GPUs without MIG
        return 0
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return 0
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    return int(info.instanceCount)


def _mig_devices(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    """The MIG devices (instances) that exist on a GPU: uuid, slices, memory, start."""
    devices = []
    for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except Exception:  # NOT_FOUND: an empty position
            continue
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        start: int | None
        try:
            instance_id = nvml.nvmlDeviceGetGpuInstanceId(mig)
            instance = nvml.nvmlDeviceGetGpuInstanceById(handle, instance_id)
            start = int(nvml.nvmlGpuInstanceGetInfo(instance).placement.start)
        except Exception:  # may need privileges the server lacks
            start = None
        devices.append(
            {
                "uuid": _text(nvml.nvmlDeviceGetUUID(mig)),
                "slices": int(attrs.gpuInstanceSliceCount),
                "memory_mib": int(attrs.memorySizeMB),
                "start": start,
            }
        )
    return devices


def _describe_one(nvml: Any, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    slices = _mig_slices(nvml, handle)
    return {
        "index": index,
        "model": _text(nvml.nvmlDeviceGetName(handle)),
        "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB,
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "mig_slices": slices,
        "mig_devices": _mig_devices(nvml, handle) if slices else [],
    }


def _enumerate(session: _Session) -> list[dict[str, Any]]:
    nvml = session.nvml
    gpus = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            gpus.append(_describe_one(nvml, index))
        except Exception as exc:  # one broken GPU must not hide the others
            logger.warning("skipping GPU %d: %s: %s", index, type(exc).__name__, exc)
    return gpus


def detect_local_gpus(nvml: Any | None = None) -> list[Gpu]:
    """The GPUs of this node, for the resource model; ``[]`` without a driver.

    Never raises. MIG-enabled GPUs report their compute slice count in ``mig_slices``.
    """
    with _Session(nvml) as session:
        if not session.ok:
            _report_absent(session.error)
            return []
        try:
            described = _enumerate(session)
        except Exception as exc:  # nvmlDeviceGetCount itself failed
            logger.warning("GPU detection failed: %s: %s", type(exc).__name__, exc)
            return []
    return [
        Gpu(
            index=d["index"],
            model=d["model"],
            memory_mib=d["memory_mib"],
            uuid=d["uuid"],
            mig_slices=d["mig_slices"],
        )
        for d in described
    ]


def describe_gpus(nvml: Any | None = None) -> dict[str, Any]:
    """What NVML says about this node, as JSON-able data (for ``/health`` or the CLI).

    Keys: ``nvml`` (bool), ``error`` (why not, or ``None``), ``driver_version``,
    ``cuda_driver_version`` (e.g. 12040) and ``gpus`` (index, model, memory_mib, uuid,
    mig_slices, mig_devices: uuid, slices, memory_mib, start). Never raises.
    """
    with _Session(nvml) as session:
        if not session.ok:
            _report_absent(session.error)
            return {
                "nvml": False,
                "error": session.error,
                "driver_version": None,
                "cuda_driver_version": None,
                "gpus": [],
            }
        info: dict[str, Any] = {"nvml": True, "error": None}
        try:
            info["driver_version"] = _text(session.nvml.nvmlSystemGetDriverVersion())
            info["cuda_driver_version"] = int(session.nvml.nvmlSystemGetCudaDriverVersion())
        except Exception:
            info["driver_version"] = info["cuda_driver_version"] = None
        try:
            info["gpus"] = _enumerate(session)
        except Exception as exc:
            info["gpus"], info["error"] = [], f"{type(exc).__name__}: {exc}"
        return info


def mig_device_uuid(
    gpu_index: int, mig_start: int, mig_profile: str, nvml: Any | None = None
) -> str | None:
    """The UUID (``MIG-...``) of the MIG device at ``mig_start`` on GPU ``gpu_index``.

    ``mig_start`` is matched against the GPU instance's placement start. Where NVML
    does not reveal placements (unprivileged), the device is still found when exactly
    one instance of the profile's size exists on that GPU.

    Returns:
        The UUID, or ``None`` when NVML is unavailable (GPUs declared in config).

    Raises:
        LookupError: NVML works but no such MIG device exists.
    """
    slices = int(mig_profile.split("g.", 1)[0])
    with _Session(nvml) as session:
        if not session.ok:
            _report_absent(session.error)
            return None
        try:
            described = _describe_one(session.nvml, gpu_index)
        except Exception as exc:
            raise LookupError(f"GPU {gpu_index}: {type(exc).__name__}: {exc}") from None
    devices = described["mig_devices"]
    for device in devices:
        if device["start"] == mig_start and device["slices"] == slices:
            return str(device["uuid"])
    same_size = [d for d in devices if d["slices"] == slices]
    if len(same_size) == 1 and same_size[0]["start"] is None:
        return str(same_size[0]["uuid"])
    raise LookupError(f"no {mig_profile} MIG device at slice {mig_start} of GPU {gpu_index}")


def gpu_minor_numbers(nvml: Any | None = None) -> dict[int, int] | None:
    """GPU index -> the minor number of its ``/dev/nvidia<minor>`` file; ``None`` when
    NVML cannot say (no driver, or the call failed). Never raises."""
    with _Session(nvml) as session:
        if not session.ok:
            return None
        try:
            count = int(session.nvml.nvmlDeviceGetCount())
            return {
                index: int(
                    session.nvml.nvmlDeviceGetMinorNumber(
                        session.nvml.nvmlDeviceGetHandleByIndex(index)
                    )
                )
                for index in range(count)
            }
        except Exception as exc:
            logger.warning("could not map GPUs to their device files: %s", exc)
            return None
