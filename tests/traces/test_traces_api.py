"""MLflow 3's trace API and OTLP span ingestion, in process, on SQLite and PostgreSQL: what
is stored, how searches read it, who may see it, and what hostile input changes (nothing)."""

from __future__ import annotations

import base64
import gzip
import json
import uuid
from typing import Any

from fastapi.testclient import TestClient

from shamal.traces import MAX_SPAN_BYTES, MAX_SPANS_PER_REQUEST
from tests.traces.otlp import (
    HEADER,
    PROTOBUF,
    SpanSpec,
    json_of,
    mlflow_id,
    new_trace_id,
    protobuf_of,
    request_of,
)

V3 = "/api/3.0/mlflow"
V2 = "/api/2.0/mlflow"


def _experiment(api: TestClient, headers: dict[str, str] | None = None, team: str = "") -> str:
    tags = [{"key": "shamal.team", "value": team}] if team else []
    made = api.post(
        f"{V2}/experiments/create",
        json={"name": f"traces-{uuid.uuid4().hex[:8]}", "tags": tags},
        headers=headers or {},
    )
    assert made.status_code == 200, made.text
    experiment_id: str = made.json()["experiment_id"]
    return experiment_id


def _export(
    api: TestClient,
    experiment_id: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    content_type: str = "application/x-protobuf",
) -> Any:
    return api.post(
        "/v1/traces",
        content=body,
        headers={"Content-Type": content_type, HEADER: experiment_id, **(headers or {})},
    )


def _trace_info(
    trace_id: str,
    experiment_id: str,
    *,
    request_time: str = "2026-11-28T08:00:00.250Z",
    state: str = "OK",
    tags: dict[str, str] | None = None,
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "trace": {
            "trace_info": {
                "trace_id": trace_id,
                "trace_location": {
                    "type": "MLFLOW_EXPERIMENT",
                    "mlflow_experiment": {"experiment_id": experiment_id},
                },
                "request_time": request_time,
                "execution_duration": "1.500s",
                "state": state,
                "request_preview": '{"question": "why"}',
                "trace_metadata": metadata or {},
                "tags": tags or {},
            }
        }
    }


def _search(api: TestClient, experiment_id: str, **fields: Any) -> dict[str, Any]:
    body = {
        "locations": [
            {"type": "MLFLOW_EXPERIMENT", "mlflow_experiment": {"experiment_id": experiment_id}}
        ],
        **fields,
    }
    found = api.post(f"{V3}/traces/search", json=body)
    assert found.status_code == 200, found.text
    answer: dict[str, Any] = found.json()
    return answer


def _ids(answer: dict[str, Any]) -> list[str]:
    return [t["trace_id"] for t in answer.get("traces", [])]


def _account(api: TestClient, name: str, role: str | None, team: str = "vision") -> dict[str, str]:
    api.post("/api/v1/users", json={"name": name})
    if role:
        joined = api.put(f"/api/v1/teams/{team}/members/{name}", json={"role": role})
        assert joined.status_code == 200, joined.text
    secret = api.post("/api/v1/tokens", json={"name": "t", "user": name}).json()["secret"]
    return {"Authorization": f"Bearer {secret}"}


