"""Hyperparameter search: Optuna studies on the platform, every trial a scheduled job.

Importing this package needs no Optuna: it gives the trial side (:func:`current_trial`,
:class:`Trial`) and the driver's client. The driver (:class:`TuneDriver`, which needs Optuna)
and the server side (:class:`TuneService`) load on first use; the router is
:mod:`shamal.tune.api`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.tune._client import Trial, TuneClient, current_trial
from shamal.tune._entities import TRIAL_ENV, Direction, StudyInfo, StudySpec, TrialInfo, TrialState

if TYPE_CHECKING:
    from shamal.tune._driver import TuneDriver, TuneOptions, register_best
    from shamal.tune._service import TuneService

_WHERE: dict[str, tuple[str, str | None]] = {
    "TuneDriver": ("_driver", "TuneDriver"),
    "TuneOptions": ("_driver", "TuneOptions"),
    "TuneService": ("_service", "TuneService"),
    "register_best": ("_driver", "register_best"),
}

__all__ = [
    "TuneDriver",
    "TuneOptions",
    "TuneService",
    "register_best",
    "TRIAL_ENV",
    "Direction",
    "StudyInfo",
    "StudySpec",
    "Trial",
    "TrialInfo",
    "TrialState",
    "TuneClient",
    "current_trial",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
