"""Hyperparameter search: Optuna studies on the platform, every trial a scheduled job.

Importing this package needs no Optuna: it gives the trial side (:func:`current_trial`,
:class:`Trial`) and the driver's client. The server side is
:class:`shamal.tune._service.TuneService` and the router :mod:`shamal.tune.api`.
"""

from __future__ import annotations

from shamal.tune._client import Trial, TuneClient, current_trial
from shamal.tune._entities import TRIAL_ENV, Direction, StudyInfo, StudySpec, TrialInfo, TrialState

__all__ = [
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
