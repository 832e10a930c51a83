"""What a study and a trial look like outside the service, and the rules on their inputs.

Pure: no Optuna, no database. The trial-side client and the CLI import this module, so
it must stay importable without Optuna installed.
"""

from __future__ import annotations

import enum
import logging
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shamal.errors import InvalidParameter

logger = logging.getLogger(__name__)

STUDY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
PARAM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.\-/]{0,127}$"
NO_TEAM = "-"
"""How a path names the team of a study that belongs to no team (platform admins only)."""
PG_SCHEMA = "optuna"
"""The PostgreSQL schema of Optuna's tables (on SQLite they share the platform's file)."""
TRIAL_ENV = "TUNE_TRIAL_ID"
"""The variable a trial job finds its trial id in (names starting SHAMAL_ are reserved)."""
MAX_CHOICES = 1000
MAX_ATTR_CHARS = 1024
MAX_BOUND = 1e15
"""Bounds of float and int distributions stay within +-MAX_BOUND (so spans and steps stay
exact enough and fit the storage's columns)."""
MAX_GRID = 1e12
MAX_STEP = 2**31 - 1
"""Reported steps are stored in a 32-bit column."""

SAMPLERS = ("tpe", "random", "cmaes", "qmc", "gp", "nsga2")
PRUNERS = ("median", "asha", "hyperband", "none")


class Direction(enum.StrEnum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


class TrialState(enum.StrEnum):
    """Optuna's trial states, by their lower-case names."""

    RUNNING = "running"
    COMPLETE = "complete"
    PRUNED = "pruned"
    FAIL = "fail"
    WAITING = "waiting"


FINISHED = frozenset({TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL})


@dataclass(frozen=True, slots=True)
class StudySpec:
    """What creating (or loading) a study asks for."""

    name: str
    team: str | None = None
    direction: Direction = Direction.MINIMIZE
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class TrialInfo:
    """One trial as stored; ``job_id`` is the job that runs it, once attached."""

    id: int
    number: int
    study: str
    team: str
    state: TrialState
    value: float | None
    params: dict[str, Any]
    intermediate: dict[int, float]
    user_attrs: dict[str, Any]
    job_id: str | None
    reason: str
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class StudyInfo:
    """A study, how many trials are in each state, and its best trial so far."""

    name: str
    team: str
    user: str
    direction: Direction
    sampler: str
    pruner: str
    counts: dict[str, int] = field(default_factory=dict)
    best: TrialInfo | None = None


def check_study_name(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(STUDY_NAME_PATTERN, name):
        raise InvalidParameter(
            "a study name is 1-100 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit"
        )
    return name


def check_choice(kind: str, value: str, allowed: tuple[str, ...]) -> str:
    lowered = value.lower()
    if lowered not in allowed:
        raise InvalidParameter(f"unknown {kind} {value!r} (choose one of: {', '.join(allowed)})")
    return lowered


def check_param_name(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(PARAM_NAME_PATTERN, name):
        raise InvalidParameter("a parameter name is 1-128 characters: letters, digits, _ . - /")
    return name


def finite(what: str, value: Any) -> float:
    """``value`` as a finite float, else InvalidParameter."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidParameter(f"{what} must be a number")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidParameter(f"{what} must be finite, not {value!r}")
    return number


def _check_range(low: float, high: float, log: bool, step: float | None) -> None:
    if max(abs(low), abs(high)) > MAX_BOUND:
        raise InvalidParameter(f"bounds stay within +-{MAX_BOUND:g}")
    if low > high:
        raise InvalidParameter(f"low ({low}) is above high ({high})")
    if log and low <= 0:
        raise InvalidParameter("a log distribution needs low > 0")
    if step is not None and (step <= 0 or log):
        raise InvalidParameter("step must be > 0, and cannot be combined with log")
    if step is not None and (high - low) / step > MAX_GRID:
        raise InvalidParameter(f"a stepped range has at most {MAX_GRID:g} steps")


def check_distribution(spec: dict[str, Any]) -> dict[str, Any]:
    """A validated, normalised distribution: float, int or categorical.

    Shapes: ``{"type": "float", "low", "high", "log"?, "step"?}``, the same with
    ``"int"`` (integer bounds and step), ``{"type": "categorical", "choices": [...]}``
    with choices of None, bool, int, finite float or str.

    Raises:
        InvalidParameter: anything else, NaN or infinite bounds, low > high, ...
    """
    kind = spec.get("type")
    if kind == "categorical":
        return _check_categorical(spec)
    if kind not in ("float", "int"):
        raise InvalidParameter("a distribution's type is float, int or categorical")
    unknown = set(spec) - {"type", "low", "high", "log", "step"}
    if unknown:
        raise InvalidParameter(f"unknown distribution fields: {', '.join(sorted(unknown))}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise InvalidParameter("log is true or false")
    low, high = finite("low", spec.get("low")), finite("high", spec.get("high"))
    step = None if spec.get("step") is None else finite("step", spec.get("step"))
    if kind == "int":
        if not all(float(v).is_integer() for v in (low, high, step or 1)):
            raise InvalidParameter("an int distribution has integer low, high and step")
        _check_range(low, high, log, step)
        return {"type": "int", "low": int(low), "high": int(high), "log": log,
                "step": int(step or 1)}  # fmt: skip
    _check_range(low, high, log, step)
    return {"type": "float", "low": low, "high": high, "log": log, "step": step}


def _check_categorical(spec: dict[str, Any]) -> dict[str, Any]:
    if set(spec) != {"type", "choices"}:
        raise InvalidParameter("a categorical distribution has exactly: type, choices")
    choices = spec["choices"]
    if not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES:
        raise InvalidParameter(f"choices is a list of 1 to {MAX_CHOICES} values")
    for choice in choices:
        if isinstance(choice, float):
            finite("a choice", choice)
        elif choice is not None and not isinstance(choice, bool | int | str):
            raise InvalidParameter("choices are null, booleans, numbers or strings")
        if isinstance(choice, str) and len(choice) > MAX_ATTR_CHARS:
            raise InvalidParameter(f"a choice is at most {MAX_ATTR_CHARS} characters")
    return {"type": "categorical", "choices": list(choices)}
