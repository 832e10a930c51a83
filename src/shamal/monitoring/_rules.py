"""Monitoring's rules: names, schedules, policies and the limits of a monitor's spec. Pure.

A schedule is a period in seconds. Ticks missed while no server ran (or while a run took
longer than the period) coalesce: the next run is due at the first tick after now, so a
monitor never runs twice to catch up and two ticks never overlap.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from shamal.errors import InvalidParameter
from shamal.monitoring._entities import DriftAction, MonitorSpec, OnDrift

__all__ = [
    "CORRECTIONS",
    "DEFAULT_RETRAIN_BACKOFF",
    "MAX_COLUMNS",
    "MAX_SCHEDULE_S",
    "MAX_WINDOW",
    "MIN_SCHEDULE_S",
    "NAME_PATTERN",
    "TESTS",
    "LastRetraining",
    "check_column",
    "check_monitor_name",
    "check_spec",
    "next_due",
    "parse_on_drift",
    "parse_schedule",
    "retraining_backoff",
]

NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
#: A column name as the samples and sketches carry it: printable, no control characters.
_COLUMN = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")
TESTS: Final = frozenset({"ks", "chisquare", "z", "wasserstein", "jensenshannon", "psi"})
CORRECTIONS: Final = ("none", "bonferroni", "holm", "bh")
MIN_SCHEDULE_S: Final = 10
MAX_SCHEDULE_S: Final = 30 * 24 * 3600
MAX_WINDOW: Final = 100_000
MAX_COLUMNS: Final = 512
MAX_THRESHOLD: Final = 1000.0
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SCHEDULE = re.compile(r"^([1-9][0-9]{0,7})([smhd]?)$")


def check_monitor_name(name: object) -> str:
    """Raises InvalidParameter unless ``name`` is 1-63 of ``a-z0-9_-``, starting alnum."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidParameter(
            "a monitor's name is 1-63 lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


def check_column(name: object) -> str:
    """Raises InvalidParameter for a column name that is empty, too long or has control
    characters."""
    if not isinstance(name, str) or not _COLUMN.match(name):
        raise InvalidParameter("a column name is 1-256 characters, no control characters")
    return name


def parse_schedule(text: str | int) -> int:
    """``90``, ``90s``, ``15m``, ``1h``, ``1d`` -> seconds.

    Raises:
        InvalidParameter: another form, or outside 10 s .. 30 days.
    """
    if isinstance(text, bool):
        raise InvalidParameter("a schedule is a period such as 15m, 1h or 1d")
    found = _SCHEDULE.match(str(text).strip().lower())
    if found is None:
        raise InvalidParameter("a schedule is a period such as 15m, 1h or 1d")
    seconds = int(found.group(1)) * _UNITS[found.group(2) or "s"]
    return _check_schedule_s(seconds)


def _check_schedule_s(seconds: int) -> int:
    if not MIN_SCHEDULE_S <= seconds <= MAX_SCHEDULE_S:
        raise InvalidParameter(
            f"a schedule is between {MIN_SCHEDULE_S} seconds and {MAX_SCHEDULE_S // 86400} days"
        )
    return seconds


def parse_on_drift(text: str) -> OnDrift:
    """``none``, ``rollback`` or ``retrain:PIPELINE`` -> the policy.

    Raises:
        InvalidParameter: another form, or a pipeline name that is not one.
    """
    if not isinstance(text, str):
        raise InvalidParameter("on_drift is none, rollback or retrain:PIPELINE")
    action, _, pipeline = text.partition(":")
    if action == DriftAction.RETRAIN.value and _NAME.match(pipeline):
        return OnDrift(DriftAction.RETRAIN, pipeline)
    if not pipeline and action in (DriftAction.NONE.value, DriftAction.ROLLBACK.value):
        return OnDrift(DriftAction(action))
    raise InvalidParameter("on_drift is none, rollback or retrain:PIPELINE")


def _check_tests(tests: Mapping[str, str]) -> dict[str, str]:
    if len(tests) > MAX_COLUMNS:
        raise InvalidParameter(f"at most {MAX_COLUMNS} tests")
    out = {}
    for column, test in tests.items():
        if test not in TESTS:
            raise InvalidParameter(f"a test is one of {', '.join(sorted(TESTS))}")
        out[check_column(column)] = test
    return out


def _check_columns(columns: Sequence[str]) -> tuple[str, ...]:
    if len(columns) > MAX_COLUMNS:
        raise InvalidParameter(f"at most {MAX_COLUMNS} columns")
    checked = tuple(check_column(c) for c in columns)
    if len(set(checked)) != len(checked):
        raise InvalidParameter("a column is named twice")
    return checked


