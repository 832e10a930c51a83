"""Bounded answers (issue 18, point 5): search pages are capped in bytes as well as in
items, params and tags per object are counted, and concurrent searches over large
experiments keep the server's memory bounded. The stock mlflow client is the judge."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mlflow import MlflowClient
from mlflow.entities import Param, RunTag
from mlflow.exceptions import MlflowException

from tests.live import LiveServer

pytestmark = pytest.mark.slow

KIB = 1024
PAGE_BYTES = 64 * KIB
TAG = "t" * 8000  # MLflow's longest tag value


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"SHAMAL_MAX_PAGE_BYTES": str(PAGE_BYTES), "SHAMAL_ACCESS_LOG": "false"}
    with LiveServer(tmp_path_factory.mktemp("bounded"), env) as live:
        yield live


@pytest.fixture
def client(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    return MlflowClient(tracking_uri=server.url, registry_uri=server.url)


def _fat_runs(client: MlflowClient, experiment_id: str, runs: int, tags: int) -> list[str]:
    ids = []
    for i in range(runs):
        run = client.create_run(experiment_id, run_name=f"r{i:04d}")
        client.log_batch(run.info.run_id, tags=[RunTag(f"k{j}", TAG) for j in range(tags)])
        ids.append(run.info.run_id)
    return ids


def test_run_pages_stop_at_their_byte_bound_and_resume_exactly(
    client: MlflowClient, server: LiveServer
) -> None:
    experiment = client.create_experiment("fat-runs")
    ids = _fat_runs(client, experiment, 30, 2)  # about 16 KiB each: 4 a page
    seen: list[str] = []
    token = None
    pages = 0
    with httpx.Client(base_url=server.url, timeout=60) as http:
        while True:
            body = {
                "experiment_ids": [experiment],
                "max_results": 1000,
                "order_by": ["attributes.run_name ASC"],
                "page_token": token,
            }
            r = http.post(
                "/api/2.0/mlflow/runs/search",
                json=body,
                headers={"Authorization": f"Bearer {server.token}"},
            )
            assert r.status_code == 200
            assert len(r.content) <= PAGE_BYTES + 20 * KIB  # the bound, plus one run at most
            page = r.json()
            seen += [run["info"]["run_id"] for run in page["runs"]]
            pages += 1
            token = page.get("next_page_token")
            if not token:
                break
    assert seen == ids  # every run once, in order
    assert pages >= 7
    # The stock client pages through the same way.
    got, token = [], None
    while True:
        paged = client.search_runs(
            [experiment], max_results=1000, order_by=["attributes.run_name ASC"], page_token=token
        )
        got += [run.info.run_id for run in paged]
        token = paged.token
        if not token:
            break
    assert got == ids


def test_experiment_and_model_searches_are_bounded_too(client: MlflowClient) -> None:
    names = [f"fat-exp-{i:02d}" for i in range(12)]
    for name in names:
        client.create_experiment(name, tags={f"k{j}": TAG for j in range(2)})
    first = client.search_experiments(max_results=1000, filter_string="name LIKE 'fat-exp-%'")
    assert first.token
    assert len(first) < 12
    models = [f"fat-model-{i:02d}" for i in range(12)]
    run = client.create_run(client.create_experiment("fat-models"))
    source = f"{run.info.artifact_uri}/model"
    for name in models:
        client.create_registered_model(name, tags={f"k{j}": TAG for j in range(2)})
        client.create_model_version(name, source, run.info.run_id, tags={"k": TAG * 2})
    found, token = [], None
    while True:
        page = client.search_registered_models(
            filter_string="name LIKE 'fat-model-%'", max_results=1000, page_token=token
        )
        assert len(page) < 12
        found += [m.name for m in page]
        token = page.token
        if not token:
            break
    assert sorted(found) == models
    versions = client.search_model_versions("name LIKE 'fat-model-%'", max_results=1000)
    assert versions.token
    assert len(versions) < 12


def test_params_and_tags_per_run_are_counted(client: MlflowClient) -> None:
    run = client.create_run(client.create_experiment("counted")).info.run_id
    for batch in range(20):
        client.log_batch(run, params=[Param(f"p{batch}-{i}", "v") for i in range(100)])
    with pytest.raises(MlflowException) as refused:
        client.log_batch(run, params=[Param("one-too-many", "v")])
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
    assert "at most 2000 params" in refused.value.message
    assert len(client.get_run(run).data.params) == 2000  # the refused batch left nothing
    room = 1000 - len(client.get_run(run).data.tags)  # the client set a few at creation
    for start in range(0, room, 100):
        batch = range(start, min(start + 100, room))
        client.log_batch(run, tags=[RunTag(f"t{i}", "v") for i in batch])
    with pytest.raises(MlflowException, match="at most 1000 tags"):
        client.set_tag(run, "one-too-many", "v")
    client.set_tag(run, "t0", "overwriting an existing tag is fine")


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


#: What four concurrent searches over the large experiments may add to the server's peak
#: memory: four batches of ``PAGE_FIRST_BATCH`` runs and four 4 MiB pages, with room.
MEMORY_BOUND_MIB = 160


def test_four_concurrent_searches_over_large_experiments_keep_memory_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LiveServer(tmp_path / "home", {"SHAMAL_ACCESS_LOG": "false"}) as live:
        assert live.process is not None
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", live.token)
        client = MlflowClient(tracking_uri=live.url)
        experiments = [client.create_experiment(f"large-{i}") for i in range(2)]
        # 2 x 120 runs of 25 tags of 8,000 characters: 48 MB of tag values, 200 KB a run.
        for experiment in experiments:
            _fat_runs(client, experiment, 120, 25)
        before = _rss_kib(live.process.pid, "VmRSS")
        counts: list[int] = []
        failures: list[BaseException] = []

        def search_all() -> None:
            try:
                total, token = 0, None
                while True:
                    page = client.search_runs(experiments, max_results=50_000, page_token=token)
                    total += len(page)
                    token = page.token
                    if not token:
                        break
                counts.append(total)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=search_all) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures
        assert counts == [240] * 4
        growth_mib = (_rss_kib(live.process.pid, "VmHWM") - before) / 1024
    print(f"\nserver peak RSS growth over 4 concurrent searches: {growth_mib:.0f} MiB")
    assert growth_mib < MEMORY_BOUND_MIB