# ---------------------------------------------------------------------- storing and reading
def test_spans_make_a_trace_that_its_info_then_completes(api: TestClient) -> None:
    """Spans come first (as the stock client sends them when each ends) and make the trace;
    StartTraceV3 then completes its info; the spans stay, root first."""
    exp = _experiment(api)
    trace = new_trace_id()
    root = SpanSpec(
        "agent",
        trace,
        attributes={"mlflow.spanInputs": '{"q": 1}', "mlflow.spanOutputs": '"done"'},
    )
    child = SpanSpec(
        "llm",
        trace,
        parent=root.span_id,
        start_ns=root.start_ns + 100_000_000,
        end_ns=root.start_ns + 200_000_000,
        attributes={"mlflow.spanType": '"LLM"'},
    )
    sent = _export(api, exp, protobuf_of(child))
    assert (sent.status_code, sent.content) == (200, b"")
    assert sent.headers["content-type"] == "application/x-protobuf"
    tid = mlflow_id(trace)
    partial = api.get(f"{V3}/traces/{tid}").json()["trace"]["trace_info"]
    assert partial["state"] == "IN_PROGRESS"
    assert partial["tags"]["mlflow.trace.spansLocation"] == "TRACKING_STORE"
    assert _export(api, exp, protobuf_of(root)).status_code == 200

    info = api.get(f"{V3}/traces/{tid}").json()["trace"]["trace_info"]
    assert info["state"] == "OK"
    assert info["trace_location"]["mlflow_experiment"]["experiment_id"] == exp
    assert (info["request_preview"], info["response_preview"]) == ('{"q": 1}', '"done"')
    assert info["request_time"] == "2023-11-14T22:13:20Z"
    assert info["execution_duration"] == "0.500s"
    assert info["tags"]["mlflow.traceName"] == "agent"

    started = api.post(
        f"{V3}/traces",
        json=_trace_info(tid, exp, tags={"team": "a"}, metadata={"mlflow.user": "mia"}),
    )
    assert started.status_code == 200, started.text
    saved = started.json()["trace"]["trace_info"]
    assert saved["request_time"] == "2026-11-28T08:00:00.250Z"
    assert saved["execution_duration"] == "1.500s"
    assert saved["tags"]["team"] == "a"
    assert saved["trace_metadata"] == {"mlflow.user": "mia"}

    got = api.get(f"{V3}/traces/get", params={"trace_id": tid}).json()["trace"]
    assert [s["name"] for s in got["spans"]] == ["agent", "llm"]
    assert got["spans"][1]["parent_span_id"] == got["spans"][0]["span_id"]
    assert got["trace_info"]["tags"]["team"] == "a"
    batch = api.get(f"{V3}/traces/batchGet", params={"trace_ids": [tid, "tr-missing"]})
    assert [t["trace_info"]["trace_id"] for t in batch.json()["traces"]] == [tid]
    infos = api.post(f"{V3}/traces/batchGetInfos", json={"trace_ids": [tid]}).json()
    assert [i["trace_id"] for i in infos["trace_infos"]] == [tid]


def test_otlp_json_with_hex_ids_is_read_as_protobuf_is(api: TestClient) -> None:
    exp = _experiment(api)
    trace = new_trace_id()
    root = SpanSpec("root", trace, error=True)
    sent = _export(api, exp, json_of(root), content_type="application/json")
    assert (sent.status_code, sent.json()) == (200, {})
    got = api.get(f"{V3}/traces/get", params={"trace_id": mlflow_id(trace)}).json()["trace"]
    assert got["trace_info"]["state"] == "ERROR"
    span = got["spans"][0]
    # Protobuf JSON, as the stock client parses it: bytes in base64.
    assert span["span_id"] == base64.b64encode(root.span_id).decode()
    gz = _export(
        api,
        exp,
        gzip.compress(protobuf_of(SpanSpec("c", trace, parent=root.span_id))),
        headers={"Content-Encoding": "gzip"},
    )
    assert gz.status_code == 200, gz.text
    again = api.get(f"{V3}/traces/get", params={"trace_id": mlflow_id(trace)}).json()
    assert len(again["trace"]["spans"]) == 2


def test_a_trace_waits_for_the_spans_its_size_stats_count(api: TestClient) -> None:
    """Without allow_partial, a trace whose size stats promise more spans than arrived is
    not served whole (the stock client retries); with it, what arrived is."""
    exp = _experiment(api)
    trace = new_trace_id()
    tid = mlflow_id(trace)
    stats = json.dumps({"num_spans": 2})
    assert _export(api, exp, protobuf_of(SpanSpec("root", trace))).status_code == 200
    api.post(f"{V3}/traces", json=_trace_info(tid, exp, metadata={"mlflow.trace.sizeStats": stats}))
    waiting = api.get(f"{V3}/traces/get", params={"trace_id": tid})
    assert waiting.status_code == 404
    partial = api.get(f"{V3}/traces/get", params={"trace_id": tid, "allow_partial": "true"})
    assert len(partial.json()["trace"]["spans"]) == 1
    assert api.get(f"{V3}/traces/batchGet", params={"trace_ids": [tid]}).json() == {"traces": []}


