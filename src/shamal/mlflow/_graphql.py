"""MLflow's GraphQL endpoint (``POST /graphql``), answered from Shamal's services.

MLflow's UI reads a run page, its charts and its search through GraphQL: the operations it
sends (``mlflowGetRun``, ``mlflowGetExperiment``, ``mlflowSearchRuns``,
``mlflowGetMetricHistoryBulkInterval``, ``mlflowListArtifacts``,
``mlflowSearchModelVersions``, ``mlflowSearchDatasets``) have the types MLflow's schema
gives them, written here in the schema language: camel-cased fields, int64 values as
strings (``LongString``), a NaN metric as null. Every resolver calls the same service method
as the REST route of the same name, with the caller's principal, so GraphQL reads exactly
what the caller may read through REST. A request is bounded before it runs (size, depth,
selections, root fields, aliases); a refusal is an error of the answer, never a trace.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from graphql import (
    DocumentNode,
    ExecutionResult,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    build_schema,
    execute,
    parse,
    validate,
)

from shamal.errors import InvalidParameter, ShamalError
from shamal.mlflow import _tracking_json as _proto
from shamal.mlflow._registry_json import model_version_json
from shamal.registry import RegistryService
from shamal.security import Principal
from shamal.tracking import MAX_SAMPLED_POINTS, Run, TrackingService, view_type

logger = logging.getLogger(__name__)

#: Bounds of one request, as a stock server bounds its own (depth and selections), and a
#: few root fields and aliases: the UI sends one operation of one root field.
MAX_QUERY_CHARS = 20_000
MAX_DEPTH = 10
MAX_SELECTIONS = 1000
MAX_ROOT_FIELDS = 10
MAX_ALIASES = 10
#: Model versions listed with a run (its ``modelVersions``), and runs a search answers.
MAX_RUN_MODEL_VERSIONS = 100
MAX_SEARCH_RUNS = 1000

SCHEMA_SDL = """
directive @component(name: String!) on QUERY | MUTATION

scalar LongString

enum MlflowRunStatus { RUNNING SCHEDULED FINISHED FAILED KILLED }
enum MlflowViewType { ACTIVE_ONLY DELETED_ONLY ALL }
enum MlflowModelVersionStatus { PENDING_REGISTRATION FAILED_REGISTRATION READY }

type ErrorDetail { field: String message: String }
type ApiError {
  code: String message: String helpUrl: String traceId: String errorDetails: [ErrorDetail]
}

type MlflowExperimentTag { key: String value: String }
type MlflowExperiment {
  experimentId: String name: String artifactLocation: String lifecycleStage: String
  lastUpdateTime: LongString creationTime: LongString tags: [MlflowExperimentTag!]
  effectiveTraceArchivalRetention: String workspace: String
}

type MlflowRunInfo {
  runId: String runUuid: String runName: String experimentId: String userId: String
  status: MlflowRunStatus startTime: LongString endTime: LongString artifactUri: String
  lifecycleStage: String
}
type MlflowMetricExtension {
  key: String value: Float timestamp: LongString step: LongString datasetName: String
  datasetDigest: String modelId: String runId: String
}
type MlflowParam { key: String value: String }
type MlflowRunTag { key: String value: String }
type MlflowRunData {
  metrics: [MlflowMetricExtension!] params: [MlflowParam!] tags: [MlflowRunTag!]
}
type MlflowDataset {
  name: String digest: String sourceType: String source: String schema: String
  profile: String
}
type MlflowInputTag { key: String value: String }
type MlflowDatasetInput { tags: [MlflowInputTag!] dataset: MlflowDataset }
type MlflowModelInput { modelId: String }
type MlflowRunInputs {
  datasetInputs: [MlflowDatasetInput!] modelInputs: [MlflowModelInput!]
}
type MlflowModelOutput { modelId: String step: LongString }
type MlflowRunOutputs { modelOutputs: [MlflowModelOutput!] }

