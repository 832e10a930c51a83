"""HTTP API of promotion gates: ``POST /api/v1/models/{name}/promote``.

A refused promotion is an answer, not an error: 200 with ``passed: false`` (the CLI turns it
into its exit code). Errors are malformed input (400), a model or alias that is not there or
not the caller's (404), a role too low (403), an alias that moved meanwhile (409).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from shamal.api import ERROR_RESPONSES
from shamal.pipelines._gate import MAX_RULE_CHARS, MAX_RULES, GateReport
from shamal.pipelines._promotion import PromotionService
from shamal.security import AuditContext
from shamal.security.api import audited

__all__ = ["PromoteIn", "PromotionOut", "get_promotion", "router"]

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1", tags=["models"], responses=ERROR_RESPONSES)


def get_promotion(request: Request) -> PromotionService:
    """The platform's promotion service (``app.state.promotion``), or one built over the
    platform's services when none was bound: it holds no state of its own."""
    state = request.app.state
    service: PromotionService | None = getattr(state, "promotion", None)
    if service is None:
        service = PromotionService(
            state.db, state.audit, state.registry, state.tracking, getattr(state, "datasets", None)
        )
    return service


Promotions = Annotated[PromotionService, Depends(get_promotion)]
ModelName = Annotated[str, Path(min_length=1, max_length=256)]
AliasText = Annotated[str, StringConstraints(min_length=1, max_length=255)]
RuleText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_RULE_CHARS)]


class PromoteIn(BaseModel):
    """A gate: the alias naming the candidate, the alias to move, and the rules."""

    model_config = ConfigDict(extra="forbid")

    from_alias: AliasText = Field(examples=["candidate"])
    to_alias: AliasText = Field(examples=["champion"])
    rules: list[RuleText] = Field(
        min_length=1,
        max_length=MAX_RULES,
        examples=[["metrics.f1 >= champion.metrics.f1 - 0.01", "data.validation == 'passed'"]],
    )
    dry_run: bool = False


class RuleOut(BaseModel):
    """How one rule fared."""

    rule: str
    passed: bool
    values: dict[str, Any]
    explanation: str = Field(
        examples=["metrics.f1 = 0.91 >= champion.metrics.f1 - 0.01 = 0.89: passed"]
    )
    no_champion: bool


class PromotionOut(BaseModel):
    """What the gate decided; ``promoted`` is true when the alias moved."""

    model: str
    from_alias: str
    to_alias: str
    candidate_version: int
    champion_version: int | None
    passed: bool
    promoted: bool
    dry_run: bool
    results: list[RuleOut]

    @classmethod
    def of(cls, report: GateReport) -> PromotionOut:
        return cls.model_validate(report.to_json())


@router.post(
    "/models/{name}/promote",
    summary="Move an alias to the version another names, if every rule holds",
    description="Evaluates the rules on the candidate (the version at from_alias) and the "
    "champion (the version at to_alias, if any); when every rule holds and this is no dry "
    "run, to_alias moves to the candidate. A refused promotion answers 200 with passed: "
    "false. Audited as models.promote, passed or refused.",
)
def promote(
    name: ModelName,
    body: PromoteIn,
    svc: Promotions,
    ctx: Annotated[AuditContext, Depends(audited("models.promote"))],
) -> PromotionOut:
    report = svc.promote(
        ctx,
        name,
        from_alias=body.from_alias,
        to_alias=body.to_alias,
        rules=body.rules,
        dry_run=body.dry_run,
    )
    return PromotionOut.of(report)