# ---------------------------------------------------------------------- search
def test_search_filters_orders_and_pages(api: TestClient) -> None:
    exp = _experiment(api)
    other = _experiment(api)
    ids = []
    for i in range(5):
        tid = mlflow_id(new_trace_id())
        ids.append(tid)
        body = _trace_info(
            tid,
            exp,
            request_time=f"2026-11-28T08:00:0{i}Z",
            state="ERROR" if i == 4 else "OK",
            tags={"mlflow.traceName": f"step-{i % 2}", "kind": "even" if i % 2 == 0 else "odd"},
            metadata={"mlflow.sourceRun": "run-a"} if i < 2 else {},
        )
        assert api.post(f"{V3}/traces", json=body).status_code == 200
    api.post(f"{V3}/traces", json=_trace_info(mlflow_id(new_trace_id()), other))
    span_trace = new_trace_id()
    _export(api, exp, protobuf_of(SpanSpec("retrieve", span_trace)))

    # The span-only trace started in 2023: the oldest.
    assert _ids(_search(api, exp, order_by=["timestamp_ms ASC"])) == [mlflow_id(span_trace), *ids]
    assert _ids(_search(api, exp, filter="tags.kind = 'odd'")) == [ids[3], ids[1]]
    assert _ids(_search(api, exp, filter="trace.status = 'ERROR'")) == [ids[4]]
    assert _ids(_search(api, exp, filter="attributes.status IN ('ERROR')")) == [ids[4]]
    assert sorted(_ids(_search(api, exp, filter="name = 'step-0'"))) == sorted(ids[0::2])
    assert _ids(_search(api, exp, filter="run_id = 'run-a'", order_by=["timestamp"])) == ids[:2]
    assert _ids(_search(api, exp, filter="metadata.mlflow.sourceRun = 'run-a'"))[-1] == ids[0]
    assert _ids(_search(api, exp, filter="span.name = 'retrieve'")) == [mlflow_id(span_trace)]
    late = _search(api, exp, filter="timestamp_ms >= 1795852803000 AND tags.kind != 'even'")
    assert _ids(late) == [ids[3]]
    assert _ids(_search(api, exp, filter="tags.kind IS NULL")) == [mlflow_id(span_trace)]

    seen: list[str] = []
    token = None
    while True:
        page = _search(api, exp, max_results=2, order_by=["timestamp_ms"], page_token=token)
        seen += _ids(page)
        token = page.get("next_page_token")
        if not token:
            break
    assert seen == [mlflow_id(span_trace), *ids]
    for bad in ("tags.kind ~ 'x'", "params.a = '1'", "timestamp_ms = 'x'", "span.what = 'x'"):
        refused = api.post(
            f"{V3}/traces/search",
            json={"locations": [{"mlflow_experiment": {"experiment_id": exp}}], "filter": bad},
        )
        assert refused.json()["error_code"] == "INVALID_PARAMETER_VALUE", bad