type MlflowModelVersionTag { key: String value: String }
type MlflowModelVersion {
  name: String version: String creationTimestamp: LongString
  lastUpdatedTimestamp: LongString userId: String currentStage: String
  description: String source: String runId: String status: MlflowModelVersionStatus
  statusMessage: String tags: [MlflowModelVersionTag!] runLink: String aliases: [String]
  modelId: String
}

type MlflowRunExtension {
  info: MlflowRunInfo data: MlflowRunData inputs: MlflowRunInputs
  outputs: MlflowRunOutputs experiment: MlflowExperiment
  modelVersions: [MlflowModelVersion!]
}

type MlflowGetExperimentResponse { experiment: MlflowExperiment apiError: ApiError }
type MlflowGetRunResponse { run: MlflowRunExtension apiError: ApiError }
type MlflowSearchRunsResponse {
  runs: [MlflowRunExtension!] nextPageToken: String apiError: ApiError
}
type MlflowMetricWithRunId {
  key: String value: Float timestamp: LongString step: LongString runId: String
}
type MlflowGetMetricHistoryBulkIntervalResponse {
  metrics: [MlflowMetricWithRunId!] apiError: ApiError
}
type MlflowFileInfo { path: String isDir: Boolean fileSize: LongString }
type MlflowListArtifactsResponse {
  rootUri: String files: [MlflowFileInfo!] nextPageToken: String apiError: ApiError
}
type MlflowSearchModelVersionsResponse {
  modelVersions: [MlflowModelVersion!] nextPageToken: String apiError: ApiError
}
type MlflowDatasetSummary {
  experimentId: String name: String digest: String context: String
}
type MlflowSearchDatasetsResponse {
  datasetSummaries: [MlflowDatasetSummary!] apiError: ApiError
}
type Test { output: String }
type TestMutation { output: String }

input MlflowGetExperimentInput { experimentId: String }
input MlflowGetRunInput { runId: String runUuid: String }
input MlflowSearchRunsInput {
  experimentIds: [String] filter: String runViewType: MlflowViewType maxResults: Int
  orderBy: [String] pageToken: String
}
input MlflowGetMetricHistoryBulkIntervalInput {
  runIds: [String] metricKey: String startStep: Int endStep: Int maxResults: Int
}
input MlflowListArtifactsInput {
  runId: String runUuid: String path: String pageToken: String
}
input MlflowSearchModelVersionsInput {
  filter: String maxResults: LongString orderBy: [String] pageToken: String
}
input MlflowSearchDatasetsInput { experimentIds: [String] }

type Query {
  test(inputString: String): Test
  mlflowGetExperiment(input: MlflowGetExperimentInput): MlflowGetExperimentResponse
  mlflowGetRun(input: MlflowGetRunInput): MlflowGetRunResponse
  mlflowSearchRuns(input: MlflowSearchRunsInput): MlflowSearchRunsResponse
  mlflowGetMetricHistoryBulkInterval(
    input: MlflowGetMetricHistoryBulkIntervalInput
  ): MlflowGetMetricHistoryBulkIntervalResponse
  mlflowListArtifacts(input: MlflowListArtifactsInput): MlflowListArtifactsResponse
  mlflowSearchModelVersions(
    input: MlflowSearchModelVersionsInput
  ): MlflowSearchModelVersionsResponse
}

type Mutation {
  testMutation(inputString: String): TestMutation
  mlflowSearchRuns(input: MlflowSearchRunsInput): MlflowSearchRunsResponse
  mlflowSearchDatasets(input: MlflowSearchDatasetsInput): MlflowSearchDatasetsResponse
}
"""


@dataclass(frozen=True)
class Services:
    """What a resolver reads with: the caller and the services the REST routes call."""

    principal: Principal
    tracking: TrackingService
    registry: RegistryService


#: The fields MLflow's schema types ``LongString``: int64 values sent as their digits, so
#: JavaScript's numbers do not round them. Resolvers write them as strings themselves (the
#: scalar passes values through, in every graphql-core version).
LONG_FIELDS = frozenset(
    {
        "creationTime",
        "lastUpdateTime",
        "startTime",
        "endTime",
        "timestamp",
        "step",
        "fileSize",
        "creationTimestamp",
        "lastUpdatedTimestamp",
    }
)


def _long(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _integer(value: Any, name: str) -> int | None:
    """An integer input sent as a number or as its digits (``LongString``); None if unset."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidParameter(f"Parameter '{name}' must be an integer.")
    try:
        return int(value)
    except ValueError:
        raise InvalidParameter(f"Parameter '{name}' must be an integer.") from None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def camel_keys(value: Mapping[str, Any]) -> dict[str, Any]:
    """A protobuf-JSON object with its keys as GraphQL's fields name them (``run_id`` ->
    ``runId``), all the way down, and its int64 fields as strings."""
    out = {}
    for key, item in value.items():
        name = _camel(key)
        out[name] = _long(item) if name in LONG_FIELDS else _camel_value(item)
    return out


