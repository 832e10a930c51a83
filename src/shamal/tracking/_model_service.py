"""Rules of logged models (MLflow 3): create pending, upload, finalize, link to runs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from shamal.db import Database
from shamal.errors import InvalidParameter
from shamal.security import AuditContext, AuditLog, Principal, Role
from shamal.tracking import _store
from shamal.tracking._access import RunAccess, UnknownExperiments
from shamal.tracking._entities import LOGGED_MODEL_STATUSES, LoggedModel, LoggedModelSpec, Page
from shamal.tracking._filters import (
    LOGGED_MODELS,
    decode_page_token,
    parse_dataset_filters,
    parse_filter,
    parse_order_by_objects,
)
from shamal.tracking._paging import check_page_size, page_of
from shamal.tracking._search import logged_models_query

#: A stock server's page size when a search names none (or 0) ...
DEFAULT_LOGGED_MODEL_RESULTS = 100
#: ... and it has no cap of its own: the proto field's int32 range is the only one.
MAX_LOGGED_MODEL_RESULTS = 2**31 - 1


class LoggedModelService:
    """Logged models live in an experiment and follow its access rules."""

    def __init__(self, db: Database, audit: AuditLog, tracking: RunAccess) -> None:
        self._db = db
        self._audit = audit
        self._tracking = tracking

    def get(self, principal: Principal, model_id: str, needed: Role = Role.VIEWER) -> LoggedModel:
        with self._db.unit_of_work(write=False) as s:
            model, team_id = _store.logged_model_row(s, model_id)
        principal.require_owner_role(team_id, needed, f"Logged model '{model_id}'")
        return model

    def create(self, ctx: AuditContext, experiment_id: str, spec: LoggedModelSpec) -> LoggedModel:
        principal = ctx.require_principal()
        self._tracking.experiment(principal, experiment_id, Role.MEMBER)
        if spec.source_run_id:
            self._tracking.run_info(principal, spec.source_run_id, Role.MEMBER)
        ctx.target = f"experiment:{experiment_id}/logged_model"

        def work(s: Session) -> LoggedModel:
            model = _store.insert_logged_model(
                s, experiment_id, spec, principal.name, self._tracking.now_ms()
            )
            self._audit.record(s, ctx, f"logged_model:{model.model_id}", name=spec.name)
            return model

        return self._db.run(work)

    def finalize(self, ctx: AuditContext, model_id: str, status: str) -> LoggedModel:
        """Set a logged model's status: any value of the proto enum, as on a stock server
        (``MlflowClient().finalize_logged_model(id, LoggedModelStatus.PENDING)`` included).

        Raises:
            InvalidParameter: a status that is not one of ``LOGGED_MODEL_STATUSES``.
            NotFound: no such model.
        """
        if status not in LOGGED_MODEL_STATUSES:
            raise InvalidParameter(
                "status must be one of " + ", ".join(LOGGED_MODEL_STATUSES) + "."
            )
        principal = ctx.require_principal()
        self.get(principal, model_id, Role.MEMBER)
        self._change(ctx, model_id, {"status": status})
        return self.get(principal, model_id)

    def delete(self, ctx: AuditContext, model_id: str) -> None:
        self.get(ctx.require_principal(), model_id, Role.MAINTAINER)
        self._change(ctx, model_id, {"lifecycle_stage": "deleted"})

    def _change(self, ctx: AuditContext, model_id: str, values: dict[str, object]) -> None:
        ctx.target = f"logged_model:{model_id}"
        values["last_updated_timestamp_ms"] = self._tracking.now_ms()

        def work(s: Session) -> None:
            _store.update_logged_model(s, model_id, values)
            self._audit.record(s, ctx, ctx.target, **{k: str(v) for k, v in values.items()})

        self._db.run(work)

    def set_tags(self, principal: Principal, model_id: str, tags: dict[str, str]) -> LoggedModel:
        self.get(principal, model_id, Role.MEMBER)
        self._db.run(lambda s: _store.set_logged_model_tags(s, model_id, tags))
        return self.get(principal, model_id)

    def delete_tag(self, principal: Principal, model_id: str, key: str) -> None:
        self.get(principal, model_id, Role.MEMBER)
        self._db.run(lambda s: _store.delete_logged_model_tag(s, model_id, key))

    def log_params(self, principal: Principal, model_id: str, params: dict[str, str]) -> None:
        self.get(principal, model_id, Role.MEMBER)
        self._db.run(lambda s: _store.set_logged_model_params(s, model_id, params))

    def search(
        self,
        principal: Principal,
        *,
        experiment_ids: Sequence[str],
        filter_string: str | None,
        order_by: Sequence[object],
        max_results: int,
        page_token: str | None,
        datasets: object = None,
        unknown_experiments: UnknownExperiments = "error",
    ) -> Page[LoggedModel]:
        """One page of the logged models of the experiments that match the filter.

        Args:
            order_by: objects ``{"field_name", "ascending", "dataset_name",
                "dataset_digest"}``, as the MLflow client sends them
                (see :func:`~shamal.tracking._filters.parse_order_by_objects`).
            max_results: the page size, 1 to ``MAX_LOGGED_MODEL_RESULTS``.
            datasets: ``[{"dataset_name", "dataset_digest"}]`` as the MLflow client sends
                them: metric clauses count only the points logged against one of these
                datasets, and without metric clauses a model needs a metric logged
                against one (see :func:`~shamal.tracking._filters.parse_dataset_filters`).

        Raises:
            InvalidParameter: a bad page size, filter, datasets, order, page token or
                experiment id.
            NotFound: see :meth:`TrackingService.searched_experiment_ids`.
        """
        check_page_size(max_results, MAX_LOGGED_MODEL_RESULTS)
        ids = self._tracking.searched_experiment_ids(principal, experiment_ids, unknown_experiments)
        query = logged_models_query(
            ids,
            parse_filter(filter_string, LOGGED_MODELS),
            parse_order_by_objects(order_by, LOGGED_MODELS),
            parse_dataset_filters(datasets),
        )
        offset = decode_page_token(page_token)
        with self._db.unit_of_work(write=False) as s:
            items = _store.page_of_logged_models(s, query, offset, max_results + 1)
        return page_of(items, offset, max_results)
