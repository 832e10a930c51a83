"""The job a user submits, as the API takes it: a pydantic model without the web layer, so
that the CLI checks a job as the server will before it uploads anything."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from shamal.errors import InvalidParameter
from shamal.jobs import _rules
from shamal.jobs._entities import JobSpec
from shamal.jobs._rules import MAX_ARG_CHARS, MAX_ARGS, MAX_NAME

__all__ = ["JobIn", "Model", "Text"]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


_NO_NUL = r"^[^\x00]*$"
_ENV_NAME = r"^(?!SHAMAL_|MLFLOW_TRACKING_TOKEN|CUDA_VISIBLE_DEVICES)[A-Za-z_][A-Za-z0-9_]*$"
_MIG_PROFILE = r"^[1-7]g\.[0-9]{1,3}gb$"
_DATASET_REF = r"^(data:/)?[a-z0-9][a-z0-9._-]{0,127}(@[a-z][a-z0-9_-]{0,63}|/[0-9]{1,9})?$"
_MAX_DATASETS = 32  # as the service's MAX_DATASETS


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("invalid", "must not contain NUL characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul), Field(json_schema_extra={"pattern": _NO_NUL})]
"""Text without NUL characters (the schema documents the pattern; the check words it)."""


def _human(check: Callable[[str], str], value: str) -> str:
    """``check(value)`` with its InvalidParameter as a validation error of the same words."""
    try:
        return check(value)
    except InvalidParameter as exc:
        raise PydanticCustomError("invalid", exc.message) from None


class JobIn(Model):
    """A job to queue. Resources are per worker; ``workers`` > 1 is a gang.

    At most one of ``gpus``, ``gpu_fraction`` and ``mig_profile`` may be given.
    """

    model_config = ConfigDict(extra="forbid", regex_engine="python-re")

    command: list[Annotated[Text, Field(max_length=MAX_ARG_CHARS)]] = Field(
        min_length=1, max_length=MAX_ARGS, examples=[["python", "train.py", "--epochs", "3"]]
    )
    name: Text = Field(default="", max_length=MAX_NAME)
    team: str | None = Field(default=None, max_length=64)
    priority: str | None = Field(default=None, max_length=32)
    cpus: float = Field(default=1.0, gt=0, le=1024)
    memory_mib: int = Field(default=2048, ge=1, le=16 * 1024 * 1024)
    gpus: int = Field(default=0, ge=0, le=64)
    gpu_fraction: float = Field(default=0.0, ge=0, lt=1)
    mig_profile: str | None = Field(
        default=None,
        max_length=16,
        examples=["1g.10gb"],
        json_schema_extra={"pattern": _MIG_PROFILE},
    )
    gpu_models: list[Annotated[Text, Field(max_length=64)]] = Field(default=[], max_length=16)
    gpu_memory_mib: int = Field(
        default=0,
        ge=0,
        le=_rules.MAX_GPU_MEMORY_MIB,
        description="the memory each worker's device must have, in MiB (0: any): a whole "
        "GPU's memory, a fraction's share of it or a MIG slice's; needs a GPU request",
        examples=[40960],
    )
    workers: int = Field(default=1, ge=1, le=256)
    pool: str | None = Field(default=None, max_length=64)
    time_limit_s: float | None = Field(default=None, gt=0, le=30 * 24 * 3600)
    retries: int | None = Field(default=None, ge=0, le=100)
    env: dict[
        Annotated[str, Field(max_length=128, json_schema_extra={"pattern": _ENV_NAME})],
        Annotated[Text, Field(max_length=32768)],
    ] = Field(default={}, max_length=200)
    snapshot: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    datasets: list[Annotated[str, Field(max_length=200, pattern=_DATASET_REF)]] = Field(
        default=[],
        max_length=_MAX_DATASETS,
        description="the datasets the job reads (NAME, NAME@alias, NAME/3): it runs only "
        "in pools of regions their residency policies allow",
        examples=[["customers@prod"]],
    )
    executor: Literal["local", "ray"] | None = Field(
        default=None,
        description="the executor that runs it: local processes or the Ray cluster (null: "
        "the server's default); one the server does not run is refused",
    )

    # Checked here rather than by a schema pattern so that a refusal says what to write,
    # not which regular expression failed (the schema still documents the patterns).
    @field_validator("mig_profile")
    @classmethod
    def _mig_profile(cls, value: str | None) -> str | None:
        return None if value is None else _human(_rules.check_mig_profile, value)

    @field_validator("gpu_memory_mib")
    @classmethod
    def _gpu_memory(cls, value: int, info: ValidationInfo) -> int:
        asked = info.data
        gpu = asked.get("gpus") or asked.get("gpu_fraction") or asked.get("mig_profile")
        if value and not gpu:
            raise PydanticCustomError("invalid", _rules.GPU_MEMORY_NEEDS_GPU)
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            _human(_rules.check_env_name, key)
        return value

    def spec(self) -> JobSpec:
        return JobSpec(
            command=tuple(self.command),
            name=self.name,
            team=self.team,
            priority=self.priority,
            cpus=self.cpus,
            memory_mib=self.memory_mib,
            gpus=self.gpus,
            gpu_fraction=self.gpu_fraction,
            mig_profile=self.mig_profile,
            gpu_models=tuple(self.gpu_models),
            gpu_memory_mib=self.gpu_memory_mib,
            workers=self.workers,
            pool=self.pool,
            time_limit_s=self.time_limit_s,
            retries=self.retries,
            env=dict(self.env),
            snapshot=self.snapshot,
            datasets=tuple(self.datasets),
            executor=self.executor,
        )