def _camel_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return camel_keys(value)
    if isinstance(value, list | tuple):
        return [_camel_value(v) for v in value]
    return value


def _finite(value: Any) -> Any:
    """A metric's value as GraphQL's Float can carry it: NaN and the infinities as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _input(args: Mapping[str, Any]) -> Mapping[str, Any]:
    found = args.get("input") or {}
    return found if isinstance(found, Mapping) else {}


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidParameter(f"Missing value for required parameter '{name}'.")
    return value


# ---------------------------------------------------------------------- resolvers
def _experiment(s: Services, experiment_id: str) -> dict[str, Any]:
    return camel_keys(_proto.experiment_json(s.tracking.experiment(s.principal, experiment_id)))


def _run(s: Services, run: Run) -> dict[str, Any]:
    """A run as ``MlflowRunExtension``: its experiment and model versions are read only when
    the query selects them (the default resolver calls them)."""
    body = camel_keys(_proto.run_json(run))
    for metric in body["data"]["metrics"]:
        metric["value"] = _finite(metric["value"])
    run_id, experiment_id = run.info.run_id, run.info.experiment_id
    body["experiment"] = _guarded(lambda: _experiment(s, experiment_id))
    body["modelVersions"] = _guarded(lambda: _run_model_versions(s, run_id))
    return body


def _guarded(read: Callable[[], Any]) -> Callable[..., Any]:
    """A field read only when selected, failing as a root field does (see ``_answer``)."""

    def resolve(info: Any, **_args: Any) -> Any:
        return _answer(info.field_name, read)

    return resolve


def _run_model_versions(s: Services, run_id: str) -> list[dict[str, Any]]:
    page = s.registry.search_model_versions(
        s.principal,
        filter_string=f"run_id='{run_id}'",
        order_by=[],
        max_results=MAX_RUN_MODEL_VERSIONS,
        page_token=None,
    )
    return [camel_keys(model_version_json(v)) for v in page.items]


def get_experiment(s: Services, args: Mapping[str, Any]) -> dict[str, Any]:
    experiment_id = _text(_input(args).get("experimentId"), "experiment_id")
    return {"experiment": _experiment(s, experiment_id)}


def get_run(s: Services, args: Mapping[str, Any]) -> dict[str, Any]:
    given = _input(args)
    run_id = _text(given.get("runId") or given.get("runUuid"), "run_id")
    return {"run": _run(s, s.tracking.get_run(s.principal, run_id))}


def search_runs(s: Services, args: Mapping[str, Any]) -> dict[str, Any]:
    given = _input(args)
    max_results = given.get("maxResults") or MAX_SEARCH_RUNS
    if not 1 <= max_results <= MAX_SEARCH_RUNS:
        raise InvalidParameter(f"maxResults must be between 1 and {MAX_SEARCH_RUNS}.")
    page = s.tracking.search_runs(
        s.principal,
        experiment_ids=[str(e) for e in given.get("experimentIds") or []],
        filter_string=given.get("filter"),
        view=view_type(given.get("runViewType")),
        max_results=max_results,
        order_by=[str(o) for o in given.get("orderBy") or []],
        page_token=given.get("pageToken"),
        unknown_experiments="skip",
    )
    return {"runs": [_run(s, r) for r in page.items], "nextPageToken": page.next_page_token}


def metric_history_bulk_interval(s: Services, args: Mapping[str, Any]) -> dict[str, Any]:
    given = _input(args)
    metrics = s.tracking.metric_history_sampled(
        s.principal,
        [str(r) for r in given.get("runIds") or []],
        _text(given.get("metricKey"), "metric_key"),
        (given.get("startStep"), given.get("endStep")),
        given.get("maxResults") or MAX_SAMPLED_POINTS,
    )
    return {
        "metrics": [
            {
                "key": m.key,
                "value": _finite(m.value),
                "timestamp": str(m.timestamp),
                "step": str(m.step),
                "runId": m.run_id,
            }
            for m in metrics
        ]
    }


def list_artifacts(s: Services, args: Mapping[str, Any]) -> dict[str, Any]:
    given = _input(args)
    run_id = _text(given.get("runId") or given.get("runUuid"), "run_id")
    root, files = s.tracking.files.list_run(s.principal, run_id, given.get("path") or "")
    return {
        "rootUri": root,
        # A folder's size is 0 here (the stock server's GraphQL answer), not absent as in REST.
        "files": [
            {"path": f.path, "isDir": f.is_dir, "fileSize": _long(f.file_size or 0)} for f in files
        ],
    }


def search_model_versions(s: Services, args: Mapping[str, Any]) -> dict[str, Any]:
    given = _input(args)
    page = s.registry.search_model_versions(
        s.principal,
        filter_string=given.get("filter"),
        order_by=[str(o) for o in given.get("orderBy") or []],
        max_results=_integer(given.get("maxResults"), "max_results") or MAX_RUN_MODEL_VERSIONS,
        page_token=given.get("pageToken"),
    )
    return {
        "modelVersions": [camel_keys(model_version_json(v)) for v in page.items],
        "nextPageToken": page.next_page_token,
    }


def search_datasets(s: Services, args: Mapping[str, Any]) -> dict[str, Any]:
    ids = [str(e) for e in _input(args).get("experimentIds") or []]
    found = s.tracking.dataset_summaries(s.principal, ids)
    return {
        "datasetSummaries": [
            # No context tag reads as "" here, as a stock server's GraphQL answers it.
            {"experimentId": e, "name": n, "digest": d, "context": c or ""}
            for e, n, d, c in found
        ]
    }


def _echo(_s: Services, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"output": args.get("inputString")}


Resolver = Callable[[Services, Mapping[str, Any]], dict[str, Any]]
QUERIES: dict[str, Resolver] = {
    "test": _echo,
    "mlflowGetExperiment": get_experiment,
    "mlflowGetRun": get_run,
    "mlflowSearchRuns": search_runs,
    "mlflowGetMetricHistoryBulkInterval": metric_history_bulk_interval,
    "mlflowListArtifacts": list_artifacts,
    "mlflowSearchModelVersions": search_model_versions,
}
MUTATIONS: dict[str, Resolver] = {
    "testMutation": _echo,
    "mlflowSearchRuns": search_runs,
    "mlflowSearchDatasets": search_datasets,
}


def _answer(field_name: str, read: Callable[[], Any]) -> Any:
    """``read()``; a service's refusal becomes the field's error in its own words, anything
    else a bare "internal error" (logged here, never sent)."""
    try:
        return read()
    except ShamalError as exc:
        raise GraphQLError(exc.message) from None
    except Exception:  # noqa: BLE001 - an answer says what failed, never how
        logger.exception("GraphQL field %s failed", field_name)
        raise GraphQLError("internal error") from None


def _root_field(resolver: Resolver) -> Callable[..., Any]:
    def resolve(_root: Any, info: Any, **args: Any) -> Any:
        services: Services = info.context
        return _answer(info.field_name, lambda: resolver(services, args))

    return resolve


@cache
def schema() -> GraphQLSchema:
    """The schema, built once, with the root fields' resolvers."""
    built = build_schema(SCHEMA_SDL)
    for type_name, resolvers in (("Query", QUERIES), ("Mutation", MUTATIONS)):
        root = built.type_map[type_name]
        for field_name, resolver in resolvers.items():
            root.fields[field_name].resolve = _root_field(resolver)  # type: ignore[attr-defined]
    return built


