"""A run's artifacts in the UI, in process: files logged through the MLflow artifact proxy
(the stock client's PUT), the folder listing with breadcrumbs, each kind of preview (text,
image, CSV/TSV, JSON lines, Parquet, anything else), the raw image route's headers, the
download's attachment, hostile names inert, ``..`` refused and team scopes."""

from __future__ import annotations

import io
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from shamal.config import Settings
from shamal.server import create_app, start_platform
from shamal.webui._artifact_preview import TABLE_BYTES, TEXT_BYTES, human_size, preview_of
from tests.webui.conftest import sign_in

MLFLOW = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
HOSTILE = '<img src=x onerror="window.__xss=1">'
ESCAPED = "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;"
RAW_POLICY = "default-src 'none'; sandbox"


def _png() -> bytes:
    """A 1x1 PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _parquet() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"epoch": list(range(120)), "split": ["train"] * 120})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


PNG = _png()
FILES: dict[str, bytes] = {
    "notes.txt": b"hello\nworld\n",
    "long.log": b"0123456789abcde\n" * 8192,  # 128 KiB
    "data/table.csv": b"step,loss\n" + b"".join(b"%d,%d\n" % (i, i * 2) for i in range(150)),
    "data/table.tsv": b"a\tb\n1\t2\n",
    "data/broken.jsonl": b"{not json\n",
    "data/rows.jsonl": b'{"x": 1, "y": "one"}\n{"x": 2, "z": [1, 2]}\n7\n',
    "data/frame.parquet": _parquet(),
    "plots/loss.png": PNG,
    "page.html": b"<script>window.__xss=1</script><b>bold</b>",
    "logo.svg": b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__xss=1"/>',
    "weights.bin": b"\x00\x01\x02" * 100,
    f"{HOSTILE}.txt": HOSTILE.encode(),
}


def _ok(answer: Any) -> dict[str, Any]:
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _run(api: TestClient, name: str, tags: list[dict[str, str]] | None = None) -> tuple[str, str]:
    """(experiment id, run id) of a new run whose artifacts are :data:`FILES`, uploaded as
    the MLflow client uploads them."""
    body = {"name": name, "tags": tags or []}
    experiment = str(_ok(api.post(f"{MLFLOW}/experiments/create", json=body))["experiment_id"])
    run = _ok(api.post(f"{MLFLOW}/runs/create", json={"experiment_id": experiment}))["run"]
    root = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:/")
    for path, data in FILES.items():
        where = "/".join(quote(part, safe="") for part in path.split("/"))
        put = api.put(f"{ARTIFACTS}/{root}/{where}", content=data)
        assert put.is_success, (path, put.text)
    return experiment, str(run["info"]["run_id"])


def _token(api: TestClient, user: str, team: str) -> str:
    api.post("/api/v1/users", json={"name": user}).raise_for_status()
    api.put(f"/api/v1/teams/{team}/members/{user}", json={"role": "viewer"}).raise_for_status()
    answer = api.post("/api/v1/tokens", json={"name": "ui", "user": user})
    return str(answer.raise_for_status().json()["secret"])


def _names(html: str, kind: str) -> list[str]:
    return re.findall(rf'class="artifact-{kind}" href="[^"]*">([^<]*)</a>', html)


def test_the_listing_shows_folders_files_sizes_and_breadcrumbs(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    experiment, run = _run(api, "arts")
    sign_in(browser, admin_token)
    base = f"/ui/experiments/{experiment}/runs/{run}"
    run_page = browser.get(base)
    assert f'<a class="artifacts-link" href="{base}/artifacts">Artifacts</a>' in run_page.text

    root = browser.get(f"{base}/artifacts")
    assert root.status_code == 200
    assert _names(root.text, "dir") == ["data/", "plots/"]
    files = _names(root.text, "file")
    assert files == sorted(
        ["notes.txt", "long.log", "page.html", "logo.svg", "weights.bin", ESCAPED + ".txt"]
    )
    assert "128.0 KiB" in root.text
    assert "12 B" in root.text
    assert f'href="{base}/artifacts?path=data"' in root.text
    assert f'href="{base}/artifacts/preview?path=notes.txt"' in root.text
    assert f'href="/ui/runs/{run}/artifact-download?path=notes.txt"' in root.text

    data = browser.get(f"{base}/artifacts", params={"path": "data"})
    assert _names(data.text, "file") == [
        "broken.jsonl",
        "frame.parquet",
        "rows.jsonl",
        "table.csv",
        "table.tsv",
    ]
    assert f'<a href="{base}/artifacts?path=data">data</a>' in data.text  # the breadcrumb
    assert f'<a href="/ui/experiments/{experiment}">arts</a>' in data.text
    assert f'href="{base}/artifacts/preview?path=data%2Ftable.csv"' in data.text
    empty = browser.get(f"{base}/artifacts", params={"path": "nothing"})
    assert "This folder is empty." in empty.text
    elsewhere = browser.get(f"/ui/experiments/0/runs/{run}/artifacts", params={"path": "data"})
    assert elsewhere.status_code == 303
    assert elsewhere.headers["location"] == f"{base}/artifacts?path=data"


def test_each_kind_of_preview(api: TestClient, browser: TestClient, admin_token: str) -> None:
    experiment, run = _run(api, "previews")
    sign_in(browser, admin_token)
    preview = f"/ui/experiments/{experiment}/runs/{run}/artifacts/preview"

    def show(path: str) -> str:
        answer = browser.get(preview, params={"path": path})
        assert answer.status_code == 200, (path, answer.text)
        return answer.text

    assert '<pre class="text artifact-text">hello\nworld\n</pre>' in show("notes.txt")
    long = show("long.log")
    assert "The first 64.0 KiB are shown." in long
    assert long.count("0123456789abcde") == 64 * 1024 // 16
    html = show("page.html")
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;" in html
    assert "<script>window" not in html
    svg = show("logo.svg")
    assert "&lt;svg xmlns=" in svg
    assert "<svg xmlns" not in svg
    assert "artifact-raw" not in html + svg

    image = show("plots/loss.png")
    assert f'<img src="/ui/runs/{run}/artifact-raw?path=plots%2Floss.png" alt="loss.png">' in image

    csv_page = show("data/table.csv")
    assert '<th scope="col">step</th><th scope="col">loss</th>' in csv_page
    assert "First 100 rows" in csv_page
    assert '<td class="value">99</td><td class="value">198</td>' in csv_page
    assert '<td class="value">100</td><td class="value">200</td>' not in csv_page
    assert '<th scope="col">a</th><th scope="col">b</th>' in show("data/table.tsv")
    jsonl = show("data/rows.jsonl")
    for column in ("x", "y", "z", "value"):
        assert f'<th scope="col">{column}</th>' in jsonl
    assert '<td class="value">[1, 2]</td>' in jsonl
    assert '<pre class="text artifact-text">{not json\n</pre>' in show("data/broken.jsonl")
    parquet = show("data/frame.parquet")
    assert '<th scope="col">epoch</th><th scope="col">split</th>' in parquet
    assert "First 100 rows" in parquet

    binary = show("weights.bin")
    assert "download it to look inside" in binary
    assert f'href="/ui/runs/{run}/artifact-download?path=weights.bin"' in binary


def test_the_raw_route_serves_only_images_inertly_and_downloads_are_attachments(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    _experiment, run = _run(api, "raw")
    sign_in(browser, admin_token)
    raw = browser.get(f"/ui/runs/{run}/artifact-raw", params={"path": "plots/loss.png"})
    assert raw.status_code == 200
    assert raw.content == PNG
    assert raw.headers["content-type"] == "image/png"
    assert raw.headers["x-content-type-options"] == "nosniff"
    assert raw.headers["content-security-policy"] == RAW_POLICY
    for active in ("logo.svg", "page.html", "notes.txt"):
        refused = browser.get(f"/ui/runs/{run}/artifact-raw", params={"path": active})
        assert refused.status_code == 400, active
        assert "<svg" not in refused.text
        assert "<script>" not in refused.text

    download = browser.get(f"/ui/runs/{run}/artifact-download", params={"path": "page.html"})
    assert download.status_code == 200
    assert download.content == FILES["page.html"]
    assert download.headers["content-type"] == "application/octet-stream"
    assert download.headers["content-disposition"].startswith('attachment; filename="page.html"')
    assert download.headers["content-security-policy"] == RAW_POLICY
    assert download.headers["x-content-type-options"] == "nosniff"
    missing = browser.get(f"/ui/runs/{run}/artifact-download", params={"path": "nope.txt"})
    assert missing.status_code == 404
    # Each download gives its slot back once sent: more than the limit, one after another.
    limit = int(api.app.state.settings.max_downloads_per_principal)  # type: ignore[attr-defined]
    for _ in range(limit + 2):
        again = browser.get(f"/ui/runs/{run}/artifact-download", params={"path": "notes.txt"})
        assert again.status_code == 200


def test_hostile_names_render_inert_and_dot_dot_is_refused(
    api: TestClient, browser: TestClient, admin_token: str
) -> None:
    experiment, run = _run(api, HOSTILE)
    sign_in(browser, admin_token)
    base = f"/ui/experiments/{experiment}/runs/{run}/artifacts"
    pages = [
        browser.get(base),
        browser.get(f"{base}/preview", params={"path": f"{HOSTILE}.txt"}),
    ]
    for answer in pages:
        assert answer.status_code == 200
        assert "<img" not in answer.text
        assert 'onerror="window' not in answer.text
        assert ESCAPED in answer.text
    assert f'?path={quote(HOSTILE, safe="").replace("%20", "+")}.txt"' in pages[0].text

    for bad in ("../../etc/passwd", "data/../../x", "/etc/passwd", "%2e%2e/x"):
        for url in (
            base,
            f"{base}/preview",
            f"/ui/runs/{run}/artifact-raw",
            f"/ui/runs/{run}/artifact-download",
        ):
            suffix = ".png" if "raw" in url else ""
            answer = browser.get(url, params={"path": bad + suffix})
            assert answer.status_code == 400, (url, bad, answer.text)
    too_long = browser.get(f"{base}/preview", params={"path": "a" * 2000})
    assert too_long.status_code == 400
    assert browser.get(f"/ui/experiments/{experiment}/runs/nothex/artifacts").status_code == 400


def test_another_team_cannot_reach_a_run_s_artifacts(api: TestClient, browser: TestClient) -> None:
    for team in ("red", "blue"):
        api.post("/api/v1/teams", json={"name": team}).raise_for_status()
    experiment, run = _run(api, "red-run", [{"key": "shamal.team", "value": "red"}])
    sign_in(browser, _token(api, "bea", "blue"))
    base = f"/ui/experiments/{experiment}/runs/{run}/artifacts"
    for url, path in (
        (base, ""),
        (f"{base}/preview", "notes.txt"),
        (f"/ui/runs/{run}/artifact-raw", "plots/loss.png"),
        (f"/ui/runs/{run}/artifact-download", "notes.txt"),
    ):
        answer = browser.get(url, params={"path": path} if path else {})
        assert answer.status_code == 404, url
        assert "hello" not in answer.text
    sign_in(browser, _token(api, "ria", "red"))
    assert browser.get(base).status_code == 200
    shown = browser.get(f"{base}/preview", params={"path": "notes.txt"})
    assert "hello" in shown.text


def test_reads_are_audited_where_the_operator_turned_it_on(settings: Settings) -> None:
    platform = start_platform(settings.model_copy(update={"audit_reads": True}))
    try:
        app = create_app(platform.settings, platform)
        with (
            TestClient(app, raise_server_exceptions=False) as api,
            TestClient(app, raise_server_exceptions=False, follow_redirects=False) as browser,
        ):
            api.headers["Authorization"] = f"Bearer {platform.admin_secret}"
            experiment, run = _run(api, "audited")
            root = _ok(api.get(f"{MLFLOW}/runs/get", params={"run_id": run}))["run"]["info"][
                "artifact_uri"
            ].removeprefix("mlflow-artifacts:/")
            assert platform.admin_secret is not None
            sign_in(browser, platform.admin_secret)
            preview = f"/ui/experiments/{experiment}/runs/{run}/artifacts/preview"
            assert browser.get(preview, params={"path": "notes.txt"}).status_code == 200
            raw = browser.get(f"/ui/runs/{run}/artifact-raw", params={"path": "plots/loss.png"})
            assert raw.status_code == 200
            got = browser.get(f"/ui/runs/{run}/artifact-download", params={"path": "weights.bin"})
            assert got.status_code == 200
            assert browser.get(preview, params={"path": "nope.txt"}).status_code == 404
        entries = reversed(platform.audit.entries(limit=10, action="artifact.read"))
        reads = [(e.actor, e.target, e.outcome) for e in entries]
        assert reads == [
            ("admin", f"mlflow-artifacts:{root}/notes.txt", "ok"),
            ("admin", f"mlflow-artifacts:{root}/plots/loss.png", "ok"),
            ("admin", f"mlflow-artifacts:{root}/weights.bin", "ok"),
            ("admin", preview, "resource_does_not_exist"),
        ]
    finally:
        platform.close()


def test_a_preview_reads_only_a_bounded_head_and_closes_the_stream() -> None:
    consumed: list[int] = []
    closed: list[bool] = []

    def chunks() -> Iterator[bytes]:
        try:
            for i in range(1000):
                consumed.append(i)
                yield b"x" * 1024
        finally:
            closed.append(True)

    shown = preview_of("big.txt", 1000 * 1024, chunks())
    assert (shown.kind, shown.truncated, len(shown.text)) == ("text", True, TEXT_BYTES)
    assert len(consumed) == TEXT_BYTES // 1024 + 1
    assert closed == [True]
    for name in ("a.gif", "b.WEBP", "c.jpeg", "d.jpg"):
        assert preview_of(name, 10, iter([b"GIF89a"])).kind == "image"
    assert preview_of("huge.png", 10**9, iter([b"\x89PNG\x00"])).kind == "binary"
    assert preview_of("x.svg", 5, iter([b"<svg>"])).kind == "text"
    # A head that stops inside a line drops that line.
    cut = preview_of("t.csv", 10**7, iter([b"a,b\n" + b"1,2\n" * 50 + b"3,", b"9" * TABLE_BYTES]))
    assert (cut.columns, cut.rows) == (["a", "b"], [["1", "2"]] * 50)
    assert preview_of("no.parquet", 4, iter([b"PAR1"])).kind == "text"
    assert [human_size(n) for n in (None, 0, 1023, 1536, 5 * 1024**3)] == [
        "",
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5.0 GiB",
    ]
