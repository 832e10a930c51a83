"""Studies and trials: who may see and change them, and the platform's check on stale trials.

Access follows jobs: a study belongs to a team. Members create studies, ask for trials
and tell results; viewers see them; another team's study or trial answers 404. A study
without a team is for platform admins only.

Storage is Optuna's own RDB storage on the platform database (see :mod:`._optuna`).
Optuna commits in its own transactions, so a change's audit entry is written just after
the change, in a transaction of its own (actor and outcome as with every other domain).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy

from shamal.db import Database
from shamal.errors import Conflict, InvalidParameter, NotFound
from shamal.jobs import job_statuses
from shamal.security import AuditContext, AuditLog, Principal, Role
from shamal.tune import _entities as rules
from shamal.tune._entities import (
    NO_TEAM,
    PG_SCHEMA,
    Direction,
    StudyInfo,
    StudySpec,
    TrialInfo,
    TrialState,
)

if TYPE_CHECKING:
    import optuna

    from shamal.tune import _optuna as glue


def _optuna_missing() -> str | None:
    """ "optuna" on an install without the tune extra, else None. Optuna itself (1 s to
    import) loads when the service is first used (:func:`_load_optuna`), not at start."""
    try:
        found = importlib.util.find_spec("optuna")
    except ModuleNotFoundError:  # a finder that refuses it outright
        found = None
    return "optuna" if found is None else None


OPTUNA_MISSING = _optuna_missing()

logger = logging.getLogger(__name__)

MAX_LIST = 1000
NEEDS_EXTRA = (
    "hyperparameter search needs Optuna, which this install of Shamal lacks: "
    "pip install 'shamal[tune]' on the server, then restart it"
)


@dataclass(frozen=True, slots=True)
class JobStatus:
    """Where a trial's job stands, as far as stale trials are concerned, and whose it is."""

    state: str
    ended: bool
    team: str


JobLookup = Callable[[Collection[str]], Mapping[str, JobStatus]]
"""Job id -> status for the ids that exist; ids missing from the answer have vanished."""


def jobs_in_database(db: Database) -> JobLookup:
    """A :data:`JobLookup` reading the jobs table: a job has ended when it is succeeded or
    cancelled, or failed or lost with no retry left."""

    def lookup(ids: Collection[str]) -> Mapping[str, JobStatus]:
        if not ids:
            return {}
        with db.unit_of_work(write=False) as s:
            statuses = job_statuses(s, ids)
        return {
            job_id: JobStatus(state=state.value, ended=ended, team=team)
            for job_id, (state, ended, team) in statuses.items()
        }

    return lookup


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _load_optuna() -> None:
    """Bind this module's ``optuna`` and ``glue`` (idempotent; imports are thread-safe)."""
    globals()["optuna"] = importlib.import_module("optuna")
    globals()["glue"] = importlib.import_module("shamal.tune._optuna")