# ---------------------------------------------------------------------- tags, links, deletes
def test_tags_links_and_deletes(api: TestClient) -> None:
    exp = _experiment(api)
    tid = mlflow_id(new_trace_id())
    assert api.post(f"{V3}/traces", json=_trace_info(tid, exp)).status_code == 200
    assert api.patch(f"{V2}/traces/{tid}/tags", json={"key": "k", "value": "v"}).status_code == 200
    assert api.get(f"{V3}/traces/{tid}").json()["trace"]["trace_info"]["tags"]["k"] == "v"
    assert api.request("DELETE", f"{V2}/traces/{tid}/tags", json={"key": "k"}).status_code == 200
    missing = api.request("DELETE", f"{V2}/traces/{tid}/tags", json={"key": "k"})
    assert (missing.status_code, missing.json()["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")

    run = api.post(f"{V2}/runs/create", json={"experiment_id": exp}).json()["run"]["info"]
    linked = api.post(
        f"{V2}/traces/link-to-run", json={"trace_ids": [tid], "run_id": run["run_id"]}
    )
    assert linked.status_code == 200, linked.text
    assert _ids(_search(api, exp, filter=f"run_id = '{run['run_id']}'")) == [tid]

    old = mlflow_id(new_trace_id())
    api.post(f"{V3}/traces", json=_trace_info(old, exp, request_time="2020-01-01T00:00:00Z"))
    for body in (
        {"experiment_id": exp},
        {"experiment_id": exp, "request_ids": [tid], "max_timestamp_millis": 1},
        {"experiment_id": exp, "request_ids": [tid], "max_traces": 1},
        {"experiment_id": exp, "max_timestamp_millis": 1, "max_traces": 0},
    ):
        refused = api.post(f"{V2}/traces/delete-traces", json=body)
        assert refused.json()["error_code"] == "INVALID_PARAMETER_VALUE", body
    by_time = api.post(
        f"{V2}/traces/delete-traces",
        json={"experiment_id": exp, "max_timestamp_millis": 1_600_000_000_000, "max_traces": 5},
    )
    assert by_time.json() == {"traces_deleted": 1}
    by_id = api.post(
        f"{V2}/traces/delete-traces", json={"experiment_id": exp, "request_ids": [tid]}
    )
    assert by_id.json() == {"traces_deleted": 1}
    assert _search(api, exp) == {"traces": []}
    assert api.get(f"{V3}/traces/{tid}").status_code == 404


# ---------------------------------------------------------------------- teams
def test_another_team_cannot_see_or_touch_traces(api: TestClient) -> None:
    api.post("/api/v1/teams", json={"name": "vision"})
    mia, vic, out = (
        _account(api, "mia", "member"),
        _account(api, "vic", "viewer"),
        _account(api, "out", None),
    )
    exp = _experiment(api, mia, team="vision")
    trace = new_trace_id()
    tid = mlflow_id(trace)
    assert _export(api, exp, protobuf_of(SpanSpec("root", trace)), mia).status_code == 200
    assert api.post(f"{V3}/traces", json=_trace_info(tid, exp), headers=mia).status_code == 200

    # The viewer reads, and may not write.
    assert api.get(f"{V3}/traces/{tid}", headers=vic).status_code == 200
    tag = api.patch(f"{V2}/traces/{tid}/tags", json={"key": "k", "value": "v"}, headers=vic)
    assert tag.status_code == 403
    spans = _export(api, exp, protobuf_of(SpanSpec("x", new_trace_id())), vic)
    assert spans.status_code == 403
    # Deleting needs a maintainer.
    member_delete = api.post(
        f"{V2}/traces/delete-traces", json={"experiment_id": exp, "request_ids": [tid]}, headers=mia
    )
    assert member_delete.status_code == 403

    # The outsider: every answer reads as for a trace or experiment that does not exist.
    for answer in (
        api.get(f"{V3}/traces/{tid}", headers=out),
        api.get(f"{V3}/traces/get", params={"trace_id": tid}, headers=out),
        api.patch(f"{V2}/traces/{tid}/tags", json={"key": "k", "value": "v"}, headers=out),
        api.request("DELETE", f"{V2}/traces/{tid}/tags", json={"key": "k"}, headers=out),
        _export(api, exp, protobuf_of(SpanSpec("x", new_trace_id())), out),
        api.post(f"{V3}/traces", json=_trace_info(mlflow_id(new_trace_id()), exp), headers=out),
    ):
        assert answer.status_code == 404, answer.text
    unknown = api.get(f"{V3}/traces/tr-{'0' * 31}1", headers=out)
    hidden = api.get(f"{V3}/traces/{tid}", headers=out)
    assert unknown.json()["message"].replace(f"tr-{'0' * 31}1", tid) == hidden.json()["message"]
    search = api.post(
        f"{V3}/traces/search",
        json={"locations": [{"mlflow_experiment": {"experiment_id": exp}}]},
        headers=out,
    )
    assert search.json() == {"traces": []}
    batch = api.get(f"{V3}/traces/batchGet", params={"trace_ids": [tid]}, headers=out)
    assert batch.json() == {"traces": []}
    # A trace of the team cannot be taken over by spans sent to the outsider's experiment:
    # they would join the trace where it is, which the outsider may not write (or see).
    own = _experiment(api, out)
    hijack = _export(api, own, protobuf_of(SpanSpec("evil", trace)), out)
    assert hijack.status_code == 404, hijack.text
    spans_now = api.get(f"{V3}/traces/get", params={"trace_id": tid}, headers=vic).json()
    assert [s["name"] for s in spans_now["trace"]["spans"]] == ["root"]


def test_spans_of_a_known_trace_join_it_in_its_own_experiment(api: TestClient) -> None:
    """As on a stock server: the header names where a new trace goes; spans of a trace that
    exists are added to it where it is (the sender may write there)."""
    home, elsewhere = _experiment(api), _experiment(api)
    trace = new_trace_id()
    tid = mlflow_id(trace)
    assert _export(api, home, protobuf_of(SpanSpec("root", trace))).status_code == 200
    late = _export(api, elsewhere, protobuf_of(SpanSpec("late", trace)))
    assert late.status_code == 200, late.text
    info = api.get(f"{V3}/traces/{tid}").json()["trace"]["trace_info"]
    assert info["trace_location"]["mlflow_experiment"]["experiment_id"] == home
    got = api.get(f"{V3}/traces/get", params={"trace_id": tid, "allow_partial": "true"}).json()
    assert sorted(span["name"] for span in got["trace"]["spans"]) == ["late", "root"]
    assert _ids(_search(api, elsewhere)) == []


# ---------------------------------------------------------------------- hostile input
def test_hostile_input_is_refused_and_changes_nothing(api: TestClient) -> None:
    exp = _experiment(api)
    trace = new_trace_id()
    big = "x" * (MAX_SPAN_BYTES + 1)
    many = [SpanSpec(f"s{i}", trace) for i in range(MAX_SPANS_PER_REQUEST + 1)]
    cases: list[tuple[bytes, dict[str, str], str, int]] = [
        (b"\x0a\xff\xff\xff\xff\x0f", {}, "application/x-protobuf", 400),
        (b"not json", {}, "application/json", 400),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
            {},
            "application/json",
            400,
        ),  # fmt: skip
        (protobuf_of(SpanSpec("a", b"\x01\x02\x03")), {}, "application/x-protobuf", 400),
        (protobuf_of(SpanSpec("a", bytes(16))), {}, "application/x-protobuf", 400),
        (protobuf_of(SpanSpec("a\x00b", trace)), {}, "application/x-protobuf", 400),
        (
            protobuf_of(SpanSpec("a", trace, attributes={"k": big})),
            {},
            "application/x-protobuf",
            400,
        ),  # fmt: skip
        (protobuf_of(*many), {}, "application/x-protobuf", 400),
        (protobuf_of(SpanSpec("a", trace)), {}, "text/plain", 400),
        (
            protobuf_of(SpanSpec("a", trace)),
            {"Content-Encoding": "br"},
            "application/x-protobuf",
            400,
        ),  # fmt: skip
        (
            gzip.compress(b"\0" * (65 * 1024 * 1024)),
            {"Content-Encoding": "gzip"},
            "application/x-protobuf",
            413,
        ),  # fmt: skip
    ]
    for body, headers, content_type, status in cases:
        answer = _export(api, exp, body, headers, content_type)
        assert answer.status_code == status, (answer.text, content_type, headers)
        assert "Traceback" not in answer.text
    no_header = api.post("/v1/traces", content=protobuf_of(SpanSpec("a", trace)), headers=PROTOBUF)
    assert no_header.status_code == 400
    for experiment_id in ("abc", "987654321", "-1"):
        assert _export(api, experiment_id, protobuf_of(SpanSpec("a", trace))).status_code in (
            400,
            404,
        )
    for bad in (
        {},
        {"trace": {"trace_info": {"trace_id": "tr-1"}}},
        _trace_info("../../etc", exp),
        _trace_info("x" * 65, exp),
        _trace_info(mlflow_id(trace), exp, request_time="yesterday"),
        _trace_info(mlflow_id(trace), exp, state="DONE"),
        _trace_info(mlflow_id(trace), exp, tags={"\x1b[31m": "v"}),
        _trace_info(mlflow_id(trace), "987654321"),
    ):
        refused = api.post(f"{V3}/traces", json=bad)
        assert refused.status_code in (400, 404), (refused.text, bad)
    unauthenticated = api.post(
        "/v1/traces",
        content=protobuf_of(SpanSpec("a", trace)),
        headers={**PROTOBUF, HEADER: exp, "Authorization": "Bearer nope"},
    )
    assert unauthenticated.status_code == 401
    # Nothing was stored.
    assert _search(api, exp) == {"traces": []}
    assert api.get(f"{V3}/traces/{mlflow_id(trace)}").status_code == 404