# ---------------------------------------------------------------------- bounds
def _fragments(document: DocumentNode) -> dict[str, FragmentDefinitionNode]:
    return {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}


class _Tally:
    def __init__(self, fragments: Mapping[str, FragmentDefinitionNode]) -> None:
        self.fragments = fragments
        self.selections = 0
        self.aliases = 0

    def walk(
        self, selection_set: SelectionSetNode | None, depth: int, seen: frozenset[str]
    ) -> None:
        if selection_set is None:
            return
        if depth > MAX_DEPTH:
            raise GraphQLError(f"Query exceeds maximum depth of {MAX_DEPTH}")
        for node in selection_set.selections:
            self.selections += 1
            if self.selections > MAX_SELECTIONS:
                raise GraphQLError(f"Query exceeds maximum total selections of {MAX_SELECTIONS}")
            if isinstance(node, FieldNode):
                self.aliases += node.alias is not None
                self.walk(node.selection_set, depth + 1, seen)
            elif isinstance(node, InlineFragmentNode):
                self.walk(node.selection_set, depth, seen)
            elif isinstance(node, FragmentSpreadNode) and node.name.value not in seen:
                found = self.fragments.get(node.name.value)
                if found is not None:
                    self.walk(found.selection_set, depth, seen | {node.name.value})


