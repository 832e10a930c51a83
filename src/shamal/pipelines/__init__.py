"""Pipelines: DAGs of steps that run as scheduled jobs, with a step cache that is never
wrong, triggers (events and cron schedules) and CI/CD promotion gates.

Gates decide, by rules over a candidate's figures, whether a model version may take an alias
(``shamal models promote``): the rule language and the report are pure (:class:`Rule`,
:class:`GateReport`, :func:`junit_xml`); :class:`PromotionService` reads the candidate and the
champion through the registry, tracking and dataset services and moves the alias, served as
``POST /api/v1/models/{name}/promote`` by ``promotion_router``.

Users write ``@step`` and ``@pipeline`` functions (or a YAML file) and run them with
``shamal pipeline run``; the server keeps each run's state in the database and moves it on
from the scheduler's loop (:class:`PipelineService`).

The SDK's names (``step``, ``pipeline``, ``dataset``...) import without the database layer
and the services, which load on first use (PEP 562): code inside a step's job imports only
what it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shamal import lazy
from shamal.pipelines._definitions import (
    MAX_MAP_ITEMS,
    MAX_STEPS,
    MAX_VALUE_BYTES,
    PipelineSpec,
    Ref,
    StepSpec,
    Trigger,
)
from shamal.pipelines._entities import CACHED_FROM_RUN_TAG
from shamal.pipelines._sdk import (
    DatasetInput,
    Output,
    Param,
    Pipeline,
    Step,
    dataset,
    load_pipeline,
    pipeline,
    step,
)

if TYPE_CHECKING:
    from shamal.pipelines._cron import ON_TIME, CronSchedule, due_ticks
    from shamal.pipelines._engine import RunState, StepState, step_condition
    from shamal.pipelines._entities import PipelineInfo, PipelineRun, StepRun
    from shamal.pipelines._gate import (
        MAX_RULE_CHARS,
        MAX_RULES,
        GateReport,
        Rule,
        RuleResult,
        parse_rules,
    )
    from shamal.pipelines._junit import junit_xml
    from shamal.pipelines._promotion import PromotionService
    from shamal.pipelines._promotion_api import router as promotion_router
    from shamal.pipelines._service import PipelineService
    from shamal.pipelines._triggers import PipelineTriggers, check_trigger

_WHERE: dict[str, tuple[str, str | None]] = {
    "MAX_RULE_CHARS": ("_gate", "MAX_RULE_CHARS"),
    "MAX_RULES": ("_gate", "MAX_RULES"),
    "GateReport": ("_gate", "GateReport"),
    "Rule": ("_gate", "Rule"),
    "RuleResult": ("_gate", "RuleResult"),
    "parse_rules": ("_gate", "parse_rules"),
    "junit_xml": ("_junit", "junit_xml"),
    "CronSchedule": ("_cron", "CronSchedule"),
    "ON_TIME": ("_cron", "ON_TIME"),
    "due_ticks": ("_cron", "due_ticks"),
    "PipelineInfo": ("_entities", "PipelineInfo"),
    "PipelineRun": ("_entities", "PipelineRun"),
    "PipelineService": ("_service", "PipelineService"),
    "PromotionService": ("_promotion", "PromotionService"),
    "promotion_router": ("_promotion_api", "router"),
    "RunState": ("_engine", "RunState"),
    "StepRun": ("_entities", "StepRun"),
    "StepState": ("_engine", "StepState"),
    "PipelineTriggers": ("_triggers", "PipelineTriggers"),
    "check_trigger": ("_triggers", "check_trigger"),
    "step_condition": ("_engine", "step_condition"),
}

__all__ = [
    "CACHED_FROM_RUN_TAG",
    "MAX_MAP_ITEMS",
    "ON_TIME",
    "CronSchedule",
    "due_ticks",
    "MAX_RULES",
    "MAX_RULE_CHARS",
    "GateReport",
    "PromotionService",
    "Rule",
    "RuleResult",
    "junit_xml",
    "parse_rules",
    "promotion_router",
    "MAX_STEPS",
    "MAX_VALUE_BYTES",
    "DatasetInput",
    "Output",
    "Param",
    "Pipeline",
    "PipelineInfo",
    "PipelineRun",
    "PipelineService",
    "PipelineSpec",
    "PipelineTriggers",
    "Ref",
    "RunState",
    "Step",
    "StepRun",
    "StepSpec",
    "StepState",
    "Trigger",
    "check_trigger",
    "dataset",
    "load_pipeline",
    "pipeline",
    "step",
    "step_condition",
]


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, name, globals())
