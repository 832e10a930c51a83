"""Glue to Optuna: its RDB storage on the platform's database, samplers and pruners by name,
and frozen Optuna trials turned into :class:`TrialInfo`.

Optuna keeps its own tables (``studies``, ``trials``, ``trial_params``, ...; none clashes
with the platform's). On PostgreSQL they live in a schema of their own, ``optuna``; on
SQLite in the platform's file. Optuna never runs its Alembic there: the platform's
``alembic_version`` belongs to the platform, so the schema check is skipped.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import Any

import optuna
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from shamal.errors import NotImplementedFeature
from shamal.tune._entities import PG_SCHEMA, TrialInfo, TrialState

logger = logging.getLogger(__name__)

ATTR_TEAM = "shamal:team"
ATTR_USER = "shamal:user"
ATTR_SAMPLER = "shamal:sampler"
ATTR_PRUNER = "shamal:pruner"
ATTR_SEED = "shamal:seed"
ATTR_JOB = "shamal:job_id"
ATTR_PRUNE_ANSWER = "shamal:prune_answered"
ATTR_REASON = "shamal:reason"


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage on the platform's database ``url`` (tables created if missing)."""
    parsed = make_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        engine = create_engine(parsed)
        try:
            with engine.begin() as conn:
                conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA}"))
        except IntegrityError:  # another process created it at the same moment
            logger.debug("schema %s created concurrently", PG_SCHEMA)
        finally:
            engine.dispose()
        kwargs["connect_args"] = {"options": f"-c search_path={PG_SCHEMA}"}
    else:
        kwargs["connect_args"] = {"timeout": 30}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.storages.RDBStorage(
        parsed.render_as_string(hide_password=False),
        engine_kwargs=kwargs,
        skip_compatibility_check=True,
    )


def study_id_of_trial(storage: optuna.storages.RDBStorage, trial_id: int) -> int:
    """The id of the study that holds ``trial_id``.

    Raises:
        KeyError: no such trial.
    """
    query = text("SELECT study_id FROM trials WHERE trial_id = :trial_id")
    with storage.engine.connect() as conn:
        found = conn.execute(query, {"trial_id": trial_id}).scalar()
    if found is None:
        raise KeyError(trial_id)
    return int(found)


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """A sampler by its name (see ``SAMPLERS``).

    Optuna marks some samplers (QMC, GP) experimental and warns when one is built; the user
    chose it by name, so the warning says nothing new (and must not become an error).
    """
    needs = _SAMPLER_NEEDS.get(name)
    if needs is not None:
        try:
            importlib.import_module(needs[0])
        except ImportError:
            raise NotImplementedFeature(
                f"the {name} sampler needs {needs[0]}, which this server lacks: "
                f"pip install {needs[1]} on the server (or choose another sampler)"
            ) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _build_sampler(name, seed)


# Samplers whose package Optuna imports only when they first sample: checked up front, so
# a study on a server without it is refused with what to install instead of failing later.
_SAMPLER_NEEDS = {"cmaes": ("cmaes", "'shamal[tune]'"), "gp": ("torch", "'shamal[train]'")}


def _build_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(name: str) -> optuna.pruners.BasePruner:
    """A pruner by its name: median, asha (successive halving), hyperband or none."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner()
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


_STATES = {
    optuna.trial.TrialState.RUNNING: TrialState.RUNNING,
    optuna.trial.TrialState.COMPLETE: TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED: TrialState.PRUNED,
    optuna.trial.TrialState.FAIL: TrialState.FAIL,
    optuna.trial.TrialState.WAITING: TrialState.WAITING,
}


def trial_info(trial: optuna.trial.FrozenTrial, study: str, team: str) -> TrialInfo:
    attrs = trial.system_attrs
    job = attrs.get(ATTR_JOB)
    return TrialInfo(
        id=trial._trial_id,
        number=trial.number,
        study=study,
        team=team,
        state=_STATES[trial.state],
        value=trial.value if trial.values is not None else None,
        params=dict(trial.params),
        intermediate={int(k): float(v) for k, v in trial.intermediate_values.items()},
        user_attrs=dict(trial.user_attrs),
        job_id=str(job) if job else None,
        reason=str(attrs.get(ATTR_REASON, "")),
        started_at=trial.datetime_start,
        finished_at=trial.datetime_complete,
    )