def test_unimplemented_genai_endpoints_answer_endpoint_not_found(api: TestClient) -> None:
    """Assessments, evaluation datasets and scorers are not served: MLflow's error JSON."""
    tid = mlflow_id(new_trace_id())
    for method, path in (
        ("POST", f"{V3}/traces/{tid}/assessments"),
        ("GET", f"{V3}/traces/{tid}/assessments/a-1"),
        ("POST", f"{V3}/datasets/create"),
        ("GET", f"{V3}/datasets/search"),
        ("POST", f"{V3}/scorers/register"),
        ("GET", f"{V3}/scorers/list"),
        ("POST", f"{V3}/traces/metrics"),
    ):
        answer = api.request(method, path, json={})
        # `traces/metrics` shares its path with GetTraceInfoV3 (`traces/{trace_id}`): 405.
        assert answer.status_code in ((404, 405) if path.endswith("metrics") else (404,))
        body = answer.json()
        assert body["error_code"] == "ENDPOINT_NOT_FOUND", (method, path)
        assert isinstance(body["message"], str)


# ---------------------------------------------------------------------- MLflow 2's API, insights
def test_mlflow_2_start_and_end_trace(api: TestClient) -> None:
    exp = _experiment(api)
    started = api.post(
        f"{V2}/traces",
        json={
            "experiment_id": exp,
            "timestamp_ms": 1000,
            "request_metadata": [{"key": "meta1", "value": "apple"}],
            "tags": [{"key": "tag1", "value": "football"}, {"key": "tag2", "value": "golf"}],
        },
    )
    assert started.status_code == 200, started.text
    info = started.json()["trace_info"]
    tid = info["request_id"]
    assert (info["timestamp_ms"], info["status"], info.get("execution_time_ms")) == (
        1000,
        "IN_PROGRESS",
        None,
    )
    ended = api.patch(
        f"{V2}/traces/{tid}",
        json={
            "timestamp_ms": 3000,
            "status": "OK",
            "request_metadata": [{"key": "meta2", "value": "grape"}],
            "tags": [{"key": "tag1", "value": "soccer"}],
        },
    )
    assert ended.status_code == 200, ended.text
    done = api.get(f"{V2}/traces/{tid}/info").json()["trace_info"]
    assert (done["execution_time_ms"], done["status"]) == (2000, "OK")
    assert {m["key"]: m["value"] for m in done["request_metadata"]} == {
        "meta1": "apple",
        "meta2": "grape",
    }
    tags = {t["key"]: t["value"] for t in done["tags"] if not t["key"].startswith("mlflow.")}
    assert tags == {"tag1": "soccer", "tag2": "golf"}
    refused = api.patch(f"{V2}/traces/{tid}", json={"timestamp_ms": 4000, "status": "DONE"})
    assert refused.status_code == 400
    assert api.get(f"{V2}/traces/{tid}/info").json()["trace_info"]["execution_time_ms"] == 2000