def _opened(
    method: Callable[Concatenate[TuneService, _P], _R],
) -> Callable[Concatenate[TuneService, _P], _R]:
    """A public method of :class:`TuneService`: Optuna is loaded and the storage open first."""

    @functools.wraps(method)
    def wrapper(self: TuneService, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        self._open()
        return method(self, *args, **kwargs)

    return wrapper


def _key(team: str, name: str) -> str:
    return f"{team or NO_TEAM}/{name}"


class TuneService:
    """Create and load studies, ask for trials, suggest, report, tell; fail stale trials.

    Thread-safe; one instance per process.
    """

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        storage_url: str,
        jobs: JobLookup | None = None,
    ) -> None:
        self._db = db
        self._audit = audit
        self._jobs = jobs or jobs_in_database(db)
        self._lock = threading.RLock()
        self._studies: dict[str, optuna.Study] = {}
        #: False on an install without the tune extra: the server starts, and every tune
        #: route answers 501 naming the extra (see :data:`NEEDS_EXTRA`).
        self.available = OPTUNA_MISSING is None
        self._storage_url = storage_url
        self._storage_opened: optuna.storages.RDBStorage | None = None
        if not self.available:
            logger.info("hyperparameter search is off: %s", NEEDS_EXTRA)

    def _open(self) -> optuna.storages.RDBStorage:
        """Load Optuna and open its storage (creating its tables) on first use: the server
        starts without either."""
        opened = self._storage_opened
        if opened is None:
            with self._lock:
                if self._storage_opened is None:
                    _load_optuna()
                    self._storage_opened = glue.open_storage(self._storage_url)
                opened = self._storage_opened
        return opened

    @property
    def _storage(self) -> optuna.storages.RDBStorage:
        return self._open()

    def _no_studies_yet(self) -> bool:
        """Optuna's tables are missing from the database: no process has opened its storage
        there yet, so no trial exists (a cheap look that spares loading Optuna)."""
        if self._storage_opened is not None:
            return False
        schema = PG_SCHEMA if self._db.dialect == "postgresql" else None
        return not sqlalchemy.inspect(self._db.engine).has_table("studies", schema=schema)

    def close(self) -> None:
        if self._storage_opened is None:
            return
        self._storage_opened.remove_session()
        self._storage_opened.engine.dispose()

    # ------------------------------------------------------------------ plumbing
    def _record(self, ctx: AuditContext, target: str, **detail: Any) -> None:
        self._db.run(lambda s: self._audit.record(s, ctx, target, **detail))

    @staticmethod
    def _allow(principal: Principal, team: str, needed: Role, what: str) -> None:
        """NotFound (never revealing existence) unless ``principal`` holds ``needed``."""
        if principal.user.is_admin:
            return
        if not team or team not in principal.roles:
            raise NotFound(f"{what} does not exist")
        principal.require_team_role(team, needed)

    def _study(self, key: str) -> optuna.Study:
        with self._lock:
            study = self._studies.get(key)
            if study is not None:
                return study
            try:
                study_id = self._storage.get_study_id_from_name(key)
            except KeyError:
                raise NotFound(f"study {key.split('/', 1)[1]!r} does not exist") from None
            attrs = self._storage.get_study_system_attrs(study_id)
            study = optuna.load_study(
                study_name=key,
                storage=self._storage,
                sampler=glue.make_sampler(
                    str(attrs.get(glue.ATTR_SAMPLER, "tpe")), attrs.get(glue.ATTR_SEED)
                ),  # fmt: skip
                pruner=glue.make_pruner(str(attrs.get(glue.ATTR_PRUNER, "median"))),
            )
            self._studies[key] = study
            return study

    def _info(self, study: optuna.Study, with_trials: bool = True) -> StudyInfo:
        attrs = self._storage.get_study_system_attrs(study._study_id)
        team = str(attrs.get(glue.ATTR_TEAM, ""))
        name = study.study_name.split("/", 1)[1]
        counts: dict[str, int] = {}
        best = None
        if with_trials:
            for trial in study.get_trials(deepcopy=False):
                state = trial.state.name.lower()
                counts[state] = counts.get(state, 0) + 1
            if counts.get("complete"):
                best = glue.trial_info(study.best_trial, name, team)
        return StudyInfo(
            name=name,
            team=team,
            user=str(attrs.get(glue.ATTR_USER, "")),
            direction=Direction(study.direction.name.lower()),
            sampler=str(attrs.get(glue.ATTR_SAMPLER, "tpe")),
            pruner=str(attrs.get(glue.ATTR_PRUNER, "median")),
            counts=counts,
            best=best,
        )

    def _trial(self, principal: Principal, trial_id: int, needed: Role) -> tuple[str, int]:
        """(study key, trial number) of a trial the principal may use."""
        try:
            study_id = glue.study_id_of_trial(self._storage, trial_id)
            number = self._storage.get_trial_number_from_id(trial_id)
        except KeyError:
            raise NotFound(f"trial {trial_id} does not exist") from None
        key = self._storage.get_study_name_from_id(study_id)
        team = str(self._storage.get_study_system_attrs(study_id).get(glue.ATTR_TEAM, ""))
        self._allow(principal, team, needed, f"trial {trial_id}")
        return key, number

    def _running(self, trial_id: int) -> optuna.trial.FrozenTrial:
        trial = self._storage.get_trial(trial_id)
        if trial.state != optuna.trial.TrialState.RUNNING:
            raise Conflict(f"trial {trial_id} is {trial.state.name.lower()}, not running")
        return trial

    # ------------------------------------------------------------------ studies
    @_opened
    def create_study(self, ctx: AuditContext, spec: StudySpec) -> StudyInfo:
        """Create the study, or load it when it exists with the same direction.

        Raises:
            InvalidParameter: a bad name, sampler, pruner, or no team given when one is needed.
            NotFound / PermissionDenied: the team is not the caller's, or the role is low.
            Conflict: it exists with the other direction.
        """
        principal = ctx.require_principal()
        name = rules.check_study_name(spec.name)
        sampler = rules.check_choice("sampler", spec.sampler, rules.SAMPLERS)
        pruner = rules.check_choice("pruner", spec.pruner, rules.PRUNERS)
        team = self._team(principal, spec.team)
        key = _key(team, name)
        with self._lock:
            try:
                existing = self._study(key)
            except NotFound:
                existing = None
            if existing is not None:
                if existing.direction.name.lower() != spec.direction.value:
                    raise Conflict(f"study {name!r} exists and is to {existing.direction.name}")
                self._record(ctx, f"study:{key}", created=False)
                return self._info(existing)
            study = optuna.create_study(
                study_name=key,
                storage=self._storage,
                direction=spec.direction.value,
                sampler=glue.make_sampler(sampler, spec.seed),
                pruner=glue.make_pruner(pruner),
            )
            for attr, value in ((glue.ATTR_TEAM, team), (glue.ATTR_USER, principal.name),
                                (glue.ATTR_SAMPLER, sampler), (glue.ATTR_PRUNER, pruner),
                                (glue.ATTR_SEED, spec.seed)):  # fmt: skip
                self._storage.set_study_system_attr(study._study_id, attr, value)
            self._studies[key] = study
        self._record(ctx, f"study:{key}", created=True, sampler=sampler, pruner=pruner)
        return self._info(study)

    def _team(self, principal: Principal, team: str | None) -> str:
        if team is None:
            if len(principal.roles) == 1:
                return next(iter(principal.roles))
            if principal.user.is_admin and not principal.roles:
                return ""
            names = ", ".join(sorted(principal.roles)) or "none"
            raise InvalidParameter(f"say which team the study belongs to (yours: {names})")
        if team == NO_TEAM:
            principal.require_admin()
            return ""
        principal.require_team_role(team, Role.MEMBER)
        return team

    @_opened
    def get_study(self, principal: Principal, team: str, name: str) -> StudyInfo:
        """The study with its trial counts and best trial (stale trials failed first)."""
        team = "" if team == NO_TEAM else team
        self._allow(principal, team, Role.VIEWER, f"study {name!r}")
        study = self._study(_key(team, rules.check_study_name(name)))
        self.fail_stale_trials(study)
        return self._info(study)

    @_opened
    def list_studies(self, principal: Principal, team: str | None = None) -> list[StudyInfo]:
        """Studies the principal may see (of ``team`` only, when given), by name."""
        out = []
        for summary in self._storage.get_all_studies()[:MAX_LIST]:
            owner = str(summary.system_attrs.get(glue.ATTR_TEAM, ""))
            if team is not None and owner != ("" if team == NO_TEAM else team):
                continue
            if not principal.user.is_admin and owner not in principal.roles:
                continue
            out.append(self._info(self._study(summary.study_name), with_trials=False))
        return sorted(out, key=lambda info: (info.team, info.name))

    @_opened
    def list_trials(self, principal: Principal, team: str, name: str) -> list[TrialInfo]:
        """The study's trials by number (stale trials failed first)."""
        team = "" if team == NO_TEAM else team
        self._allow(principal, team, Role.VIEWER, f"study {name!r}")
        study = self._study(_key(team, rules.check_study_name(name)))
        self.fail_stale_trials(study)
        return [glue.trial_info(t, name, team) for t in study.get_trials(deepcopy=False)]

    # ------------------------------------------------------------------ trials
    @_opened
    def ask(self, ctx: AuditContext, team: str, name: str) -> TrialInfo:
        """Start a new trial of the study; its parameters are suggested as it asks for them."""
        principal = ctx.require_principal()
        team = "" if team == NO_TEAM else team
        self._allow(principal, team, Role.MEMBER, f"study {name!r}")
        key = _key(team, rules.check_study_name(name))
        with self._lock:
            trial = self._study(key).ask()
        self._record(ctx, f"trial:{trial._trial_id}", study=key, number=trial.number)
        return self.get_trial(principal, trial._trial_id)

    @_opened
    def get_trial(self, principal: Principal, trial_id: int) -> TrialInfo:
        key, _ = self._trial(principal, trial_id, Role.VIEWER)
        team, name = key.split("/", 1)
        frozen = self._storage.get_trial(trial_id)
        return glue.trial_info(frozen, name, "" if team == NO_TEAM else team)

    @_opened
    def attach_job(self, ctx: AuditContext, trial_id: int, job_id: str) -> TrialInfo:
        """Record which job runs the trial (the stale check follows that job).

        Raises:
            NotFound: no job ``job_id`` of the study's team (another team's job is not
                followed: its state would leak into this team's trial).
            Conflict: the trial has finished, or another job already runs it.
        """
        principal = ctx.require_principal()
        key, _ = self._trial(principal, trial_id, Role.MEMBER)
        team = key.split("/", 1)[0]
        job = self._jobs([job_id]).get(job_id)
        if job is None or job.team != ("" if team == NO_TEAM else team):
            raise NotFound(f"job {job_id!r} does not exist in the study's team")
        trial = self._running(trial_id)
        current = trial.system_attrs.get(glue.ATTR_JOB)
        if current not in (None, job_id):
            raise Conflict(f"trial {trial_id} is already run by job {current}")
        self._storage.set_trial_system_attr(trial_id, glue.ATTR_JOB, job_id)
        self._record(ctx, f"trial:{trial_id}", job=job_id)
        return self.get_trial(principal, trial_id)

    @_opened
    def suggest(
        self, principal: Principal, trial_id: int, name: str, distribution: dict[str, Any]
    ) -> Any:
        """The trial's value of parameter ``name`` (sampled on first ask; the same after).

        Raises:
            InvalidParameter: a bad name or distribution, or another one for the same name.
            Conflict: the trial is not running.
        """
        key, _ = self._trial(principal, trial_id, Role.MEMBER)
        name = rules.check_param_name(name)
        dist = rules.check_distribution(distribution)
        self._running(trial_id)
        trial = optuna.trial.Trial(self._study(key), trial_id)
        try:
            with self._lock:
                if dist["type"] == "categorical":
                    return trial.suggest_categorical(name, dist["choices"])
                if dist["type"] == "int":
                    return trial.suggest_int(
                        name, dist["low"], dist["high"], step=dist["step"], log=dist["log"]
                    )
                return trial.suggest_float(
                    name, dist["low"], dist["high"], step=dist["step"], log=dist["log"]
                )
        except ValueError as exc:
            raise InvalidParameter(
                f"parameter {name!r} was suggested before with another distribution"
            ) from exc

    @_opened
    def report(self, principal: Principal, trial_id: int, step: int, value: float) -> bool:
        """Record the intermediate ``value`` at ``step``; answer whether to prune the trial.

        A step reported twice keeps its first value. The answer is remembered: a trial
        told to prune whose job then ends is marked pruned by :meth:`fail_stale_trials`.
        """
        key, _ = self._trial(principal, trial_id, Role.MEMBER)
        value = rules.finite("value", value)
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= rules.MAX_STEP:
            raise InvalidParameter(f"step is an integer from 0 to {rules.MAX_STEP}")
        frozen = self._running(trial_id)
        trial = optuna.trial.Trial(self._study(key), trial_id)
        with self._lock:
            if step not in frozen.intermediate_values:
                trial.report(value, step)
            prune = trial.should_prune()
        if prune:
            self._storage.set_trial_system_attr(trial_id, glue.ATTR_PRUNE_ANSWER, step)
        return prune

    @_opened
    def should_prune(self, principal: Principal, trial_id: int) -> bool:
        key, _ = self._trial(principal, trial_id, Role.VIEWER)
        self._running(trial_id)
        with self._lock:
            return optuna.trial.Trial(self._study(key), trial_id).should_prune()

    @_opened
    def set_user_attr(self, principal: Principal, trial_id: int, key: str, value: Any) -> None:
        """A user attribute on a running trial (e.g. ``run_id`` of its tracked run)."""
        self._trial(principal, trial_id, Role.MEMBER)
        rules.check_param_name(key)
        if isinstance(value, float):
            rules.finite(key, value)
        elif value is not None and not isinstance(value, bool | int | str):
            raise InvalidParameter("an attribute is null, a boolean, a number or a string")
        if isinstance(value, str) and len(value) > rules.MAX_ATTR_CHARS:
            raise InvalidParameter(f"an attribute is at most {rules.MAX_ATTR_CHARS} characters")
        self._running(trial_id)
        self._storage.set_trial_user_attr(trial_id, key, value)

    @_opened
    def tell(
        self, ctx: AuditContext, trial_id: int, state: TrialState, value: float | None = None
    ) -> TrialInfo:
        """Finish a running trial: complete (with its finite value), pruned or fail.

        Raises:
            InvalidParameter: complete without a finite value, or a value for another state.
            Conflict: the trial has finished already.
        """
        principal = ctx.require_principal()
        key, number = self._trial(principal, trial_id, Role.MEMBER)
        if state == TrialState.COMPLETE:
            value = rules.finite("value", value)
        elif value is not None:
            raise InvalidParameter("only a complete trial has a value")
        if state not in rules.FINISHED:
            raise InvalidParameter("a trial is told complete, pruned or fail")
        self._finish(key, trial_id, number, state, value, "told")
        self._record(ctx, f"trial:{trial_id}", state=state.value, value=value)
        return self.get_trial(principal, trial_id)

    def _finish(
        self, key: str, trial_id: int, number: int, state: TrialState, value: float | None,
        reason: str,
    ) -> None:  # fmt: skip
        self._running(trial_id)
        target = optuna.trial.TrialState[state.name]
        with self._lock:
            self._storage.set_trial_system_attr(trial_id, glue.ATTR_REASON, reason)
            try:
                self._study(key).tell(number, value if target.is_finished() and value is not None
                                      else None, state=target)  # fmt: skip
            except (RuntimeError, ValueError) as exc:
                raise Conflict(f"trial {trial_id} cannot be told {state.value}") from exc

    # ------------------------------------------------------------------ stale trials
    def fail_stale_trials(self, study: optuna.Study | None = None) -> list[TrialInfo]:
        """Finish running trials whose job has ended (or vanished); return what changed.

        A trial told to prune (by :meth:`report`) becomes pruned; one whose job
        succeeded and that reported a value becomes complete with its last reported
        value (a script that reports but never tells); every other one fails.
        Trials without a job yet are left alone. Safe to call from any process; nothing
        to do on an install without the tune extra.
        """
        if not self.available:
            return []
        changed = []
        for each in self._studies_to_check(study):
            running = each.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            jobs = {t._trial_id: t.system_attrs.get(glue.ATTR_JOB) for t in running}
            status = self._jobs([str(j) for j in jobs.values() if j])
            for trial in running:
                job = jobs[trial._trial_id]
                if not job or (job in status and not status[job].ended):
                    continue
                changed.append(self._settle(each, trial, status.get(str(job))))
        return [c for c in changed if c is not None]

    def _studies_to_check(self, study: optuna.Study | None) -> list[optuna.Study]:
        """``study``, else every study: none while Optuna's tables are missing."""
        if study is not None:
            return [study]
        if self._no_studies_yet():
            return []
        return [self._study(s.study_name) for s in self._storage.get_all_studies()]

    def _settle(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, job: JobStatus | None
    ) -> TrialInfo | None:
        state, value = TrialState.FAIL, None
        reason = f"job {job.state}" if job else "job vanished"
        if glue.ATTR_PRUNE_ANSWER in trial.system_attrs:
            state = TrialState.PRUNED
        elif job is not None and job.state == "succeeded" and trial.intermediate_values:
            state, value = TrialState.COMPLETE, trial.intermediate_values[trial.last_step or 0]
        try:
            self._finish(study.study_name, trial._trial_id, trial.number, state, value, reason)
        except Conflict:
            return None  # finished meanwhile
        logger.info("trial %s of %s: %s (%s)", trial.number, study.study_name, state, reason)
        self._db.run(lambda s: self._audit.append(
            s, actor="platform", action="tune.trial.settle", target=f"trial:{trial._trial_id}",
            outcome="ok", detail={"state": state.value, "reason": reason},
        ))  # fmt: skip
        team, name = study.study_name.split("/", 1)
        return glue.trial_info(self._storage.get_trial(trial._trial_id), name, team)
