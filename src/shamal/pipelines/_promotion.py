"""Promotion through a gate: move an alias (``champion``) to the version another alias names
(``candidate``) only when every rule holds on the candidate's figures and the champion's.

What a rule can read, for the candidate and, under ``champion.``, for the champion:

* ``metrics.<key>`` — the latest value of each metric of the version's source run;
  ``params.<key>`` and ``tags.<key>`` — that run's params and tags (text);
* ``version`` — the version number; ``version_tags.<key>`` — the version's own tags;
* ``data.validation`` — ``'passed'``, ``'failed'`` or ``'none'``: the validation reports of the
  Shamal dataset versions (``data:/NAME/N``) the run logged as inputs. ``'failed'`` if any of
  them failed, ``'passed'`` if at least one has a report and none failed, ``'none'`` if none
  has a report (no suite) or the run read no Shamal dataset. Inputs the caller may not read
  are left out. ``data.failed_expectations`` counts the failed error-severity expectations
  of those reports, ``data.warnings`` the failed warnings, ``data.inputs`` the Shamal datasets
  read and ``data.checked`` how many of them carry a report;
* ``fidelity.*`` — what ``shamal optimize`` measured when it registered the version (its
  ``shamal.fidelity.*`` tags): ``metric``, ``original``, ``variant``, ``drop``,
  ``max_abs_diff``, ``cosine`` (the worst row's cosine similarity), ``rows``. Absent for a
  version that no optimization made: a rule naming them then fails ("... is missing").

A version without a source run (or whose run the caller may not read) has no ``metrics``,
``params``, ``tags`` or ``data``: rules naming them fail. With no version at ``to_alias``
there is no champion; comparisons against ``champion.*`` then pass ("no champion"), so the
first promotion goes through the same gate (see :mod:`shamal.pipelines._gate`).

Every promotion is audited under the caller's action (``models.promote``), passed or refused,
dry run or not, with its rules and outcome; the alias move itself goes through the registry,
which audits it as ``registered_model.alias.set``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from shamal.db import Database
from shamal.errors import Conflict, InvalidParameter, NotFound
from shamal.pipelines._gate import GateReport, parse_rules
from shamal.registry import ModelVersion, RegistryService
from shamal.security import AuditContext, AuditLog, Principal, Role
from shamal.tracking import Run, TrackingService

if TYPE_CHECKING:
    from shamal.datasets import DatasetService

__all__ = ["ALIAS_SET_ACTION", "PromotionService"]

logger = logging.getLogger(__name__)

#: The action of the registry's own audit entry for the alias move.
ALIAS_SET_ACTION = "registered_model.alias.set"
#: Inputs of one run whose validation reports a gate reads (runs may log many inputs).
MAX_DATA_INPUTS = 100
_FIDELITY_TAG = "shamal.fidelity."
_RESERVED_ALIAS = re.compile(r"(?i:latest|v\d+)")
_NUMBER_FIDELITY = ("original", "variant", "max_abs_diff", "cosine_min", "rows")


def _fidelity(tags: Mapping[str, str]) -> dict[str, Any] | None:
    """The optimization fidelity a version's tags record, or None when it records none."""
    found = {
        key.removeprefix(_FIDELITY_TAG): value
        for key, value in tags.items()
        if key.startswith(_FIDELITY_TAG)
    }
    if not found:
        return None
    out: dict[str, Any] = {k: v for k, v in found.items() if k not in _NUMBER_FIDELITY}
    for key in _NUMBER_FIDELITY:
        try:
            number = float(found[key])
        except (KeyError, ValueError):
            continue
        if math.isfinite(number):
            out[key] = number
    if "cosine_min" in out:
        out["cosine"] = out["cosine_min"]
    if "original" in out and "variant" in out:
        out["drop"] = out["original"] - out["variant"]
    return out