def check_bounds(document: DocumentNode) -> None:
    """Refuse a query past the bounds before anything runs.

    Raises:
        GraphQLError: too deep, too many selections, root fields or aliases.
    """
    tally = _Tally(_fragments(document))
    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            roots = definition.selection_set.selections
            if len(roots) > MAX_ROOT_FIELDS:
                raise GraphQLError(
                    f"GraphQL queries should have at most {MAX_ROOT_FIELDS} root fields, "
                    f"got {len(roots)}"
                )
            tally.walk(definition.selection_set, 1, frozenset())
    if tally.aliases > MAX_ALIASES:
        raise GraphQLError(
            f"GraphQL queries should have at most {MAX_ALIASES} aliases, got {tally.aliases}"
        )


def run_query(
    services: Services,
    query: Any,
    variables: Any = None,
    operation_name: Any = None,
) -> dict[str, Any]:
    """Execute one GraphQL request as a stock server answers it: ``{"data": ...,
    "errors": [message, ...] | None}``.

    A request that is not a query string, does not parse, is past the bounds or does not
    validate against the schema answers its errors and no data.
    """
    refused = _request_problem(query, variables, operation_name)
    if refused:
        return _failed([refused])
    try:
        document = parse(query, max_tokens=MAX_QUERY_CHARS)
        check_bounds(document)
    except GraphQLError as exc:
        return _failed([exc.message])
    problems = validate(schema(), document)
    if problems:
        return _failed([p.message for p in problems[:20]])
    result = execute(
        schema(),
        document,
        context_value=services,
        variable_values=variables,
        operation_name=operation_name,
    )
    if not isinstance(result, ExecutionResult):  # every resolver is plain, never async
        raise TypeError("a GraphQL resolver returned an awaitable")
    errors = [e.message for e in result.errors] if result.errors else None
    return {"data": result.data, "errors": errors}


def _request_problem(query: Any, variables: Any, operation_name: Any) -> str | None:
    """What is wrong with the request's shape, before it is parsed; None when nothing."""
    if not isinstance(query, str) or not query.strip():
        return "Provide a GraphQL query string as 'query'."
    if len(query) > MAX_QUERY_CHARS:
        return f"The query is longer than {MAX_QUERY_CHARS} characters."
    if variables is not None and not isinstance(variables, dict):
        return "'variables' must be a JSON object."
    if operation_name is not None and not isinstance(operation_name, str):
        return "'operationName' must be a string."
    return None


def _failed(messages: list[str]) -> dict[str, Any]:
    return {"data": None, "errors": messages}
