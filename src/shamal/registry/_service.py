"""Rules of the model registry: who may do what, and every change audited in its transaction.

Access: a registered model created with the tag ``shamal.team`` = <team> belongs
to that team (the creator must be a member or more of it). On a team's model
viewers read, members write (descriptions, tags, versions, stages, aliases,
renames) and maintainers delete. Models without a team are open to every
authenticated account. Another team's model answers 404, as if it did not
exist, and is left out of searches; so does a model whose team was deleted,
for everyone but platform admins. Platform admins see and do everything.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sqlalchemy.orm import Session

from shamal.artifacts import safe_relpath
from shamal.clock import Clock, utc_now
from shamal.db import Database
from shamal.errors import InvalidParameter, NotFound
from shamal.events import EventKind, NewEvent, emit
from shamal.registry import _rules, _store
from shamal.registry._card import MAX_MLMODEL_BYTES, MLMODEL, ModelCard, parse_mlmodel
from shamal.registry._entities import (
    TEAM_TAG,
    ModelRef,
    ModelVersion,
    Page,
    RegisteredModel,
    Stage,
    VersionStatus,
)
from shamal.security import AuditContext, AuditLog, Principal, Role, check_name
from shamal.tracking import (
    MAX_PAGE_OFFSET,
    MODEL_VERSIONS,
    REGISTERED_MODELS,
    Run,
    decode_page_token,
    encode_page_token,
    parse_filter,
    parse_order_by,
)

logger = logging.getLogger(__name__)

#: ``max_results`` of registered-model searches: MLflow's default and cap.
MODELS_PAGE_DEFAULT, MODELS_PAGE_MAX = 100, 1000
#: ``max_results`` of model-version searches: MLflow's default and cap.
VERSIONS_PAGE_DEFAULT, VERSIONS_PAGE_MAX = 200_000, 200_000
_RUN_ID_LENGTH, _MODEL_ID_LENGTH = 32, 64


class ModelSources(Protocol):
    """Resolves the ``source`` of a new model version to where its files are.

    Accepts only URIs Shamal minted (``runs:/<run_id>/<path>``, ``models:/<logged model id>``,
    ``mlflow-artifacts:/<path>`` inside the artifact store) that the principal may read.

    Raises:
        InvalidParameter: any other URI (hostile-inputs.md §2), a malformed path.
        NotFound: the run / logged model does not exist or is not visible.
    """

    def resolve_model_source(self, principal: Principal, source: str) -> str: ...

    def logged_model_run(self, principal: Principal, model_id: str) -> str | None:
        """The run that produced a logged model (None if it names none, or names a run
        its creator could not read: such a link is unverified and no lineage).

        Raises:
            NotFound: no such logged model, or not visible to the principal.
        """
        ...


class RunRecords(Protocol):
    """The runs a version's lineage leads to (the tracking service)."""

    def get_run(self, principal: Principal, run_id: str) -> Run:
        """The run, with the datasets it read.

        Raises:
            NotFound: no such run, or not visible to the principal.
        """
        ...


class ArtifactFiles(Protocol):
    """Reads the files behind ``mlflow-artifacts:/`` locations, with the caller's access."""

    def download(self, principal: Principal, path: str) -> tuple[Any, Iterable[bytes]]:
        """(file info, its chunks) of ``<experiment id>/<path>``.

        Raises:
            NotFound: no such file, or not visible to the principal.
        """
        ...


@dataclass(frozen=True, slots=True)
class DatasetUse:
    """A dataset a version's run read: what it is, and the run's ``mlflow.data.context``."""

    name: str
    digest: str
    source_type: str
    source: str
    context: str | None


@dataclass(frozen=True, slots=True)
class VersionLineage:
    """Where a version came from: its logged model, the run that made it and what that run
    read. ``run_visible`` is False when the version names a run the caller cannot see (or
    that was deleted): the chain stops there, saying so rather than leaking anything.
    ``run_verified`` is False when the run was only claimed (see
    :attr:`ModelVersion.run_verified`): the chain stops there too, whoever asks."""

    version: ModelVersion
    run_id: str | None
    run_name: str | None
    experiment_id: str | None
    run_visible: bool
    datasets: tuple[DatasetUse, ...]
    run_verified: bool = True


_ARTIFACTS = "mlflow-artifacts:/"
_CONTEXT_TAG = "mlflow.data.context"


