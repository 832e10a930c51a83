"""Pipelines: promotion gates that decide, by rules over a candidate's figures, whether a
model version may take an alias (``shamal models promote``).

The rule language and the report are pure (:class:`Rule`, :class:`RuleResult`,
:class:`GateReport`, :func:`junit_xml`); :class:`PromotionService` reads the candidate and the
champion through the registry, tracking and dataset services and moves the alias;
``promotion_router`` serves it as ``POST /api/v1/models/{name}/promote``. Both load on first
use (the CLI imports this package for the report and the JUnit XML only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.pipelines._gate import (
    MAX_RULE_CHARS,
    MAX_RULES,
    GateReport,
    Rule,
    RuleResult,
    parse_rules,
)
from shamal.pipelines._junit import junit_xml

if TYPE_CHECKING:
    from shamal.pipelines._promotion import PromotionService
    from shamal.pipelines._promotion_api import router as promotion_router

_WHERE: dict[str, tuple[str, str | None]] = {
    "PromotionService": ("_promotion", "PromotionService"),
    "promotion_router": ("_promotion_api", "router"),
}

__all__ = [
    "MAX_RULES",
    "MAX_RULE_CHARS",
    "GateReport",
    "PromotionService",
    "Rule",
    "RuleResult",
    "junit_xml",
    "parse_rules",
    "promotion_router",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