def test_full_text_search_and_filter_correlation(api: TestClient) -> None:
    exp = _experiment(api)
    made = []
    for i, (env, kind) in enumerate(
        [("prod", "TOOL")] * 6 + [("dev", "TOOL")] + [("dev", "LLM")] * 3
    ):
        trace = new_trace_id()
        span = SpanSpec(f"step-{i}", trace, attributes={"note": f"value{i} I like it"})
        assert _export(api, exp, protobuf_of(span)).status_code == 200
        tid = mlflow_id(trace)
        for key, value in (("env", env), ("kind", kind)):
            api.patch(f"{V2}/traces/{tid}/tags", json={"key": key, "value": value})
        made.append(tid)
    assert _ids(_search(api, exp, filter="trace.text LIKE '%value3 %'")) == [made[3]]
    assert len(_ids(_search(api, exp, filter="trace.text ILIKE '%i LIKE it%'"))) == 10
    assert _search(api, exp, filter="trace.text LIKE '%nothing here%'") == {"traces": []}

    def correlate(first: str, second: str) -> dict[str, Any]:
        answer = api.post(
            f"{V3}/traces/calculate-filter-correlation",
            json={"experiment_ids": [exp], "filter_string1": first, "filter_string2": second},
        )
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    prod = correlate("tags.env = 'prod'", "tags.kind = 'TOOL'")
    assert (prod["total_count"], prod["filter1_count"], prod["filter2_count"]) == (10, 6, 7)
    assert prod["joint_count"] == 6
    assert 0.69 < prod["npmi"] < 0.70  # ln(10/7) / ln(10/6)
    assert -1 < prod["npmi_smoothed"] < prod["npmi"]
    never = correlate("tags.env = 'prod'", "tags.kind = 'LLM'")
    assert (never["joint_count"], never["npmi"]) == (0, -1.0)
    none = correlate("tags.env = 'staging'", "tags.kind = 'TOOL'")
    assert none["npmi"] == "NaN"
    bad = api.post(
        f"{V3}/traces/calculate-filter-correlation",
        json={"experiment_ids": [exp], "filter_string1": "nope.x = 1", "filter_string2": "x"},
    )
    assert bad.json()["error_code"] == "INVALID_PARAMETER_VALUE"


