"""Validation of what users submit: every limit in one place, each error says what to do."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from shamal.errors import InvalidParameter
from shamal.jobs._entities import JobSpec

MAX_ARGS, MAX_ARG_CHARS = 1000, 4096
MAX_ENV, MAX_ENV_VALUE = 200, 32 * 1024
MAX_NAME = 256
MAX_CPUS, MAX_MEMORY_MIB, MAX_GPUS, MAX_WORKERS = 1024, 16 * 1024 * 1024, 64, 256
MAX_TIME_LIMIT_S = 30 * 24 * 3600.0
MAX_GPU_MEMORY_MIB = 4 * 1024 * 1024
"""The most device memory a job may ask for per worker (4 TiB: more than any GPU has)."""
GPU_MEMORY_NEEDS_GPU = (
    "needs a GPU request (--gpus, --gpu-fraction or --mig): it is the memory of each worker's GPU"
)
MAX_RETRIES = 100
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MIG_PROFILE = re.compile(r"^[1-7]g\.[0-9]{1,3}gb$")
RESERVED_ENV_PREFIXES = ("SHAMAL_", "MLFLOW_TRACKING_TOKEN", "CUDA_VISIBLE_DEVICES")


def check_text(what: str, value: str, limit: int) -> str:
    if "\x00" in value:
        raise InvalidParameter(f"{what} must not contain NUL characters")
    if len(value) > limit:
        raise InvalidParameter(f"{what} is longer than {limit} characters")
    return value


def check_name(value: str) -> str:
    """A job's name: at most MAX_NAME characters, none of them control or invisible (ESC,
    CR, bidi overrides), as registered-model names; it is printed in lists and logs."""
    check_text("--name", value, MAX_NAME)
    if not value.isprintable():
        raise InvalidParameter("--name must not contain control or invisible characters")
    return value


def check_command(command: tuple[str, ...]) -> tuple[str, ...]:
    if not command:
        raise InvalidParameter("a job needs a command: `shamal job submit -- python train.py`")
    if len(command) > MAX_ARGS:
        raise InvalidParameter(f"a command may have at most {MAX_ARGS} arguments")
    return tuple(check_text("a command argument", arg, MAX_ARG_CHARS) for arg in command)


RESERVED_ENV_MESSAGE = (
    "environment variables starting with SHAMAL_, and MLFLOW_TRACKING_TOKEN / "
    "CUDA_VISIBLE_DEVICES, are set by the platform and cannot be overridden"
)
MIG_PROFILE_MESSAGE = (
    "a MIG profile is written like 1g.10gb or 3g.40gb (compute slices 1-7, then the "
    "slice's memory in GB)"
)


def check_env_name(key: str) -> str:
    """Raises InvalidParameter, saying what is allowed, for a name a job may not set."""
    if not _ENV_NAME.match(key):
        raise InvalidParameter(
            f"{key[:64]!r} is not an environment variable name: use letters, digits and "
            "underscores, not starting with a digit"
        )
    if key.startswith(RESERVED_ENV_PREFIXES):
        raise InvalidParameter(f"cannot set {key}: {RESERVED_ENV_MESSAGE}")
    return key


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    if len(env) > MAX_ENV:
        raise InvalidParameter(f"at most {MAX_ENV} environment variables")
    clean: dict[str, str] = {}
    for key, value in env.items():
        check_env_name(key)
        clean[key] = check_text(f"environment variable {key}", value, MAX_ENV_VALUE)
    return clean


def check_mig_profile(profile: str) -> str:
    """Raises InvalidParameter, with examples, for what cannot be a MIG profile's name."""
    if not _MIG_PROFILE.match(profile):
        raise InvalidParameter(f"--mig {profile[:32]!r}: {MIG_PROFILE_MESSAGE}")
    return profile


def _check_range(what: str, value: float, low: float, high: float, *, low_open: bool) -> None:
    too_low = value <= low if low_open else value < low
    if too_low or value > high or value != value:  # noqa: PLR0124 - NaN check
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise InvalidParameter(f"{what} must be {bound} and <= {high:g}")


def _check_gpu_memory(value: int, has_gpu: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter("--gpu-memory must be a whole number of MiB")
    _check_range("--gpu-memory", value, 0, MAX_GPU_MEMORY_MIB, low_open=False)
    if value and not has_gpu:
        raise InvalidParameter(f"--gpu-memory {GPU_MEMORY_NEEDS_GPU}")


def check_resources(spec: JobSpec) -> None:
    """Raises InvalidParameter for requests no scheduler could ever honour."""
    _check_range("--cpus", spec.cpus, 0, MAX_CPUS, low_open=True)
    _check_range("--memory", spec.memory_mib, 1, MAX_MEMORY_MIB, low_open=False)
    _check_range("--gpus", spec.gpus, 0, MAX_GPUS, low_open=False)
    _check_range("--workers", spec.workers, 1, MAX_WORKERS, low_open=False)
    forms = (spec.gpus > 0) + (spec.gpu_fraction > 0) + (spec.mig_profile is not None)
    if forms > 1:
        raise InvalidParameter("ask for --gpus, --gpu-fraction or --mig, not several")
    if spec.gpu_fraction:
        _check_range("--gpu-fraction", spec.gpu_fraction, 0, 0.999, low_open=True)
    if spec.mig_profile is not None:
        check_mig_profile(spec.mig_profile)
    _check_gpu_memory(spec.gpu_memory_mib, forms > 0)
    if spec.time_limit_s is not None:
        _check_range("--time-limit", spec.time_limit_s, 0, MAX_TIME_LIMIT_S, low_open=True)
    if spec.retries is not None:
        _check_range("--retries", spec.retries, 0, MAX_RETRIES, low_open=False)
    for model in spec.gpu_models:
        check_text("a GPU model", model, 64)


def check_pool(pool: str | None, known: set[str]) -> str | None:
    if pool is not None and pool not in known:
        names = ", ".join(sorted(known)) or "none"
        raise InvalidParameter(f"no pool named {pool[:64]!r} (pools: {names})")
    return pool


def default_name(command: tuple[str, ...]) -> str:
    """A job's name when none is given: the command's first words."""
    return " ".join(command)[:80]


def fingerprint(command: tuple[str, ...]) -> str:
    """A stable digest of the command: what the runtime predictor groups history by."""
    return hashlib.sha256("\x00".join(command).encode()).hexdigest()[:32]


def duration_text(seconds: float) -> str:
    """Seconds as `--time-limit` takes them: 90s -> 1m30s, 2h, 1h30m, 7d."""
    left = round(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)