def _registry_reference(source: str) -> tuple[str, str | None, str | None] | None:
    """``models:/<name>/<version or latest>`` or ``models:/<name>@<alias>`` as (name, version,
    alias); None for anything else (``models:/<logged model id>`` included)."""
    if not source.startswith("models:/"):
        return None
    rest = source.removeprefix("models:/")
    if "@" in rest:
        name, _, alias = rest.rpartition("@")
        return name, None, alias
    if "/" in rest:
        name, _, version = rest.rpartition("/")
        return name, version, None
    return None


def _model_target(name: str) -> str:
    return f"registered_model:{name}"


def _version_target(name: str, version: int) -> str:
    return f"model_version:{name}/{version}"


def _emit(
    s: Session,
    ref: ModelRef,
    ctx: AuditContext,
    kind: EventKind,
    subject: str,
    payload: dict[str, Any],
) -> None:
    """The change's event, in its transaction; the model's team decides who sees it."""
    team = _store.load_model(s, ref).team if ref.team_id is not None else None
    emit(s, NewEvent(kind, subject, team, ctx.actor, payload))


def _visibility(principal: Principal) -> _store.Visibility:
    return None if principal.user.is_admin else frozenset(principal.team_ids.values())


def _next_token(offset: int, limit: int, more: bool) -> str | None:
    if not more or offset + limit > MAX_PAGE_OFFSET:
        return None
    return encode_page_token(offset + limit)


def check_max_results(value: int, cap: int) -> int:
    if not 1 <= value <= cap:
        raise InvalidParameter(f"max_results must be between 1 and {cap}.")
    return value


