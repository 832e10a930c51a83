"""Rules of logged models (MLflow 3): create pending, upload, finalize, link to runs."""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy.orm import Session

from shamal.db import Database
from shamal.errors import InvalidParameter, NotFound, PermissionDenied
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
#: The tag listing the registered versions made from a logged model, as MLflow names it.
MODEL_VERSIONS_TAG = "mlflow.modelVersions"
#: What a ``source_run_id`` may be: an id minted by some MLflow server (it is stored as given).
_RUN_ID_RE = re.compile(r"[A-Za-z0-9_\-]{1,32}")


def unnamed_model_name() -> str:
    """The name of a logged model created without one: unique, as a stock server's random
    names are, so that searches by name never mix two unnamed models."""
    return f"model-{secrets.token_hex(6)}"


class LoggedModelService:
    """Logged models live in an experiment and follow its access rules."""

    def __init__(self, db: Database, audit: AuditLog, tracking: RunAccess) -> None:
        self._db = db
        self._audit = audit
        self._tracking = tracking

    def get(self, principal: Principal, model_id: str, needed: Role = Role.VIEWER) -> LoggedModel:
        with self._db.unit_of_work(write=False) as s:
            model, team_id = _store.logged_model_row(s, model_id)
        principal.require_owner_role(
            team_id,
            needed,
            f"Logged model '{model_id}'",
            missing=f"Logged model with ID '{model_id[:80]}' not found.",
        )
        return model

    def create(self, ctx: AuditContext, experiment_id: str, spec: LoggedModelSpec) -> LoggedModel:
        """A pending logged model in the experiment (member); one without a name gets a
        unique generated one.

        ``source_run_id`` is kept as given, as a stock server keeps it; the link is verified
        only when the caller may write that run. A run that does not exist, or that the
        caller may not write (another team's run answers just as an unknown one does), is
        taken as a claim: ``source_run_verified`` is False and lineage does not follow it.

        Raises:
            InvalidParameter: a ``source_run_id`` that is not an id.
            NotFound: no such experiment, or not visible.
        """
        principal = ctx.require_principal()
        self._tracking.experiment(principal, experiment_id, Role.MEMBER)
        if not spec.name:
            spec = replace(spec, name=unnamed_model_name())
        if spec.source_run_id:
            verified = self._may_claim_run(principal, spec.source_run_id)
            spec = replace(spec, source_run_verified=verified)
        ctx.target = f"experiment:{experiment_id}/logged_model"

        def work(s: Session) -> LoggedModel:
            model = _store.insert_logged_model(
                s, experiment_id, spec, principal.name, self._tracking.now_ms()
            )
            self._audit.record(s, ctx, f"logged_model:{model.model_id}", name=spec.name)
            return model

        return self._db.run(work)

    def _may_claim_run(self, principal: Principal, run_id: str) -> bool:
        """Whether a logged model may be linked to ``run_id`` as its verified source."""
        if not _RUN_ID_RE.fullmatch(run_id):
            raise InvalidParameter("Parameter 'source_run_id' is not a valid id.")
        try:
            self._tracking.run_info(principal, run_id, Role.MEMBER)
        except (NotFound, PermissionDenied):
            return False
        return True

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

    def record_model_version(
        self, principal: Principal, model_id: str, name: str, version: int
    ) -> None:
        """Add ``{name, version}`` to the model's ``mlflow.modelVersions`` tag (a JSON
        list), as a stock server does when a version is registered from a logged model.

        The registry has already checked the version's creation (it read this model to
        make it), so reading the model (viewer) is enough: the tag records a fact of the
        registry, not a change the caller chose.

        Raises:
            NotFound: no such model, or not visible.
        """
        self.get(principal, model_id)
        entry = {"name": name, "version": version}
        self._db.run(lambda s: _store.append_to_tag_list(s, model_id, MODEL_VERSIONS_TAG, entry))

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
