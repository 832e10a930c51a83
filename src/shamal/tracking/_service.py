"""Rules of experiment tracking: experiments, runs and what is logged to them.

Shared by the MLflow-dialect router and the native router. Access follows the
experiment: an experiment created with the tag ``shamal.team`` belongs to that
team (viewers read, members write, maintainers delete); one without it is open
to every account, as on a stock MLflow server.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sqlalchemy.orm import Session

from shamal.artifacts import ArtifactService, safe_relpath
from shamal.clock import Clock, utc_now
from shamal.db import Database
from shamal.errors import InvalidParameter, ShamalError
from shamal.security import AuditContext, AuditLog, Principal, Role, SecurityService
from shamal.tracking import _store
from shamal.tracking._access import UnknownExperiments
from shamal.tracking._artifact_service import RunArtifacts
from shamal.tracking._entities import (
    RUN_STATUSES,
    DatasetInput,
    Experiment,
    HistoryRow,
    Metric,
    Page,
    Run,
    RunInfo,
)
from shamal.tracking._filters import (
    EXPERIMENTS,
    RUNS,
    decode_page_token,
    parse_filter,
    parse_order_by,
)
from shamal.tracking._model_service import LoggedModelService
from shamal.tracking._paging import (
    check_page_size,
    decode_history_token,
    history_page,
    page_of,
)
from shamal.tracking._sampling import MAX_SAMPLED_POINTS
from shamal.tracking._search import experiments_query, runs_query

logger = logging.getLogger(__name__)

TEAM_TAG = "shamal.team"
#: The run tag that holds a run's name: setting it renames the run, as on a stock server.
RUN_NAME_TAG = "mlflow.runName"
MAX_KEY = 250
MAX_RUN_NAME = 250
#: Longer param values and run tag values are cut to these lengths, as a stock server does
#: by default (``MLFLOW_TRUNCATE_LONG_VALUES``; its ``MAX_PARAM_VAL_LENGTH`` and
#: ``MAX_TAG_VAL_LENGTH``); both columns are TEXT.
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_EXPERIMENT_TAG_VALUE = 20_000
MAX_BATCH = {"metrics": 1000, "params": 100, "tags": 100, "total": 1000}
#: The most runs one sampled history read names, as on a stock server.
MAX_SAMPLED_RUNS = 100
#: ``experiments/search-datasets``: experiments a call names, summaries it answers (stock).
MAX_DATASET_SEARCH_EXPERIMENTS = 20
MAX_DATASET_SUMMARIES = 1000
MAX_SEARCH = {"runs": 50_000, "experiments": 50_000, "history": 1_000_000}
_KEY_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,250}$")
LifecycleView = Literal["active", "deleted", "all"]
MAX_EXPERIMENT_ID_DIGITS = 18
VIEW_TYPES: dict[str, LifecycleView] = {
    "ACTIVE_ONLY": "active",
    "DELETED_ONLY": "deleted",
    "ALL": "all",
    "1": "active",
    "2": "deleted",
    "3": "all",
}


def check_key(kind: str, key: str) -> str:
    """Metric, param and tag names: 1-250 printable characters, no path traversal."""
    if not _KEY_RE.fullmatch(key) or key.startswith("/") or ".." in key.split("/"):
        raise InvalidParameter(
            f"Invalid {kind} name: '{key[:250]}'. Names may be up to 250 printable characters "
            "and may not start with '/' or contain '..' path segments."
        )
    return key


def check_printable(what: str, name: str) -> str:
    """Names shown to people refuse control and invisible characters (ESC, CR, bidi
    overrides), as registered-model names do: printed, they could drive a terminal or
    disguise one name as another."""
    if not name.isprintable():
        raise InvalidParameter(f"Invalid {what}: it contains control or invisible characters.")
    return name


def check_value(kind: str, key: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidParameter(
            f"{kind} '{key}' had length {len(value)}, which exceeded length limit of {limit}"
        )
    return value


def truncate_value(kind: str, key: str, value: str, limit: int) -> str:
    """A param or run tag value cut to ``limit`` characters, as a stock server cuts it."""
    if len(value) <= limit:
        return value
    logger.warning(
        "%s '%s' value (%d characters) truncated to %d characters.",
        kind,
        key,
        len(value),
        limit,
    )
    return value[:limit]


def renamed_to(tags: Sequence[tuple[str, str]]) -> str | None:
    """The run name that setting ``tags`` gives a run: the last non-empty value of
    ``mlflow.runName`` among them, or None (an empty value leaves the name as it is).

    Raises:
        InvalidParameter: the name is longer than a run name may be.
    """
    name = None
    for key, value in tags:
        if key == RUN_NAME_TAG and value:
            name = value
    if name is not None:
        check_value("Run name", RUN_NAME_TAG, name, MAX_RUN_NAME)
    return name


def truncate_tag_value(key: str, value: str) -> str:
    """A run tag value cut to ``MAX_TAG_VALUE`` characters."""
    return truncate_value("Tag", key, value, MAX_TAG_VALUE)


def view_type(value: str | None) -> LifecycleView:
    if value is None or value == "":
        return "active"
    try:
        return VIEW_TYPES[str(value).upper()]
    except KeyError:
        raise InvalidParameter(f"Invalid view type '{str(value)[:40]}'.") from None


@dataclass(frozen=True, slots=True)
class LoggedData:
    """One ``log-batch``: metrics, params and tags for one run."""

    metrics: Sequence[Metric] = ()
    params: Sequence[tuple[str, str]] = ()
    tags: Sequence[tuple[str, str]] = ()

    def checked(self) -> LoggedData:
        """The batch as it is stored: checked, with param values over ``MAX_PARAM_VALUE``
        and run tag values over ``MAX_TAG_VALUE`` truncated (see :func:`truncate_value`).

        Raises:
            InvalidParameter: too many items, a bad key.
        """
        total = len(self.metrics) + len(self.params) + len(self.tags)
        for name, count in (
            ("metrics", len(self.metrics)),
            ("params", len(self.params)),
            ("tags", len(self.tags)),
            ("total", total),
        ):
            if count > MAX_BATCH[name]:
                raise InvalidParameter(
                    f"A batch logging request can contain at most {MAX_BATCH[name]} {name}; "
                    f"got {count}."
                )
        for key in dict.fromkeys(m.key for m in self.metrics):  # a batch repeats its keys
            check_key("metric", key)
        for key, _ in self.params:
            check_key("param", key)
        for key, _ in self.tags:
            check_key("tag", key)
        if all(len(v) <= MAX_PARAM_VALUE for _, v in self.params) and all(
            len(v) <= MAX_TAG_VALUE for _, v in self.tags
        ):
            return self
        return replace(
            self,
            params=[(k, truncate_value("Param", k, v, MAX_PARAM_VALUE)) for k, v in self.params],
            tags=[(k, truncate_tag_value(k, v)) for k, v in self.tags],
        )


class TrackingService:
    """Experiments, runs and their data. Thread-safe; one per process."""

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        security: SecurityService,
        artifacts: ArtifactService,
        clock: Clock = utc_now,
    ) -> None:
        self._db = db
        self._audit = audit
        self._security = security
        self._clock = clock
        self.models = LoggedModelService(db, audit, self)
        self.files = RunArtifacts(artifacts, self)

    def now_ms(self) -> int:
        return int(self._clock().timestamp() * 1000)

    # ------------------------------------------------------------------ access
    def _team_for_new(self, principal: Principal, tags: dict[str, str]) -> str | None:
        team = tags.get(TEAM_TAG)
        if not team:
            return None
        return self._security.authorize_team(principal, team, Role.MEMBER).id

    def experiment(
        self, principal: Principal, experiment_id: str, needed: Role = Role.VIEWER
    ) -> Experiment:
        with self._db.unit_of_work(write=False) as s:
            exp = _store.get_experiment(s, experiment_id)
        principal.require_owner_role(
            exp.team_id,
            needed,
            f"Experiment {experiment_id}",
            missing=f"No Experiment with id={experiment_id} exists",
        )
        return exp

    def run_info(self, principal: Principal, run_id: str, needed: Role = Role.VIEWER) -> RunInfo:
        with self._db.unit_of_work(write=False) as s:
            info, team_id = _store.run_row(s, run_id)
        principal.require_owner_role(
            team_id, needed, f"Run '{run_id}'", missing=f"Run with id={run_id} not found"
        )
        return info

    def searched_experiment_ids(
        self,
        principal: Principal,
        experiment_ids: Sequence[str],
        unknown: UnknownExperiments = "error",
    ) -> list[int]:
        """The experiments a search covers, checked for reading.

        Raises:
            NotFound: with ``unknown="error"``, an experiment that does not exist or that
                the principal cannot see.
            InvalidParameter: with ``unknown="skip"``, an id that is not an integer.
        """
        if unknown == "error":
            return [int(self.experiment(principal, e).experiment_id) for e in experiment_ids]
        wanted: list[int] = []
        for value in experiment_ids:
            digits = value.removeprefix("-")
            if not digits.isascii() or not digits.isdigit():
                raise InvalidParameter(
                    f"Invalid experiment ID '{value[:40]}'. Experiment ID must be a valid integer."
                )
            if digits == value and len(digits) <= MAX_EXPERIMENT_ID_DIGITS:
                wanted.append(int(digits))  # others (negative, huge) cannot exist
        with self._db.unit_of_work(write=False) as s:
            return _store.readable_experiment_ids(s, wanted, visible_teams(principal))

    def _active_run(self, principal: Principal, run_id: str) -> RunInfo:
        info = self.run_info(principal, run_id, Role.MEMBER)
        if info.lifecycle_stage != "active":
            raise InvalidParameter(
                f"The run {run_id} must be in the 'active' state. "
                f"Current state is {info.lifecycle_stage}."
            )
        return info

    # ------------------------------------------------------------------ experiments
    def create_experiment(
        self,
        ctx: AuditContext,
        name: str,
        tags: dict[str, str],
        artifact_location: str | None = None,
    ) -> Experiment:
        """Create an experiment. Its artifact location is always chosen by the server."""
        if not name or len(name) > 256:
            raise InvalidParameter("Experiment name must be 1 to 256 characters.")
        check_printable("experiment name", name)
        if artifact_location:
            raise InvalidParameter(
                "artifact_location is chosen by the server (mlflow-artifacts:/<id>); omit it."
            )
        for key, value in tags.items():
            check_value("Tag", check_key("tag", key), value, MAX_EXPERIMENT_TAG_VALUE)
        team_id = self._team_for_new(ctx.require_principal(), tags)
        ctx.target = f"experiment:{name}"

        def work(s: Session) -> Experiment:
            exp = _store.insert_experiment(s, name, tags, team_id, self.now_ms())
            self._audit.record(s, ctx, f"experiment:{exp.experiment_id}", name=name)
            return exp

        return self._db.run(work)

    def experiment_by_name(self, principal: Principal, name: str) -> Experiment:
        with self._db.unit_of_work(write=False) as s:
            exp = _store.get_experiment_by_name(s, name)
        principal.require_owner_role(
            exp.team_id,
            Role.VIEWER,
            f"experiment '{name}'",
            missing=f"Could not find experiment with name '{name}'",
        )
        return exp

    def search_experiments(
        self,
        principal: Principal,
        *,
        filter_string: str | None,
        order_by: Sequence[str],
        view: LifecycleView,
        max_results: int,
        page_token: str | None,
    ) -> Page[Experiment]:
        check_page_size(max_results, MAX_SEARCH["experiments"])
        query = experiments_query(
            parse_filter(filter_string, EXPERIMENTS), parse_order_by(order_by, EXPERIMENTS), view
        )
        query = _store.visible_experiments(query, visible_teams(principal))
        offset = decode_page_token(page_token)
        with self._db.unit_of_work(write=False) as s:
            items = _store.page_of_experiments(s, query, offset, max_results + 1)
        return page_of(items, offset, max_results)

    def update_experiment(self, ctx: AuditContext, experiment_id: str, new_name: str) -> None:
        if not new_name or len(new_name) > 256:
            raise InvalidParameter("Experiment name must be 1 to 256 characters.")
        check_printable("experiment name", new_name)
        self._change_experiment(ctx, experiment_id, Role.MEMBER, name=new_name)

    def set_experiment_lifecycle(self, ctx: AuditContext, experiment_id: str, stage: str) -> None:
        if experiment_id == "0" and stage == "deleted":
            raise InvalidParameter("The Default experiment (id 0) cannot be deleted.")
        self._change_experiment(ctx, experiment_id, Role.MAINTAINER, stage=stage)

    def _change_experiment(
        self,
        ctx: AuditContext,
        experiment_id: str,
        needed: Role,
        *,
        name: str | None = None,
        stage: str | None = None,
    ) -> None:
        self.experiment(ctx.require_principal(), experiment_id, needed)
        ctx.target = f"experiment:{experiment_id}"

        def work(s: Session) -> None:
            _store.update_experiment(s, experiment_id, name=name, stage=stage, now=self.now_ms())
            self._audit.record(s, ctx, ctx.target, **({"name": name} if name else {}))

        self._db.run(work)

    def set_experiment_tag(
        self, ctx: AuditContext, experiment_id: str, key: str, value: str | None
    ) -> None:
        check_key("tag", key)
        if value is not None:
            check_value("Tag", key, value, MAX_EXPERIMENT_TAG_VALUE)
        if key == TEAM_TAG:
            raise InvalidParameter(f"'{TEAM_TAG}' is set when the experiment is created.")
        exp = self.experiment(ctx.require_principal(), experiment_id, Role.MEMBER)
        if exp.lifecycle_stage != "active":
            raise InvalidParameter(
                f"The experiment {experiment_id} must be in the 'active' state. "
                f"Current state is {exp.lifecycle_stage}."
            )
        ctx.target = f"experiment:{experiment_id}/tag:{key}"

        def work(s: Session) -> None:
            _store.set_experiment_tag(s, experiment_id, key, value)
            self._audit.record(s, ctx, ctx.target)

        self._db.run(work)

    # ------------------------------------------------------------------ runs
    def create_run(
        self,
        ctx: AuditContext,
        experiment_id: str,
        run_name: str | None,
        start_time: int | None,
        tags: dict[str, str],
    ) -> Run:
        principal = ctx.require_principal()
        self.experiment(principal, experiment_id, Role.MEMBER)
        tags = dict(LoggedData(tags=list(tags.items())).checked().tags)
        tagged = tags.get(RUN_NAME_TAG)
        if run_name and tagged and tagged != run_name:
            raise InvalidParameter(
                f"Both 'run_name' argument and '{RUN_NAME_TAG}' tag are specified, but with "
                f"different values (run_name='{run_name[:250]}', {RUN_NAME_TAG}='{tagged[:250]}')."
            )
        name = run_name or tagged or f"run-{secrets.token_hex(3)}"
        check_printable("run name", check_value("Run name", "run_name", name, MAX_RUN_NAME))
        tags[RUN_NAME_TAG] = name
        tags.setdefault("mlflow.user", principal.name)

        def work(s: Session) -> Run:
            info = _store.insert_run(
                s, experiment_id, name, principal.name, start_time or self.now_ms(), tags
            )
            self._audit.record(s, ctx, f"run:{info.run_id}", experiment=experiment_id)
            return _store.get_run(s, info.run_id)

        return self._db.run(work)

    def get_run(self, principal: Principal, run_id: str) -> Run:
        self.run_info(principal, run_id)
        with self._db.unit_of_work(write=False) as s:
            return _store.get_run(s, run_id)

    def update_run(
        self,
        ctx: AuditContext,
        run_id: str,
        *,
        status: str | None,
        end_time: int | None,
        run_name: str | None,
    ) -> RunInfo:
        self._active_run(ctx.require_principal(), run_id)
        values: dict[str, object] = {}
        if status:
            if status not in RUN_STATUSES:
                raise InvalidParameter(f"Invalid run status '{status[:40]}'.")
            values["status"] = status
        if end_time is not None:
            values["end_time"] = end_time
        if run_name:
            values["name"] = check_printable(
                "run name", check_value("Run name", "run_name", run_name, MAX_RUN_NAME)
            )
        ctx.target = f"run:{run_id}"

        def work(s: Session) -> RunInfo:
            info = _store.update_run(s, run_id, values) if values else _store.run_row(s, run_id)[0]
            if run_name:
                _store.set_tags(s, run_id, [(RUN_NAME_TAG, run_name)])
            self._audit.record(s, ctx, ctx.target, **{k: str(v) for k, v in values.items()})
            return info

        return self._db.run(work)

    def set_run_lifecycle(self, ctx: AuditContext, run_id: str, stage: str) -> None:
        self.run_info(ctx.require_principal(), run_id, Role.MAINTAINER)
        ctx.target = f"run:{run_id}"
        deleted = self.now_ms() if stage == "deleted" else None

        def work(s: Session) -> None:
            _store.update_run(s, run_id, {"lifecycle_stage": stage, "deleted_time": deleted})
            self._audit.record(s, ctx, ctx.target)

        self._db.run(work)

    def log(self, principal: Principal, run_id: str, data: LoggedData) -> None:
        """Log metrics, params and tags to a run in one transaction (the hot path).

        The run is checked inside the writing transaction: one round of locking, not two.
        """
        data = data.checked()
        new_name = None
        if data.tags:
            new_name = renamed_to(data.tags)
            # An empty name changes nothing, its tag included, as on a stock server.
            tags = [(k, v) for k, v in data.tags if v or k != RUN_NAME_TAG]
            if len(tags) < len(data.tags):
                data = replace(data, tags=tags)

        def work(s: Session) -> None:
            stage, team_id = _store.run_access(s, run_id)
            principal.require_owner_role(
                team_id, Role.MEMBER, f"Run '{run_id}'", missing=f"Run with id={run_id} not found"
            )
            if stage != "active":
                raise InvalidParameter(
                    f"The run {run_id} must be in the 'active' state. Current state is {stage}."
                )
            if new_name is not None:  # the run's row first, as update_run locks: no deadlock
                _store.update_run(s, run_id, {"name": new_name})
            _store.log_params(s, run_id, data.params)
            _store.set_tags(s, run_id, data.tags)
            _store.log_metrics(s, run_id, data.metrics)
            if new_name is not None:
                # A rename is audited however it is spelt, as runs/update audits it; last, as
                # every service records: the audit chain's lock is held only to commit.
                self._audit.append(
                    s,
                    actor=principal.name,
                    action="run.update",
                    target=f"run:{run_id}",
                    outcome="ok",
                    detail={"name": new_name},
                )

        try:
            self._db.run(work)
        except ShamalError as exc:
            if new_name is not None:  # a refused rename is audited, as runs/update's are
                refused = AuditContext(
                    action="run.update",
                    actor=principal.name,
                    principal=principal,
                    target=f"run:{run_id}",
                    detail={"name": new_name},
                )
                self._audit.record_outcome(refused, exc.code.lower())
            raise

    def delete_tag(self, principal: Principal, run_id: str, key: str) -> None:
        self._active_run(principal, run_id)
        self._db.run(lambda s: _store.delete_tag(s, run_id, key))

    def log_inputs(
        self,
        principal: Principal,
        run_id: str,
        datasets: Sequence[DatasetInput],
        model_ids: Sequence[str],
    ) -> None:
        info = self._active_run(principal, run_id)

        def work(s: Session) -> None:
            _store.log_inputs(s, run_id, info.experiment_id, datasets)
            _store.link_models(s, run_id, [(m, "input", 0) for m in model_ids])

        self._db.run(work)

    def runs_reading(
        self, principal: Principal, uri: str, *, limit: int = 100
    ) -> list[tuple[RunInfo, DatasetInput]]:
        """The runs the caller may see that read the data ``uri`` names (a ``data:/NAME/N``
        version): those with an input whose source is ``{"uri": uri}``, however it was logged
        (``shamal.data``, or the stock client's ``mlflow.log_input``), newest first, at most
        ``limit``, each with the input as logged (its digest says what the run saw).

        Raises:
            InvalidParameter: a limit outside 1..1000, or a blank or overlong URI.
        """
        if not 1 <= limit <= 1000:
            raise InvalidParameter("limit must be between 1 and 1000")
        if not uri or len(uri) > 1000:
            raise InvalidParameter("name the data read with a URI of 1 to 1000 characters")
        with self._db.unit_of_work(write=False) as s:
            return _store.runs_reading(s, uri, visible_teams(principal), limit)

    def dataset_summaries(
        self, principal: Principal, experiment_ids: Sequence[str]
    ) -> list[tuple[str, str, str, str | None]]:
        """(experiment id, name, digest, context) of each dataset the runs of these
        experiments read (those the caller may see; at most 1,000), as a stock server's
        ``experiments/search-datasets`` lists them.

        Raises:
            InvalidParameter: no experiment, more than 20, or an id that is not an integer.
        """
        if not experiment_ids:
            raise InvalidParameter(
                "SearchDatasets request must specify at least one experiment_id."
            )
        if len(experiment_ids) > MAX_DATASET_SEARCH_EXPERIMENTS:
            raise InvalidParameter(
                "SearchDatasets request cannot specify more than "
                f"{MAX_DATASET_SEARCH_EXPERIMENTS} experiment_ids. "
                f"Received {len(experiment_ids)} experiment_ids."
            )
        ids = self.searched_experiment_ids(principal, experiment_ids, "skip")
        with self._db.unit_of_work(write=False) as s:
            return _store.dataset_summaries(s, ids, MAX_DATASET_SUMMARIES)

    def log_outputs(
        self, principal: Principal, run_id: str, outputs: Sequence[tuple[str, int]]
    ) -> None:
        self._active_run(principal, run_id)
        self._db.run(
            lambda s: _store.link_models(s, run_id, [(m, "output", step) for m, step in outputs])
        )

    def metric_history(
        self,
        principal: Principal,
        run_id: str,
        key: str,
        page_token: str | None,
        max_results: int | None,
    ) -> Page[HistoryRow]:
        """One page of a metric's points in (step, timestamp, value) order, as stored rows
        (:data:`HistoryRow`: NaN is value 0.0 with the flag set); the token is the last
        point's, so every page is one index range however deep it starts.
        """
        self.run_info(principal, run_id)
        limit = max_results or MAX_SEARCH["history"]
        if not 1 <= limit <= MAX_SEARCH["history"]:
            raise InvalidParameter(f"max_results must be between 1 and {MAX_SEARCH['history']}.")
        after = decode_history_token(page_token)
        with self._db.unit_of_work(write=False) as s:
            rows = _store.metric_history(s, run_id, key, after, limit + 1)
        return history_page(rows, limit)

    def metric_points(
        self,
        principal: Principal,
        run_id: str,
        key: str,
        first: int | None = None,
        last: int | None = None,
    ) -> list[tuple[int, float]]:
        """Every point of a metric with ``first <= step <= last`` (bounds optional) but its
        NaNs, as ``(step, value)`` in (step, timestamp) order: the web UI's curves, which
        it downsamples itself. One index range; the metric is read whole, so a caller bounds
        the work (the UI holds a search slot)."""
        self.run_info(principal, run_id)
        with self._db.unit_of_work(write=False) as s:
            return _store.metric_points(s, run_id, key, first, last)

    def metric_history_sampled(
        self,
        principal: Principal,
        run_ids: Sequence[str],
        key: str,
        steps: tuple[int | None, int | None],
        max_results: int = MAX_SAMPLED_POINTS,
    ) -> list[Metric]:
        """Each run's history of ``key`` sampled to at most ``max_results`` points, as a
        stock server samples ``get-history-bulk-interval`` (by point, both ends kept; see
        :mod:`shamal.tracking._sampling`), run after run in the order given.

        Args:
            steps: (start, end) inclusive, both or neither.

        Raises:
            InvalidParameter: no runs or more than 100, ``max_results`` outside 1..2500, one
                end of the step range without the other, or a start after the end (each
                in a stock server's words).
            NotFound: a run that does not exist or that the caller cannot see.
        """
        _check_sampled_read(run_ids, steps, max_results)
        for run_id in run_ids:
            self.run_info(principal, run_id)
        start, end = steps
        bounds = None if start is None or end is None else (start, end)
        with self._db.unit_of_work(write=False) as s:
            return [
                point
                for run_id in run_ids
                for point in _store.sampled_metric_history(s, run_id, key, bounds, max_results)
            ]

    def search_runs(
        self,
        principal: Principal,
        *,
        experiment_ids: Sequence[str],
        filter_string: str | None,
        view: LifecycleView,
        max_results: int,
        order_by: Sequence[str],
        page_token: str | None,
        unknown_experiments: UnknownExperiments = "error",
    ) -> Page[Run]:
        """One page of the runs of the experiments that match the filter.

        Raises:
            InvalidParameter: a bad page size, filter, order, page token or experiment id.
            NotFound: see :meth:`searched_experiment_ids`.
        """
        check_page_size(max_results, MAX_SEARCH["runs"])
        ids = self.searched_experiment_ids(principal, experiment_ids, unknown_experiments)
        query = runs_query(
            ids, parse_filter(filter_string, RUNS), parse_order_by(order_by, RUNS), view
        )
        offset = decode_page_token(page_token)
        with self._db.unit_of_work(write=False) as s:
            items = _store.page_of_runs(s, query, offset, max_results + 1)
        return page_of(items, offset, max_results)

    # ------------------------------------------------------------------ artifacts and sources
    def run_artifact_uri(self, principal: Principal, run_id: str, path: str) -> str:
        info = self.run_info(principal, run_id)
        clean = safe_relpath(path) if path.strip("/") else ""
        return f"{info.artifact_uri}/{clean}" if clean else info.artifact_uri

    def logged_model_run(self, principal: Principal, model_id: str) -> str | None:
        """See :class:`shamal.registry.ModelSources`: a verified source run only."""
        model = self.models.get(principal, model_id)
        return model.source_run_id if model.source_run_verified else None

    def resolve_model_source(self, principal: Principal, source: str) -> str:
        """Where a model version's files are: only URIs Shamal minted, readable by the caller.

        Accepts ``runs:/<run_id>/<path>``, ``models:/<logged model id>`` and
        ``mlflow-artifacts:/<experiment id>/<path>``; everything else is refused
        (file:, s3:, http:, other schemes, traversal in any encoding).
        """
        if source.startswith("runs:/"):
            run_id, _, path = source.removeprefix("runs:/").partition("/")
            return self.run_artifact_uri(principal, run_id, path)
        if source.startswith("models:/m-"):
            model = self.models.get(principal, source.removeprefix("models:/"))
            return model.artifact_location
        if source.startswith(_store.ARTIFACT_SCHEME) and not source.startswith(
            _store.ARTIFACT_SCHEME + "/"
        ):
            path = safe_relpath(source.removeprefix(_store.ARTIFACT_SCHEME))
            self.experiment(principal, path.split("/", 1)[0])
            return f"{_store.ARTIFACT_SCHEME}{path}"
        raise InvalidParameter(
            "Model version sources must be runs:/<run_id>/<path>, models:/<model_id> or an "
            "mlflow-artifacts:/ location of this server."
        )


def _check_sampled_read(
    run_ids: Sequence[str], steps: tuple[int | None, int | None], max_results: int
) -> None:
    if not run_ids:
        raise InvalidParameter("Missing value for required parameter 'run_ids'.")
    if len(run_ids) > MAX_SAMPLED_RUNS:
        raise InvalidParameter(
            f"GetMetricHistoryBulkInterval request must specify at most {MAX_SAMPLED_RUNS} "
            f"run_ids. Received {len(run_ids)} run_ids."
        )
    if not 1 <= max_results <= MAX_SAMPLED_POINTS:
        raise InvalidParameter(f"max_results must be between 1 and {MAX_SAMPLED_POINTS}.")
    start, end = steps
    if (start is None) != (end is None):
        raise InvalidParameter(
            "If either start step or end step are specified, both must be specified."
        )
    if start is not None and end is not None and start > end:
        raise InvalidParameter(
            "end_step must be greater than start_step. "
            f"Found start_step={start} and end_step={end}."
        )


def visible_teams(principal: Principal) -> list[str] | None:
    """Team ids whose objects the principal sees; None for admins (everything)."""
    return None if principal.user.is_admin else list(principal.team_ids.values())