class RegistryService:
    """Registered models, their versions, tags, stages and aliases.

    Thread-safe; one instance per process. Reads take a :class:`Principal`;
    changes take the request's :class:`AuditContext` and record their audit
    entry in the transaction that makes the change. Every method raises
    ``NotFound`` for a model (or version) that does not exist or that the
    caller may not see, ``PermissionDenied`` for a role too low on a model it
    can see, and ``InvalidParameter`` for malformed input.
    """

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        sources: ModelSources,
        clock: Clock = utc_now,
        *,
        files: ArtifactFiles | None = None,
        runs: RunRecords | None = None,
    ) -> None:
        self._db = db
        self._audit = audit
        self._sources = sources
        self._clock = clock
        self._files = files
        self._runs = runs

    # ------------------------------------------------------------------ helpers
    @contextmanager
    def _reading(self) -> Iterator[Session]:
        """A read-only transaction that sees one snapshot from start to end."""
        with self._db.unit_of_work(write=False) as s:
            _store.read_snapshot(s)
            yield s

    def _now_ms(self) -> int:
        return int(self._clock().timestamp() * 1000)

    @staticmethod
    def _access(
        s: Session, principal: Principal, name: str, needed: Role, *, lock: bool = False
    ) -> ModelRef:
        """The model, if ``principal`` holds ``needed`` on it (``lock``: its row lock)."""
        if not name:
            raise InvalidParameter("Missing value for required parameter 'name'.")
        ref = _store.find_model(s, name, lock=lock)
        if ref.orphaned and not principal.user.is_admin:
            raise _store.model_not_found(name)
        principal.require_owner_role(
            ref.team_id,
            needed,
            f"registered model {name!r}",
            missing=_store.model_not_found(name).message,
        )
        return ref

    @staticmethod
    def _team_of_new_model(principal: Principal, tags: Mapping[str, str]) -> str | None:
        team = tags.get(TEAM_TAG)
        if team is None:
            return None
        check_name("team", team)
        principal.require_team_role(team, Role.MEMBER)
        team_id = principal.team_ids.get(team)
        if team_id is None:  # a platform admin outside the team
            raise InvalidParameter(
                f"to create a model for team {team!r}, be a member (or more) of that team"
            )
        return team_id

    # ------------------------------------------------------------------ models
    def create_registered_model(
        self,
        ctx: AuditContext,
        name: str,
        *,
        tags: _rules.TagsIn = None,
        description: str | None = None,
    ) -> RegisteredModel:
        """Create a model; the ``shamal.team`` tag makes it the team's (member or more).

        Raises:
            AlreadyExists: the name is taken.
            NotFound: the ``shamal.team`` team is not one of the caller's.
            PermissionDenied: a viewer of that team.
        """
        principal = ctx.require_principal()
        _rules.check_model_name(name)
        checked_tags = _rules.check_tags(tags)
        text = _rules.check_description(description)
        ctx.target = _model_target(name)
        team_id = self._team_of_new_model(principal, checked_tags)
        now = self._now_ms()

        def work(s: Session) -> RegisteredModel:
            ref = _store.insert_model(
                s,
                name=name,
                description=text,
                user_id=principal.name,
                team_id=team_id,
                tags=checked_tags,
                now=now,
            )
            self._audit.record(s, ctx, ctx.target, team=checked_tags.get(TEAM_TAG))
            return _store.load_model(s, ref)

        model = self._db.run(work)
        logger.info("registered model %r created by %s", name, principal.name)
        return model

    def get_registered_model(self, principal: Principal, name: str) -> RegisteredModel:
        """The model with its tags, aliases and latest version per stage (viewer)."""
        with self._reading() as s:
            return _store.load_model(s, self._access(s, principal, name, Role.VIEWER))

    def rename_registered_model(
        self, ctx: AuditContext, name: str, new_name: str
    ) -> RegisteredModel:
        """Rename (member); versions and aliases stay. ``AlreadyExists``: ``new_name`` is taken."""
        principal = ctx.require_principal()
        _rules.check_model_name(new_name, "new_name")
        ctx.target = _model_target(name)
        now = self._now_ms()

        def work(s: Session) -> RegisteredModel:
            ref = self._access(s, principal, name, Role.MEMBER)
            renamed = _store.rename_model(s, ref, new_name, now)
            self._audit.record(s, ctx, ctx.target, new_name=new_name)
            return _store.load_model(s, renamed)

        return self._db.run(work)

    def update_registered_model(
        self, ctx: AuditContext, name: str, description: str | None
    ) -> RegisteredModel:
        """Set the description (member); None leaves it as it is."""
        principal = ctx.require_principal()
        text = None if description is None else _rules.check_description(description)
        ctx.target = _model_target(name)
        now = self._now_ms()

        def work(s: Session) -> RegisteredModel:
            ref = self._access(s, principal, name, Role.MEMBER)
            _store.update_model(s, ref, now, description=text)
            self._audit.record(s, ctx, ctx.target)
            return _store.load_model(s, ref)

        return self._db.run(work)

    def delete_registered_model(self, ctx: AuditContext, name: str) -> None:
        """Delete the model with its versions, tags and aliases (maintainer)."""
        principal = ctx.require_principal()
        ctx.target = _model_target(name)

        def work(s: Session) -> None:
            ref = self._access(s, principal, name, Role.MAINTAINER, lock=True)
            _store.delete_model(s, ref)
            self._audit.record(s, ctx, ctx.target)

        self._db.run(work)
        logger.info("registered model %r deleted by %s", name, principal.name)

    def set_registered_model_tag(self, ctx: AuditContext, name: str, key: str, value: str) -> None:
        """Set (or overwrite) a tag (member). The ``shamal.team`` tag cannot change."""
        principal = ctx.require_principal()
        key, value = _rules.check_tag(key, value)
        _refuse_team_tag(key)
        ctx.target = _model_target(name)

        def work(s: Session) -> None:
            ref = self._access(s, principal, name, Role.MEMBER)
            _store.set_model_tag(s, ref, key, value)
            self._audit.record(s, ctx, ctx.target, key=key)

        self._db.run(work)

    def delete_registered_model_tag(self, ctx: AuditContext, name: str, key: str) -> None:
        """Remove a tag (member); an absent tag is not an error."""
        principal = ctx.require_principal()
        key = _rules.check_tag_key(key)
        _refuse_team_tag(key)
        ctx.target = _model_target(name)

        def work(s: Session) -> None:
            ref = self._access(s, principal, name, Role.MEMBER)
            _store.delete_model_tag(s, ref, key)
            self._audit.record(s, ctx, ctx.target, key=key)

        self._db.run(work)

    def search_registered_models(
        self,
        principal: Principal,
        *,
        filter_string: str | None = None,
        order_by: Sequence[str] = (),
        max_results: int = MODELS_PAGE_DEFAULT,
        page_token: str | None = None,
    ) -> Page[RegisteredModel]:
        """One page of the models the caller may see that match the MLflow filter.

        Prompts (models tagged ``mlflow.prompt.is_prompt`` = ``true``) are left
        out unless the filter asks for them, as MLflow's own server does.

        ``max_results`` 0 or less is an empty page, as on a stock server (which, unlike
        model-version searches, takes it); it has no next page token, where a stock
        server's token would lead back to the same empty page.

        Raises:
            InvalidParameter: a malformed filter, order_by or page token, or
                ``max_results`` over 1000.
        """
        offset = decode_page_token(page_token)
        filters, prompts = _rules.split_prompt_clauses(
            parse_filter(filter_string, REGISTERED_MODELS)
        )
        order = parse_order_by(list(order_by), REGISTERED_MODELS)
        if max_results <= 0:
            return Page(())
        limit = check_max_results(max_results, MODELS_PAGE_MAX)
        with self._reading() as s:
            models, more = _store.search_models(
                s, filters, order, _visibility(principal), offset, limit, prompts=prompts
            )
        return Page(tuple(models), _next_token(offset, limit, more))

    def list_registered_models(
        self,
        principal: Principal,
        *,
        search: str = "",
        offset: int = 0,
        limit: int = 100,
        after: str | None = None,
    ) -> list[RegisteredModel]:
        """Models the caller may see whose name contains ``search`` (case-insensitive), by
        name; ``after``: those after that name (then ``offset`` counts from there)."""
        if offset < 0 or not 1 <= limit <= MODELS_PAGE_MAX:
            raise InvalidParameter(f"offset must be >= 0 and limit 1..{MODELS_PAGE_MAX}")
        with self._reading() as s:
            return _store.list_models(s, _visibility(principal), search, offset, limit, after)

    # ------------------------------------------------------------------ aliases
    def set_registered_model_alias(
        self, ctx: AuditContext, name: str, alias: str, version: int
    ) -> None:
        """Point ``alias`` at ``version``, creating or moving it atomically (member).

        Raises:
            InvalidParameter: a malformed or reserved alias (``latest``, ``v<n>``).
            NotFound: no such model or version.
        """
        principal = ctx.require_principal()
        alias = _rules.check_alias(alias)
        ctx.target = _model_target(name)

        def work(s: Session) -> None:
            ref = self._access(s, principal, name, Role.MEMBER)
            before = _store.set_alias(s, ref, alias, version)
            self._audit.record(s, ctx, ctx.target, alias=alias, version=version, moved_from=before)
            moved = {"name": ref.name, "alias": alias, "version": version, "previous": before}
            _emit(s, ref, ctx, EventKind.MODEL_ALIAS_MOVED, f"models:/{ref.name}@{alias}", moved)

        self._db.run(work)

    def delete_registered_model_alias(self, ctx: AuditContext, name: str, alias: str) -> None:
        """Remove an alias (member); an absent alias is not an error, nor is a reserved name
        (``latest``, ``v1``), which no alias can have, as on a stock server."""
        principal = ctx.require_principal()
        alias = _rules.check_alias_name(alias)
        ctx.target = _model_target(name)

        def work(s: Session) -> None:
            ref = self._access(s, principal, name, Role.MEMBER)
            before = _store.delete_alias(s, ref, alias)
            self._audit.record(s, ctx, ctx.target, alias=alias, version=before)
            if before is not None:  # an absent alias moved nowhere
                gone = {"name": ref.name, "alias": alias, "version": None, "previous": before}
                _emit(s, ref, ctx, EventKind.MODEL_ALIAS_MOVED, f"models:/{ref.name}@{alias}", gone)

        self._db.run(work)

    def get_model_version_by_alias(
        self, principal: Principal, name: str, alias: str
    ) -> ModelVersion:
        """The version ``alias`` points at (viewer); what ``models:/name@alias`` resolves to.

        ``latest`` (in any case) is the newest version, as on a stock server: it is reserved,
        so no alias can be set by that name.

        Raises:
            InvalidParameter: a malformed alias name (checked before the model is looked up).
            NotFound: no such model, alias, or (for ``latest``) no version at all.
        """
        if not alias:
            raise InvalidParameter("Missing value for required parameter 'alias'.")
        _rules.check_alias_name(alias)
        with self._reading() as s:
            ref = self._access(s, principal, name, Role.VIEWER)
            if alias.lower() == _rules.LATEST_ALIAS:
                newest = _store.latest_versions(s, ref, None)
                if not newest:
                    # A stock server's words.
                    raise NotFound(f"Latest version not found for model {name}.")
                return _store.get_version(s, ref, max(v.version for v in newest))
            return _store.get_version(s, ref, _store.alias_version(s, ref, alias))

    # ------------------------------------------------------------------ versions
    def create_model_version(
        self,
        ctx: AuditContext,
        name: str,
        source: str,
        *,
        run_id: str | None = None,
        tags: _rules.TagsIn = None,
        run_link: str | None = None,
        description: str | None = None,
        model_id: str | None = None,
    ) -> ModelVersion:
        """Register the next version of a model (member), numbered 1, 2, ... without gaps.

        ``source`` is never trusted: the source resolver validates it (only URIs
        Shamal minted, readable by the caller) and says where the files are;
        that location is what download URIs answer. Nothing is stored when it
        refuses. A prompt version (tagged ``mlflow.prompt.is_prompt`` = ``true``) has
        no files: its source must be one of MLflow's placeholders (``prompt-template``).

        As on a stock server, ``run_id`` (and a ``runs:/<run_id>/...`` source) may name a
        run the caller cannot read, or that does not exist: the version keeps the id as
        given, with ``run_verified`` False and no files behind such a source, and lineage
        does not follow it. Another team's run is taken exactly as an unknown one.

        Raises:
            InvalidParameter: a refused source, or malformed input.
            NotFound: no such model, or a ``models:/`` source naming a logged model or
                version that is not visible.
        """
        principal = ctx.require_principal()
        if not source:
            raise InvalidParameter("Missing value for required parameter 'source'.")
        _rules.check_uri_length(source, "source")
        draft = ModelVersion(
            name=name,
            version=0,
            creation_timestamp=0,
            last_updated_timestamp=0,
            user_id=principal.name,
            current_stage=Stage.NONE,
            description=_rules.check_description(description),
            source=source,
            storage_location="",
            run_id=_rules.check_reference_id(run_id, "run_id", _RUN_ID_LENGTH),
            run_link=_rules.check_run_link(run_link),
            status=VersionStatus.READY,
            status_message="",
            model_id=_rules.check_reference_id(model_id, "model_id", _MODEL_ID_LENGTH),
            tags=_rules.check_tags(tags),
        )
        ctx.target = _model_target(name)
        with self._reading() as s:
            # Access first: a caller who cannot write here learns nothing about sources.
            self._access(s, principal, name, Role.MEMBER)
        draft, location = self._locate(principal, draft)
        _rules.check_uri_length(location, "source")
        if draft.run_id is None and draft.model_id is not None:
            # MLflow 3 clients register `models:/<id>` without a run: keep the lineage anyway.
            draft = replace(draft, run_id=self._sources.logged_model_run(principal, draft.model_id))
        return self._db.run(lambda s: self._insert_version(s, ctx, draft, location))

    def _locate(self, principal: Principal, draft: ModelVersion) -> tuple[ModelVersion, str]:
        """Where a new version's files are, and the draft with what its source tells.

        A prompt version has no files: its template is in its tags, its source one of
        MLflow's placeholders. A ``models:/<name>/...`` source copies another version: its
        files, formats and lineage. Any other source goes to the source resolver; the run
        (or logged model) the draft names must then hold what it resolves to, or be one the
        caller cannot read (then the link is kept unverified, see :meth:`_check_lineage`).
        """
        source = draft.source
        reference = _registry_reference(source)
        if _rules.is_prompt(draft.tags):
            return draft, _rules.check_prompt_source(source)
        if reference is not None:  # a copy of another version (`copy_model_version`)
            return self._copied(principal, draft, reference)
        location = self._resolve_source(principal, source)
        verified = self._check_lineage(principal, draft, location)
        card = self._card(principal, location) if location else ModelCard()
        located = replace(
            draft, formats=card.formats, signature=card.signature, run_verified=verified
        )
        return located, location

    def _copied(
        self,
        principal: Principal,
        draft: ModelVersion,
        reference: tuple[str, str | None, str | None],
    ) -> tuple[ModelVersion, str]:
        """A version that copies the one ``models:/<name>/...`` names: its files, formats
        and lineage (checked or not, as the original's)."""
        origin = self._referenced_version(principal, *reference)
        if _rules.is_prompt(self.get_registered_model(principal, origin.name).tags):
            raise InvalidParameter("A prompt version cannot be the source of a model version.")
        for claimed, actual in (
            (draft.run_id, origin.run_id),
            (draft.model_id, origin.model_id),
        ):
            if claimed is not None and claimed != actual:
                raise InvalidParameter(
                    f"Invalid model version source: '{draft.source}'. The run_id and model_id "
                    "request parameters must match the referenced model version."
                )
        copied = replace(
            draft,
            run_id=origin.run_id,
            run_verified=origin.run_verified,
            model_id=origin.model_id,
            formats=origin.formats,
            signature=origin.signature,
        )
        return copied, origin.storage_location or origin.source

    def _resolve_source(self, principal: Principal, source: str) -> str:
        """Where the source's files are; ``""`` for ``runs:/<run_id>/<path>`` naming a run
        the caller cannot read (or that does not exist): a stock server takes such a source
        as given, and so does Shamal, reading no file of it and never handing out a
        location for it (its download URI is the source itself, which the run's own access
        rules then guard)."""
        try:
            return self._sources.resolve_model_source(principal, source)
        except NotFound:
            if not source.startswith("runs:/"):
                raise
        run_id, _, path = source.removeprefix("runs:/").partition("/")
        _rules.check_reference_id(run_id, "source", _RUN_ID_LENGTH)
        if path.strip("/"):
            safe_relpath(path)
        return ""

    def _check_lineage(self, principal: Principal, draft: ModelVersion, location: str) -> bool:
        """Whether the run the draft names is its checked origin.

        A version that names a logged model must have its files inside that model's
        artifacts, and one that names a run the caller can read inside that run's, as a
        stock server requires: no version can claim to come from a run that did not make
        it. A ``run_id`` the caller cannot read (unknown, another team's, or none to check it
        against), or a ``runs:/`` source naming such a run, is taken as a stock server takes
        it, as a claim: False, and lineage does not follow it. Another team's run answers
        exactly as an unknown one does.

        Raises:
            InvalidParameter: the files are not inside the named logged model's artifacts, or
                not inside the artifacts of a run the caller can read.
        """
        if draft.model_id is not None:
            root = self._artifact_root(principal, model_id=draft.model_id)
            _require_inside(location, root, "model_id", draft.source)
            # Named with its logged model, a version's run is the one that made that model.
            made_by = self._sources.logged_model_run(principal, draft.model_id)
            return draft.run_id is None or draft.run_id == made_by
        if draft.run_id is None:
            return True
        root = self._artifact_root(principal, run_id=draft.run_id)
        if root is None or not location:
            # An unreadable run, or a `runs:/` source naming one: a claim, kept unverified.
            return False
        _require_inside(location, root, "run_id", draft.source)
        return True

    def _artifact_root(
        self, principal: Principal, *, model_id: str | None = None, run_id: str | None = None
    ) -> str | None:
        """The artifact root of a logged model or a run (None: not one the caller can see)."""
        try:
            if model_id is not None:
                root = self._sources.resolve_model_source(principal, f"models:/{model_id}")
            elif run_id is not None and self._runs is not None:
                root = self._runs.get_run(principal, run_id).info.artifact_uri
            else:
                return None
        except (NotFound, InvalidParameter):
            return None
        return root.rstrip("/")

    def _referenced_version(
        self, principal: Principal, name: str, version: str | None, alias: str | None
    ) -> ModelVersion:
        """The version ``models:/name/<version|latest>`` or ``models:/name@alias`` names."""
        if alias is not None:
            return self.get_model_version_by_alias(principal, name, alias)
        if version == "latest":
            with self._reading() as s:
                ref = self._access(s, principal, name, Role.VIEWER)
                versions = _store.list_versions(s, ref)
            if not versions:
                raise NotFound(f"Registered model '{name}' has no versions.")
            return versions[0]
        if version is None or not version.isdigit() or len(version) > 9:
            raise InvalidParameter(
                "A models:/ source names a version as models:/<name>/<version>, "
                "models:/<name>/latest or models:/<name>@<alias>."
            )
        return self.get_model_version(principal, name, int(version))

    def _card(self, principal: Principal, location: str) -> ModelCard:
        """The formats and signature of the ``MLmodel`` at ``location``, if there is one yet
        (MLflow lets a version be registered before its files are uploaded)."""
        if self._files is None or not location.startswith(_ARTIFACTS):
            return ModelCard()
        path = f"{location.removeprefix(_ARTIFACTS).rstrip('/')}/{MLMODEL}"
        try:
            _info, chunks = self._files.download(principal, path)
            data = bytearray()
            for chunk in chunks:
                data += chunk
                if len(data) > MAX_MLMODEL_BYTES:
                    return ModelCard()
        except (NotFound, InvalidParameter):
            return ModelCard()
        return parse_mlmodel(bytes(data))

    def version_lineage(self, principal: Principal, name: str, version: int) -> VersionLineage:
        """The version (viewer), the run that produced it and the datasets that run read."""
        found = self.get_model_version(principal, name, version)
        if not found.run_verified:
            return VersionLineage(found, found.run_id, None, None, False, (), run_verified=False)
        if found.run_id is None or self._runs is None:
            return VersionLineage(found, found.run_id, None, None, False, ())
        try:
            run = self._runs.get_run(principal, found.run_id)
        except NotFound:
            return VersionLineage(found, found.run_id, None, None, False, ())
        datasets = tuple(
            DatasetUse(
                name=use.dataset.name,
                digest=use.dataset.digest,
                source_type=use.dataset.source_type,
                source=use.dataset.source,
                context=dict(use.tags).get(_CONTEXT_TAG),
            )
            for use in run.dataset_inputs
        )
        info = run.info
        return VersionLineage(
            found, found.run_id, info.run_name, info.experiment_id, True, datasets
        )

    def versions_from(
        self,
        principal: Principal,
        *,
        run_ids: Sequence[str] = (),
        model_ids: Sequence[str] = (),
        limit: int = 100,
    ) -> list[ModelVersion]:
        """The versions the caller may see that were made from one of ``run_ids`` or of the
        logged models ``model_ids`` (lineage downstream of runs), newest first.

        Raises:
            InvalidParameter: a limit outside 1..1000, or more than 1000 ids.
        """
        if not 1 <= limit <= 1000:
            raise InvalidParameter("limit must be between 1 and 1000")
        if len(run_ids) + len(model_ids) > 1000:
            raise InvalidParameter("name at most 1000 runs and logged models at once")
        with self._reading() as s:
            return _store.versions_from(s, run_ids, model_ids, _visibility(principal), limit)

    def _insert_version(
        self, s: Session, ctx: AuditContext, draft: ModelVersion, location: str
    ) -> ModelVersion:
        ref = self._access(s, ctx.require_principal(), draft.name, Role.MEMBER)
        now = self._now_ms()
        number = _store.allocate_version(s, ref, now)
        version = replace(
            draft,
            version=number,
            creation_timestamp=now,
            last_updated_timestamp=now,
            storage_location=location,
        )
        _store.insert_version(s, ref, version)
        self._audit.record(s, ctx, _version_target(ref.name, number), source=draft.source)
        made = {"name": ref.name, "version": number, "run_id": draft.run_id, "source": draft.source}
        _emit(s, ref, ctx, EventKind.MODEL_VERSION_REGISTERED, f"models:/{ref.name}/{number}", made)
        return _store.get_version(s, ref, number)

    def get_model_version(self, principal: Principal, name: str, version: int) -> ModelVersion:
        """One version with its tags and aliases (viewer)."""
        with self._reading() as s:
            return _store.get_version(s, self._access(s, principal, name, Role.VIEWER), version)

    def list_model_versions(
        self,
        principal: Principal,
        name: str,
        *,
        limit: int | None = None,
        before: int | None = None,
    ) -> list[ModelVersion]:
        """A model's versions, newest first (viewer): every one, or ``limit`` of those
        older than version ``before``."""
        with self._reading() as s:
            ref = self._access(s, principal, name, Role.VIEWER)
            return _store.list_versions(s, ref, limit=limit, before=before)

    def get_model_version_download_uri(self, principal: Principal, name: str, version: int) -> str:
        """Where the version's files are, as the source resolver found them (viewer)."""
        found = self.get_model_version(principal, name, version)
        return found.storage_location or found.source

    def update_model_version(
        self, ctx: AuditContext, name: str, version: int, description: str | None
    ) -> ModelVersion:
        """Set a version's description (member); None leaves it as it is."""
        principal = ctx.require_principal()
        text = None if description is None else _rules.check_description(description)
        ctx.target = _version_target(name, version)
        now = self._now_ms()

        def work(s: Session) -> ModelVersion:
            ref = self._access(s, principal, name, Role.MEMBER)
            _store.update_version(s, ref, version, now, description=text)
            self._audit.record(s, ctx, ctx.target)
            return _store.get_version(s, ref, version)

        return self._db.run(work)

    def transition_model_version_stage(
        self, ctx: AuditContext, name: str, version: int, stage: Stage, archive_existing: bool
    ) -> ModelVersion:
        """Move a version to ``stage`` (member), archiving the others there if asked.

        Raises:
            InvalidParameter: ``archive_existing`` with a stage other than Staging or Production.
        """
        principal = ctx.require_principal()
        if archive_existing and stage not in (Stage.STAGING, Stage.PRODUCTION):
            raise InvalidParameter(
                "archive_existing_versions applies only to the Staging and Production stages."
            )
        ctx.target = _version_target(name, version)
        now = self._now_ms()

        def work(s: Session) -> ModelVersion:
            ref = self._access(s, principal, name, Role.MEMBER)
            _store.update_version(s, ref, version, now, stage=stage)
            archived = _store.archive_stage(s, ref, stage, version, now) if archive_existing else []
            _store.update_model(s, ref, now)
            self._audit.record(s, ctx, ctx.target, stage=stage.value, archived=archived)
            return _store.get_version(s, ref, version)

        return self._db.run(work)

    def delete_model_version(self, ctx: AuditContext, name: str, version: int) -> None:
        """Delete a version with its tags and aliases (maintainer); numbers are not reused."""
        principal = ctx.require_principal()
        ctx.target = _version_target(name, version)
        now = self._now_ms()

        def work(s: Session) -> None:
            ref = self._access(s, principal, name, Role.MAINTAINER)
            _store.delete_version(s, ref, version)
            _store.update_model(s, ref, now)
            self._audit.record(s, ctx, ctx.target)

        self._db.run(work)

    def set_model_version_tag(
        self, ctx: AuditContext, name: str, version: int, key: str, value: str
    ) -> None:
        """Set (or overwrite) a version's tag (member)."""
        principal = ctx.require_principal()
        key, value = _rules.check_tag(key, value)
        ctx.target = _version_target(name, version)

        def work(s: Session) -> None:
            ref = self._access(s, principal, name, Role.MEMBER)
            _store.set_version_tag(s, ref, version, key, value)
            self._audit.record(s, ctx, ctx.target, key=key)

        self._db.run(work)

    def delete_model_version_tag(
        self, ctx: AuditContext, name: str, version: int, key: str
    ) -> None:
        """Remove a version's tag (member); an absent tag is not an error."""
        principal = ctx.require_principal()
        key = _rules.check_tag_key(key)
        ctx.target = _version_target(name, version)

        def work(s: Session) -> None:
            ref = self._access(s, principal, name, Role.MEMBER)
            _store.delete_version_tag(s, ref, version, key)
            self._audit.record(s, ctx, ctx.target, key=key)

        self._db.run(work)

    def get_latest_versions(
        self, principal: Principal, name: str, stages: Sequence[Stage] | None = None
    ) -> list[ModelVersion]:
        """The newest READY version in each of ``stages`` (empty or None: every stage)."""
        with self._reading() as s:
            ref = self._access(s, principal, name, Role.VIEWER)
            return _store.latest_versions(s, ref, set(stages) if stages else None)

    def search_model_versions(
        self,
        principal: Principal,
        *,
        filter_string: str | None = None,
        order_by: Sequence[str] = (),
        max_results: int = VERSIONS_PAGE_DEFAULT,
        page_token: str | None = None,
    ) -> Page[ModelVersion]:
        """One page of the versions (of models the caller may see) that match the filter.

        Raises:
            InvalidParameter: a malformed filter, order_by or page token, or
                ``max_results`` outside 1..200,000.
        """
        limit = check_max_results(max_results, VERSIONS_PAGE_MAX)
        offset = decode_page_token(page_token)
        filters, prompts = _rules.split_prompt_clauses(parse_filter(filter_string, MODEL_VERSIONS))
        order = parse_order_by(list(order_by), MODEL_VERSIONS)
        with self._reading() as s:
            versions, more = _store.search_versions(
                s, filters, order, _visibility(principal), offset, limit, prompts=prompts
            )
        return Page(tuple(versions), _next_token(offset, limit, more))


def _require_inside(location: str, root: str | None, field: str, source: str) -> None:
    """Refuse a version whose files are not inside ``root`` (what ``field`` names)."""
    if not location or root is None or (location != root and not location.startswith(root + "/")):
        raise InvalidParameter(
            f"Invalid model version source: '{source}'. The {field} request parameter must "
            "identify the resource that contains the source."
        )


def _refuse_team_tag(key: str) -> None:
    if key == TEAM_TAG:
        raise InvalidParameter(
            f"the {TEAM_TAG} tag names the owning team; it is set when the model is created "
            "and cannot change"
        )
