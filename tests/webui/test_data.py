"""The datasets and feature store pages in process: a dataset's versions, a version's profile
and validation report, the diff of two versions, the list with its name filter and pages,
feature views and services applied through the API; team scopes, hostile text and bad
addresses."""

from __future__ import annotations

import io
import re
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
from fastapi.testclient import TestClient

from tests.registry.conftest import People, people
from tests.webui.conftest import sign_in

__all__ = ["people"]

HOSTILE = '<img src=x onerror="window.__xss=1">'
ESCAPED = "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;"
SUITE = """
expectations:
  - kind: not_null
    column: id
  - kind: range
    column: score
    min: 0
    max: 1
"""


def _csv(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return sink.getvalue()


def _dataset(api: TestClient, people: People, name: str, **fields: Any) -> None:
    body = {"name": name, "team": "red", **fields}
    api.post("/api/v1/datasets", json=body, headers=people.headers("mo")).raise_for_status()


def _upload(api: TestClient, people: People, name: str, table: pa.Table) -> dict[str, Any]:
    answer = api.post(
        f"/api/v1/dataset-uploads/{name}",
        params={"format": "csv"},
        content=_csv(table),
        headers=people.headers("mo"),
    )
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _scores(api: TestClient, people: People) -> None:
    """``scores``: v1 of three rows, unvalidated; v2 appends three more, one out of the
    suite's range, so it fails its validation and is quarantined."""
    _dataset(api, people, "scores", description="model scores")
    _upload(api, people, "scores", pa.table({"id": [1, 2, 3], "score": [0.1, 0.2, 0.3]}))
    suite = api.put(
        "/api/v1/datasets/scores/suite", json={"yaml": SUITE}, headers=people.headers("rita")
    )
    assert suite.status_code == 200, suite.text
    second = _upload(api, people, "scores", pa.table({"id": [4, 5, 6], "score": [0.4, 0.5, 5.0]}))
    assert second["status"] == "quarantined"


def test_a_dataset_its_versions_profile_validation_and_diff(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _scores(api, people)
    sign_in(browser, people.secrets["vi"])  # a viewer of red reads it all

    listing = browser.get("/ui/datasets")
    assert listing.status_code == 200
    assert 'href="/ui/datasets/scores"' in listing.text
    assert "<td>red</td>" in listing.text

    dataset = browser.get("/ui/datasets/scores")
    assert dataset.status_code == 200
    assert "model scores" in dataset.text
    assert re.findall(r'class="version-link" href="([^"]*)"', dataset.text) == [
        "/ui/datasets/scores/versions/2",
        "/ui/datasets/scores/versions/1",
    ]
    assert "quarantined" in dataset.text
    assert '<span class="badge bad">failed</span>' in dataset.text
    assert "not validated" in dataset.text

    first = browser.get("/ui/datasets/scores/versions/1")
    assert first.status_code == 200
    text = first.text
    assert "data:/scores/1" in text
    assert "Not validated" in text
    assert '<th scope="row">score</th>' in text
    assert "0.2" in text  # the mean of 0.1, 0.2, 0.3
    assert 'aria-label="score: value at each percentile"' in text  # its quantile picture
    assert 'href="/ui/lineage?uri=data%3A%2Fscores%2F1"' in text
    assert "diff-link" not in text  # no version before the first

    second = browser.get("/ui/datasets/scores/versions/2")
    assert second.status_code == 200
    assert '<span class="badge bad">failed</span>' in second.text
    assert second.text.count('<span class="badge ok">passed</span>') == 1  # not_null passed
    assert 'href="/ui/datasets/scores/diff?a=1&amp;b=2"' in second.text

    diff = browser.get("/ui/datasets/scores/diff", params={"a": "1", "b": "2"})
    assert diff.status_code == 200
    assert "3 → 6 (+3)" in diff.text
    assert '<th scope="row">score</th>' in diff.text
    assert "unchanged" in diff.text  # the schema
    same = browser.get("/ui/datasets/scores/diff", params={"a": "1", "b": "latest"})
    assert same.status_code == 200
    assert "the same" in same.text  # latest valid is still v1


def test_bad_addresses_answer_400_pages_and_missing_ones_404(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _scores(api, people)
    sign_in(browser, people.secrets["vi"])
    for path, params in [
        ("/ui/datasets/scores/versions/0", {}),
        ("/ui/datasets/scores/versions/x", {}),
        ("/ui/datasets/Not%20A%20Name", {}),
        ("/ui/datasets/scores/diff", {"a": "1"}),
        ("/ui/datasets/scores/diff", {"a": "../x", "b": "1"}),
        ("/ui/datasets/scores/diff", {"a": "1", "b": "0"}),
        ("/ui/datasets/scores", {"before": "-1"}),
        ("/ui/datasets", {"after": "<x>"}),
        ("/ui/datasets", {"q": "x" * 200}),
        ("/ui/features/views/Not-A-Name", {}),
    ]:
        answer = browser.get(path, params=params)
        assert answer.status_code == 400, (path, params, answer.status_code)
        assert "text/html" in answer.headers["content-type"]
        assert "Traceback" not in answer.text
    for path in [
        "/ui/datasets/nope",
        "/ui/datasets/scores/versions/99",
        "/ui/datasets/scores/diff?a=1&b=99",
        "/ui/features/views/nope",
        "/ui/features/services/nope",
    ]:
        assert browser.get(path).status_code == 404, path


def test_another_team_neither_sees_nor_reaches_a_dataset(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _scores(api, people)
    sign_in(browser, people.secrets["bo"])  # a member of blue
    assert "scores" not in browser.get("/ui/datasets").text
    assert "scores" not in browser.get("/ui/datasets", params={"q": "sco"}).text
    for path in [
        "/ui/datasets/scores",
        "/ui/datasets/scores/versions/1",
        "/ui/datasets/scores/diff?a=1&b=2",
    ]:
        answer = browser.get(path)
        assert answer.status_code == 404, path
        assert "model scores" not in answer.text


def test_the_list_filters_by_name_and_pages(
    api: TestClient, browser: TestClient, people: People
) -> None:
    for i in range(56):
        _dataset(api, people, f"bulk-{i:02d}")
    regions = {"regions": ["ae-dubai", "ae-abudhabi"]}
    put = api.put(
        "/api/v1/datasets/bulk-03/residency", json=regions, headers=people.headers("rita")
    )
    assert put.status_code == 200, put.text
    sign_in(browser, people.secrets["vi"])
    first = browser.get("/ui/datasets")
    names = re.findall(r'class="dataset-link" href="/ui/datasets/([^"]*)"', first.text)
    assert names == [f"bulk-{i:02d}" for i in range(50)]
    assert "<td>ae-abudhabi, ae-dubai</td>" in first.text  # bulk-03's residency
    following = re.search(r'rel="next" href="([^"]*)"', first.text)
    assert following is not None
    second = browser.get(following.group(1).replace("&amp;", "&"))
    names = re.findall(r'class="dataset-link" href="/ui/datasets/([^"]*)"', second.text)
    assert names == [f"bulk-{i:02d}" for i in range(50, 56)]
    assert 'rel="next"' not in second.text
    filtered = browser.get("/ui/datasets", params={"q": "BULK-1"})
    names = re.findall(r'class="dataset-link" href="/ui/datasets/([^"]*)"', filtered.text)
    assert names == [f"bulk-1{i}" for i in range(10)]
    assert "none yet" in filtered.text  # no version written


def test_hostile_text_renders_inert(api: TestClient, browser: TestClient, people: People) -> None:
    _dataset(api, people, "hostile", description=HOSTILE)
    table = pa.table({HOSTILE: [HOSTILE, "javascript:alert(1)", HOSTILE], "n": [1, 2, 3]})
    _upload(api, people, "hostile", table)
    _upload(api, people, "hostile", pa.table({HOSTILE: ["b"], "n": [4]}))
    sign_in(browser, people.secrets["vi"])
    pages = [
        browser.get("/ui/datasets/hostile"),
        browser.get("/ui/datasets/hostile/versions/1"),
        browser.get("/ui/datasets/hostile/diff", params={"a": "1", "b": "2"}),
        browser.get("/ui/datasets", params={"q": HOSTILE}),
    ]
    for answer in pages:
        assert answer.status_code == 200
        assert "<img" not in answer.text
        assert 'href="javascript' not in answer.text
        assert ESCAPED in answer.text


# ---------------------------------------------------------------------------- features
def _definitions(description: str = "what a customer spent") -> dict[str, Any]:
    return {
        "entities": [{"name": "customer", "join_keys": ["customer_id"], "description": ""}],
        "feature_views": [
            {
                "name": "customer_stats",
                "entities": ["customer"],
                "source": "data:spend/1",
                "timestamp_field": "ts",
                "features": [
                    {"name": "total", "dtype": "float64"},
                    {"name": "orders", "dtype": "int64"},
                ],
                "owner": "red",
                "ttl_seconds": 86400,
                "online": True,
                "sql": "SELECT customer_id, ts, total, orders FROM source WHERE total > 0",
                "description": description,
                "tags": {"area": "fraud"},
            }
        ],
        "feature_services": [
            {
                "name": "fraud_model",
                "features": ["customer_stats:*"],
                "owner": "red",
                "description": description,
            }
        ],
    }


def test_feature_views_and_services_applied_through_the_api(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _dataset(api, people, "spend")
    spend = {
        "customer_id": [1, 2],
        "ts": ["2026-01-01T00:00:00", "2026-01-02T00:00:00"],
        "total": [1.5, 2.5],
        "orders": [1, 2],
    }
    _upload(api, people, "spend", pa.table(spend))
    applied = api.post(
        "/api/v1/features/apply",
        json={"definitions": _definitions(HOSTILE)},
        headers=people.headers("mo"),
    )
    assert applied.status_code == 200, applied.text
    sign_in(browser, people.secrets["vi"])

    listing = browser.get("/ui/features")
    assert listing.status_code == 200
    assert 'href="/ui/features/views/customer_stats"' in listing.text
    assert 'href="/ui/features/services/fraud_model"' in listing.text
    assert 'href="/ui/datasets/spend/versions/1"' in listing.text  # the view's source
    assert "<td>1d</td>" in listing.text  # its TTL
    assert "<td>ts</td>" in listing.text

    view = browser.get("/ui/features/views/customer_stats")
    assert view.status_code == 200
    assert "<td>total</td><td><code>float64</code></td>" in view.text
    assert "<td>orders</td><td><code>int64</code></td>" in view.text
    assert "FROM source WHERE total &gt; 0" in view.text
    assert "Not materialized yet." in view.text
    assert "keys customer_id" in view.text

    done = api.post(
        "/api/v1/features/materializations",
        json={"views": ["customer_stats"], "end": "2026-02-01T00:00:00Z"},
        headers=people.headers("mo"),
    )
    assert done.status_code == 200, done.text
    materialized = browser.get("/ui/features/views/customer_stats").text
    assert '<span class="badge ok">succeeded</span>' in materialized
    assert "Not materialized yet." not in materialized

    service = browser.get("/ui/features/services/fraud_model")
    assert service.status_code == 200
    rows = re.findall(r"<td>(\w+)</td>\s*<td><code>(\w+)</code></td>", service.text)
    assert rows == [("total", "float64"), ("orders", "int64")]
    for answer in (listing, view, service):
        assert "<img" not in answer.text
        assert ESCAPED in answer.text


def test_a_version_shows_its_transformations_tags_and_no_personal_value(
    api: TestClient, browser: TestClient, people: People
) -> None:
    _dataset(api, people, "contacts")
    policy = {"version": 1, "columns": {"email": {"action": "hmac", "purpose": "crm"}}}
    put = api.put("/api/v1/datasets/contacts/privacy", json=policy, headers=people.headers("rita"))
    assert put.status_code == 200, put.text
    emails = ["amal.secret@example.ae", "badr@example.ae", "amal.secret@example.ae"]
    _upload(api, people, "contacts", pa.table({"id": [1, 2, 3], "email": emails}))
    tag = api.put(
        "/api/v1/datasets/contacts/versions/1/tags/reviewed",
        json={"value": "yes"},
        headers=people.headers("mo"),
    )
    assert tag.status_code == 204, tag.text
    sign_in(browser, people.secrets["vi"])
    page = browser.get("/ui/datasets/contacts/versions/1")
    assert page.status_code == 200
    assert "<td>email</td><td>hmac</td>" in page.text
    assert "purpose" in page.text
    assert '<th scope="row">email <span class="badge">personal</span></th>' in page.text
    assert "amal.secret" not in page.text
    assert "Tag reviewed" in page.text
    assert '<span class="tag">reviewed=yes</span>' in browser.get("/ui/datasets/contacts").text