def _data_reference(source: str) -> str | None:
    """``NAME/N`` when a run input's source is a Shamal dataset version (``{"uri":
    "data:/NAME/N"}``, as ``shamal.data`` logs it); None for any other input."""
    if len(source) > 4096:
        return None
    try:
        named = json.loads(source).get("uri")
    except (ValueError, AttributeError):
        return None
    if not isinstance(named, str) or not named.startswith("data:/"):
        return None
    reference = named.removeprefix("data:/")
    name, _, number = reference.partition("/")
    return reference if name and number.isdigit() else None


class PromotionService:
    """Gates that move a model's alias. Thread-safe and stateless; one per process.

    Args:
        db: the platform database (the gate's audit entry is written in it).
        audit: the audit chain.
        registry: reads versions and aliases and moves the alias (with its own audit).
        tracking: reads the source run of each version.
        datasets: reads the validation report of the dataset versions a run read
            (None: ``data.*`` names are missing).
    """

    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        registry: RegistryService,
        tracking: TrackingService,
        datasets: DatasetService | None = None,
    ) -> None:
        self._db = db
        self._audit = audit
        self._registry = registry
        self._tracking = tracking
        self._datasets = datasets

    def promote(
        self,
        ctx: AuditContext,
        name: str,
        *,
        from_alias: str,
        to_alias: str,
        rules: Sequence[str],
        dry_run: bool = False,
    ) -> GateReport:
        """Evaluate ``rules`` on the version at ``from_alias`` against the one at ``to_alias``
        and, when all hold and this is no dry run, point ``to_alias`` at the candidate.

        A refused promotion is not an error: the report says ``passed`` False and nothing
        moves. Both outcomes are audited (``ok`` / ``refused``).

        Raises:
            InvalidParameter: no rule, a malformed rule, a malformed or reserved alias, or
                the same alias twice.
            NotFound: no such model (or not visible), or no version at ``from_alias``.
            PermissionDenied: a role too low to set the model's aliases (member; a dry run
                needs only to read it).
            Conflict: an alias moved while the gate was being evaluated (nothing moved).
        """
        principal = ctx.require_principal()
        ctx.target = f"registered_model:{name}"
        parsed = parse_rules(rules)
        self._check_aliases(from_alias, to_alias)
        model = self._registry.get_registered_model(principal, name)
        needed = Role.VIEWER if dry_run else Role.MEMBER
        principal.require_owner_role(model.team_id, needed, f"registered model {name!r}")
        candidate = self._registry.get_model_version_by_alias(principal, name, from_alias)
        champion = self._champion(principal, name, to_alias)
        context = self._figures(principal, candidate)
        context["champion"] = None if champion is None else self._figures(principal, champion)
        results = tuple(rule.evaluate(context) for rule in parsed)
        report = GateReport(
            name,
            from_alias,
            to_alias,
            candidate.version,
            None if champion is None else champion.version,
            results,
            dry_run=dry_run,
        )
        if report.passed and not dry_run:
            self._move(ctx, report)
            report = replace(report, promoted=True)
        self._record(ctx, report)
        return report

    # ------------------------------------------------------------------ steps
    @staticmethod
    def _check_aliases(from_alias: str, to_alias: str) -> None:
        for label, alias in (("from", from_alias), ("to", to_alias)):
            if not alias or len(alias) > 255 or not re.fullmatch(r"[\w-]+", alias):
                raise InvalidParameter(
                    f"--{label}: an alias is 1 to 255 letters, digits, '_' or '-'"
                )
        if _RESERVED_ALIAS.fullmatch(to_alias):
            raise InvalidParameter(f"--to: {to_alias!r} is reserved and cannot be moved")
        if from_alias == to_alias:
            raise InvalidParameter("--from and --to name the same alias")

    def _champion(self, principal: Principal, name: str, alias: str) -> ModelVersion | None:
        """The version ``alias`` names, or None when the alias is not set (the model exists:
        it was read just before)."""
        try:
            return self._registry.get_model_version_by_alias(principal, name, alias)
        except NotFound:
            return None

    def _figures(self, principal: Principal, version: ModelVersion) -> dict[str, Any]:
        """What rules may read of one version (see the module's docstring)."""
        figures: dict[str, Any] = {
            "version": version.version,
            "version_tags": dict(version.tags),
        }
        fidelity = _fidelity(version.tags)
        if fidelity is not None:
            figures["fidelity"] = fidelity
        run = self._run(principal, version.run_id)
        if run is None:
            return figures
        figures["metrics"] = {m.key: m.value for m in run.metrics}
        figures["params"] = dict(run.params)
        figures["tags"] = dict(run.tags)
        if self._datasets is not None:
            figures["data"] = self._data(principal, run)
        return figures

    def _run(self, principal: Principal, run_id: str | None) -> Run | None:
        if run_id is None:
            return None
        try:
            return self._tracking.get_run(principal, run_id)
        except NotFound:  # deleted, or not the caller's to read: no figures from it
            return None

    def _data(self, principal: Principal, run: Run) -> dict[str, Any]:
        """The validation the run's Shamal dataset inputs carry."""
        assert self._datasets is not None
        references = dict.fromkeys(
            ref
            for ref in (_data_reference(i.dataset.source) for i in run.dataset_inputs)
            if ref is not None
        )
        inputs = checked = failed = warnings = 0
        any_failed = False
        for reference in list(references)[:MAX_DATA_INPUTS]:
            try:
                report = self._datasets.version(principal, reference).validation
            except (NotFound, InvalidParameter):
                continue
            inputs += 1
            if not report:
                continue
            checked += 1
            errors, warned = _tally(report)
            failed, warnings = failed + errors, warnings + warned
            any_failed = any_failed or errors > 0 or report.get("ok") is False
        verdict = "none" if not checked else ("failed" if any_failed else "passed")
        return {
            "validation": verdict,
            "failed_expectations": failed,
            "warnings": warnings,
            "inputs": inputs,
            "checked": checked,
        }

    def _move(self, ctx: AuditContext, report: GateReport) -> None:
        """Point the alias at the candidate through the registry (its audit, its rules), if
        neither alias moved since the gate read them."""
        principal = ctx.require_principal()
        now_candidate = self._registry.get_model_version_by_alias(
            principal, report.model, report.from_alias
        ).version
        now_champion = self._champion(principal, report.model, report.to_alias)
        now = None if now_champion is None else now_champion.version
        if now_candidate != report.candidate_version or now != report.champion_version:
            raise Conflict(
                f"an alias of {report.model!r} moved while the gate ran; run the gate again"
            )
        moving = AuditContext(action=ALIAS_SET_ACTION, actor=ctx.actor, principal=principal)
        self._registry.set_registered_model_alias(
            moving, report.model, report.to_alias, report.candidate_version
        )

    def _record(self, ctx: AuditContext, report: GateReport) -> None:
        detail = {
            "from_alias": report.from_alias,
            "to_alias": report.to_alias,
            "candidate_version": report.candidate_version,
            "champion_version": report.champion_version,
            "rules": [r.rule for r in report.results],
            "failed": [r.rule for r in report.results if not r.passed],
            "passed": report.passed,
            "promoted": report.promoted,
            "dry_run": report.dry_run,
        }
        if report.passed:
            self._db.run(lambda s: self._audit.record(s, ctx, ctx.target, **detail))
            return
        ctx.detail.update(detail)
        self._audit.record_outcome(ctx, "refused")


def _tally(report: Mapping[str, Any]) -> tuple[int, int]:
    """(failed error-severity expectations, failed warnings) of one validation report."""
    errors = warnings = 0
    for result in report.get("results") or ():
        if isinstance(result, Mapping) and result.get("passed") is False:
            if result.get("severity") == "warning":
                warnings += 1
            else:
                errors += 1
    return errors, warnings
