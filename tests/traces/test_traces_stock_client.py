"""Traces through the stock ``mlflow`` client and a plain OpenTelemetry SDK exporter, against
a live Shamal on SQLite and PostgreSQL (issue 26, point 4).

``@mlflow.trace`` and ``mlflow.start_span`` log each span to ``/v1/traces`` as it ends and
the trace's info when it ends; ``mlflow.get_trace``, ``mlflow.search_traces``, the client's
tag and delete calls read and change them; another team sees nothing. Spans exported by the
OpenTelemetry SDK's own OTLP/HTTP exporter are read back by the mlflow client.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities import SpanEvent, TraceData
from mlflow.entities.trace_location import MlflowExperimentLocation
from mlflow.exceptions import MlflowException
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.live import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture
def experiment(mlflow_env: LiveServer) -> Iterator[str]:
    """A new experiment that ``@mlflow.trace`` logs to, with the client's default export (a
    batch span processor, then an async queue: see :func:`_traced`); the tracer is reset
    afterwards, so no other test inherits its destination."""
    experiment_id = MlflowClient().create_experiment(f"traces-{uuid.uuid4().hex[:8]}")
    mlflow.tracing.reset()
    mlflow.tracing.set_destination(MlflowExperimentLocation(experiment_id=experiment_id))
    yield experiment_id
    mlflow.tracing.reset()


@mlflow.trace(span_type="LLM")
def _llm(question: str) -> str:
    return question.upper()


@mlflow.trace(span_type="CHAIN")
def _answer(question: str) -> str:
    with mlflow.start_span(name="retrieve", span_type="RETRIEVER") as span:
        span.set_inputs({"query": question})
        span.set_outputs(["doc-1"])
    return _llm(question)


def _traced(question: str) -> str:
    _answer(question)
    # The client's own way to wait until the spans and the trace's info have been sent.
    mlflow.flush_trace_async_logging()
    trace_id = mlflow.get_last_active_trace_id()
    assert trace_id is not None
    return trace_id


def test_traced_functions_are_recorded_and_read_back(experiment: str) -> None:
    trace_id = _traced("why")
    trace = mlflow.get_trace(trace_id)
    assert trace is not None
    assert trace.info.experiment_id == experiment
    assert trace.info.state.value == "OK"
    assert [s.name for s in trace.data.spans] == ["_answer", "retrieve", "_llm"]
    root, retrieve, llm = trace.data.spans
    assert (root.inputs, root.outputs) == ({"question": "why"}, "WHY")
    assert (retrieve.inputs, retrieve.outputs) == ({"query": "why"}, ["doc-1"])
    assert (root.span_type, retrieve.span_type, llm.span_type) == ("CHAIN", "RETRIEVER", "LLM")
    assert retrieve.parent_id == root.span_id == llm.parent_id
    assert trace.info.request_preview is not None
    assert "why" in trace.info.request_preview
    assert trace.info.execution_time_ms is not None

    client = MlflowClient()
    same = client.get_trace(trace_id)
    assert [s.span_id for s in same.data.spans] == [s.span_id for s in trace.data.spans]


def test_search_tags_and_delete_through_the_client(experiment: str) -> None:
    first, second = _traced("a"), _traced("b")
    client = MlflowClient()
    client.set_trace_tag(first, "reviewed", "yes")
    found = mlflow.search_traces(
        locations=[experiment], filter_string="tags.reviewed = 'yes'", return_type="list"
    )
    assert [t.info.trace_id for t in found] == [first]
    assert [s.name for s in found[0].data.spans] == ["_answer", "retrieve", "_llm"]
    everything = mlflow.search_traces(
        locations=[experiment], order_by=["timestamp_ms ASC"], return_type="list"
    )
    assert [t.info.trace_id for t in everything] == [first, second]
    spans = mlflow.search_traces(
        locations=[experiment], filter_string="span.name = 'retrieve'", return_type="list"
    )
    assert {t.info.trace_id for t in spans} == {first, second}
    client.delete_trace_tag(first, "reviewed")
    assert "reviewed" not in client.get_trace(first).info.tags

    assert client.delete_traces(experiment, trace_ids=[first]) == 1
    left = mlflow.search_traces(locations=[experiment], return_type="list")
    assert [t.info.trace_id for t in left] == [second]
    with pytest.raises(MlflowException) as gone:
        client.get_trace(first)
    assert gone.value.error_code == "RESOURCE_DOES_NOT_EXIST"


def _account(server: LiveServer, team: str, user: str, role: str | None) -> str:
    admin = {"Authorization": f"Bearer {server.token}"}
    assert httpx.post(f"{server.url}/api/v1/users", json={"name": user}, headers=admin)
    if role is not None:
        joined = httpx.put(
            f"{server.url}/api/v1/teams/{team}/members/{user}", json={"role": role}, headers=admin
        )
        assert joined.is_success, joined.text
    made = httpx.post(
        f"{server.url}/api/v1/tokens", json={"name": "t", "user": user}, headers=admin
    )
    assert made.is_success, made.text
    secret: str = made.json()["secret"]
    return secret


def test_another_team_sees_no_trace(
    mlflow_env: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = f"nlp-{uuid.uuid4().hex[:6]}"
    admin = {"Authorization": f"Bearer {mlflow_env.token}"}
    assert httpx.post(f"{mlflow_env.url}/api/v1/teams", json={"name": team}, headers=admin)
    member = _account(mlflow_env, team, f"m-{team}", "member")
    outsider = _account(mlflow_env, team, f"o-{team}", None)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", member)
    experiment = MlflowClient().create_experiment(f"team-traces-{team}", tags={"shamal.team": team})
    mlflow.tracing.reset()
    mlflow.tracing.set_destination(MlflowExperimentLocation(experiment_id=experiment))
    try:
        trace_id = _traced("secret")
    finally:
        mlflow.tracing.reset()
    assert len(mlflow.search_traces(locations=[experiment], return_type="list")) == 1

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", outsider)
    assert mlflow.search_traces(locations=[experiment], return_type="list") == []
    client = MlflowClient()
    with pytest.raises(MlflowException) as hidden:
        client.get_trace(trace_id)
    assert hidden.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    with pytest.raises(MlflowException) as refused:
        client.set_trace_tag(trace_id, "k", "v")
    assert refused.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", member)
    assert "k" not in MlflowClient().get_trace(trace_id).info.tags


def test_a_plain_opentelemetry_exporter_records_traces(
    experiment: str, mlflow_env: LiveServer
) -> None:
    """The OpenTelemetry SDK's OTLP/HTTP exporter, pointed at `/v1/traces` with the
    experiment header and a bearer token: the mlflow client reads what it sent."""
    exporter = OTLPSpanExporter(
        endpoint=f"{mlflow_env.url}/v1/traces",
        headers={
            "x-mlflow-experiment-id": experiment,
            "Authorization": f"Bearer {mlflow_env.token}",
        },
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("shamal-tests")
    with tracer.start_as_current_span("handle request") as root:
        root.set_attribute("http.route", "/ask")
        with tracer.start_as_current_span("query db") as child:
            child.set_attribute("db.rows", 3)
    provider.shutdown()

    trace_id = f"tr-{root.get_span_context().trace_id:032x}"
    trace = MlflowClient().get_trace(trace_id)
    assert trace.info.experiment_id == experiment
    assert trace.info.state.value == "OK"
    assert [s.name for s in trace.data.spans] == ["handle request", "query db"]
    assert trace.data.spans[0].attributes["http.route"] == "/ask"
    assert trace.data.spans[1].attributes["db.rows"] == 3
    found = mlflow.search_traces(
        locations=[experiment], filter_string="span.name = 'query db'", return_type="list"
    )
    assert [t.info.trace_id for t in found] == [trace_id]


def test_the_trace_artifact_is_the_clients_own_trace_data(
    experiment: str, mlflow_env: LiveServer
) -> None:
    """`get-trace-artifact` (what the stock UI reads) answers the spans exactly as the
    client's own ``Span.to_dict`` writes them."""
    with mlflow.start_span(name="test") as span:
        span.set_attributes({"fruit": "apple", "count": 3})
        span.add_event(SpanEvent("test_event", timestamp=99999, attributes={"foo": "bar"}))
    mlflow.flush_trace_async_logging()
    answer = httpx.get(
        f"{mlflow_env.url}/ajax-api/2.0/mlflow/get-trace-artifact",
        params={"request_id": span.trace_id},
        headers={"Authorization": f"Bearer {mlflow_env.token}"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-disposition"] == "attachment; filename=traces.json"
    data = TraceData.from_dict(json.loads(answer.text))
    assert [s.to_dict() for s in data.spans] == [span.to_dict()]


def test_client_started_traces_paging_runs_and_bulk_deletes(
    experiment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's own trace calls: ``start_trace``/``end_trace``, ``update_current_trace``,
    search pages followed by token, a trace made inside a run found by its ``run_id``, and
    deletes by age with ``max_traces``."""
    # The run below is this test's own: a run id another test left in the environment (as a
    # job's is) would make the client resume that run instead.
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    client = MlflowClient()
    made = []
    start_ns = time.time_ns() - 60 * 10**9  # a second apart, so that the order is certain
    for i, (name, status) in enumerate((("t1", "OK"), ("t2", "OK"), ("t3", "ERROR"))):
        at = start_ns + i * 10**9
        root = client.start_trace(name=name, experiment_id=experiment, start_time_ns=at)
        client.end_trace(trace_id=root.trace_id, status=status, end_time_ns=at + 10**6)
        made.append(root.trace_id)
    mlflow.flush_trace_async_logging()
    newest_first = client.search_traces(locations=[experiment])
    assert [t.info.trace_id for t in newest_first] == made[::-1]
    ok = client.search_traces(
        locations=[experiment], filter_string="status = 'OK'", order_by=["timestamp ASC"]
    )
    assert [t.info.trace_id for t in ok] == made[:2]
    first = client.search_traces(locations=[experiment], max_results=2)
    assert [t.info.trace_id for t in first] == made[:0:-1]
    assert first.token is not None
    rest = client.search_traces(locations=[experiment], page_token=first.token)
    assert ([t.info.trace_id for t in rest], rest.token) == ([made[0]], None)

    with mlflow.start_span(name="tagged"):
        mlflow.update_current_trace(tags={"tag1": "football"}, metadata={"meta1": "apple"})
    run = client.create_run(experiment)
    with mlflow.start_run(run_id=run.info.run_id), mlflow.start_span(name="in-run") as in_run:
        pass
    mlflow.flush_trace_async_logging()
    tagged = client.search_traces(locations=[experiment], filter_string="tags.tag1 = 'football'")
    assert [t.info.trace_metadata["meta1"] for t in tagged] == ["apple"]
    by_run = client.search_traces(
        locations=[experiment], filter_string=f"attribute.run_id = '{run.info.run_id}'"
    )
    assert [t.info.trace_id for t in by_run] == [in_run.trace_id]

    assert client.delete_traces(experiment, max_timestamp_millis=10**15, max_traces=1) == 1
    left = {t.info.trace_id for t in client.search_traces(locations=[experiment])}
    assert made[0] not in left
    assert len(left) == 4
    assert client.delete_traces(experiment, max_timestamp_millis=10**15) == 4
    assert list(client.search_traces(locations=[experiment])) == []


def test_full_text_search_matches_what_the_client_wrote_not_otlp_key_names(
    experiment: str,
) -> None:
    """``trace.text`` searches the spans as the client's own span dicts read, as on a stock
    server: ``%value%`` finds the traces whose attributes hold "value1" and "value2", never a
    trace only because OTLP's JSON spells every attribute with a ``value`` key."""
    client = MlflowClient()

    def made(name: str, attributes: dict[str, str]) -> str:
        root = client.start_trace(name=name, experiment_id=experiment)
        root.set_attributes(attributes)
        client.end_trace(trace_id=root.trace_id, status="OK")
        return root.trace_id

    first = made("trace1", {"test": "value1"})
    second = made("trace2", {"test": "value2"})
    third = made("trace3", {"test3": "I like it"})
    mlflow.flush_trace_async_logging()

    def found(text: str) -> set[str]:
        traces = client.search_traces(locations=[experiment], filter_string=f"trace.text {text}")
        return {t.info.trace_id for t in traces}

    assert found("LIKE '%trace%'") == {first, second, third}
    assert found("LIKE '%value%'") == {first, second}
    assert found("LIKE '%I like it%'") == {third}
    assert found("ILIKE '%i LIKE IT%'") == {third}
    assert found("LIKE '%string_value%'") == set()