def _check_fraction(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidParameter(f"{what} is a number")
    if not math.isfinite(value) or not 0 < value <= 1:
        raise InvalidParameter(f"{what} is above 0 and at most 1")
    return float(value)


#: A retraining run's parameters, as JSON, at most.
MAX_PARAMS_BYTES: Final = 16 * 1024


def _check_params(spec: MonitorSpec) -> dict[str, Any]:
    params = dict(spec.retrain_params)
    if params and spec.on_drift.action is not DriftAction.RETRAIN:
        raise InvalidParameter("retrain parameters need on_drift retrain:PIPELINE")
    try:
        text = json.dumps(params, allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidParameter("retrain parameters are plain JSON (no NaN or infinity)") from None
    if len(text) > MAX_PARAMS_BYTES:
        raise InvalidParameter(f"retrain parameters are at most {MAX_PARAMS_BYTES} bytes of JSON")
    return params


def check_spec(spec: MonitorSpec) -> MonitorSpec:
    """The spec checked field by field (the deployment and reference are the service's).

    Raises:
        InvalidParameter: the first field out of its limits, named.
    """
    threshold = spec.threshold
    if threshold is not None and (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not math.isfinite(threshold)
        or not 0 < threshold <= MAX_THRESHOLD
    ):
        raise InvalidParameter(f"a threshold is above 0 and at most {MAX_THRESHOLD:g}")
    if spec.correction not in CORRECTIONS:
        raise InvalidParameter(f"a correction is one of {', '.join(CORRECTIONS)}")
    if isinstance(spec.window, bool) or not 1 <= spec.window <= MAX_WINDOW:
        raise InvalidParameter(f"a window is 1 to {MAX_WINDOW} rows")
    if spec.name is not None:
        check_monitor_name(spec.name)
    return MonitorSpec(
        deployment=spec.deployment,
        schedule_s=_check_schedule_s(spec.schedule_s),
        name=spec.name,
        reference=spec.reference,
        columns=_check_columns(spec.columns),
        tests=_check_tests(spec.tests),
        threshold=None if threshold is None else float(threshold),
        correction=spec.correction,
        drift_share=_check_fraction(spec.drift_share, "drift_share"),
        window=spec.window,
        on_drift=spec.on_drift,
        alert_url=spec.alert_url,
        retrain_params=_check_params(spec),
    )


def default_name(deployment: str) -> str:
    """``DEPLOYMENT-drift``, cut to a name's length."""
    return check_monitor_name(f"{deployment[:57]}-drift")


def next_due(due: datetime, schedule_s: int, now: datetime) -> datetime:
    """The first tick of the schedule (``due`` + k periods) after ``now``: missed ticks
    coalesce into the run that happens now."""
    period = timedelta(seconds=schedule_s)
    if due > now:
        return due
    missed = int((now - due) / period) + 1
    return due + missed * period


def spec_json(spec: MonitorSpec, reference: tuple[str, int]) -> dict[str, Any]:
    """What the monitor row keeps of a checked spec."""
    return {
        "reference": {
            "model": reference[0],
            "version": reference[1],
            "follows": spec.reference is None,
        },
        "columns": list(spec.columns),
        "tests": dict(spec.tests),
        "threshold": spec.threshold,
        "correction": spec.correction,
        "drift_share": spec.drift_share,
        "window": spec.window,
        "on_drift": str(spec.on_drift),
        "retrain_params": dict(spec.retrain_params),
    }


#: How long drift waits to retrain again after a retraining that did not take.
DEFAULT_RETRAIN_BACKOFF: Final = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class LastRetraining:
    """The newest retraining run a monitor started, once it has ended."""

    run_id: str
    state: str
    pipeline_version: int
    started_at: datetime
    ended_at: datetime | None


def retraining_backoff(
    last: LastRetraining,
    *,
    rolled_back_at: datetime | None,
    latest_version: int,
    now: datetime,
    backoff: timedelta,
) -> str | None:
    """Why drift may not start another retraining yet (None: it may).

    A retraining did not take when its run failed or was cancelled, or when the deployment
    rolled a canary back after the run began (production refused what it made). Drift goes
    on then, and retraining again at once would make the same thing again at every monitor
    run; so it waits ``backoff`` from the failure, or until the pipeline has a version newer
    than the run's (someone changed it).

    Args:
        last: the monitor's newest retraining run, ended.
        rolled_back_at: when the deployment's last rollout was rolled back (None: it was not).
        latest_version: the pipeline's newest version.
        now: the current time (aware).
        backoff: how long to wait after a retraining that did not take.
    """
    refused = rolled_back_at is not None and rolled_back_at >= last.started_at
    if last.state not in ("failed", "cancelled") and not refused:
        return None
    if latest_version > last.pipeline_version:
        return None
    ended = last.ended_at or last.started_at
    since = max(ended, rolled_back_at) if refused and rolled_back_at is not None else ended
    left = since + backoff - now
    if left <= timedelta(0):
        return None
    what = "its canary was rolled back" if refused else f"its run {last.state}"
    return (
        f"the last retraining run {last.run_id} did not take ({what}); retraining waits "
        f"{math.ceil(left.total_seconds())} s more, or for a new version of the pipeline"
    )