def test_parser_bombs_and_filter_injections_are_refused(api: TestClient) -> None:
    exp = _experiment(api)
    trace = new_trace_id()
    deep_json = b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    # An attribute value nested 200 kvlists deep: past protobuf's recursion limit.
    request = request_of(SpanSpec("a", trace))
    value = request.resource_spans[0].scope_spans[0].spans[0].attributes.add().value
    for _ in range(200):
        value = value.kvlist_value.values.add().value
    value.string_value = "bottom"
    for body, content_type in (
        (deep_json, "application/json"),
        (request.SerializeToString(), "application/x-protobuf"),
    ):
        answer = _export(api, exp, body, content_type=content_type)
        assert answer.status_code == 400, answer.text
    tid = mlflow_id(trace)
    assert api.post(f"{V3}/traces", json=_trace_info(tid, exp, tags={"k": "v"})).status_code == 200
    for hostile in (
        "name = 'x' OR 1=1",
        "tags.k = 'v'; DROP TABLE traces; --",
        "tags.k = 'v' UNION SELECT key FROM trace_tags",
        "request_id IN (" + ",".join(f"'{i}'" for i in range(10_001)) + ")",
        "(" * 5000 + "name = 'x'" + ")" * 5000,
        " AND ".join(["name = 'x'"] * 2000),
        "tags.`\x00` = 'v'",
        "= = =",
    ):
        refused = api.post(
            f"{V3}/traces/search",
            json={"locations": [{"mlflow_experiment": {"experiment_id": exp}}], "filter": hostile},
        )
        assert refused.json()["error_code"] == "INVALID_PARAMETER_VALUE", hostile[:40]
    for order in ("timestamp_ms; DROP TABLE traces", "CASE WHEN 1=1 THEN name END", "1"):
        refused = api.post(
            f"{V3}/traces/search",
            json={
                "locations": [{"mlflow_experiment": {"experiment_id": exp}}],
                "order_by": [order],
            },
        )
        assert refused.json()["error_code"] == "INVALID_PARAMETER_VALUE", order
    # Legal quoting still works, and the table is still there.
    assert _ids(_search(api, exp, filter="tags.`k` = 'v' AND tags.\"k\" LIKE 'v%'")) == [tid]
