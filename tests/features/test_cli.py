"""`shamal features` and the feature API against a real server process: plan and apply a
repository of YAML and Python, list and history, a training set from a Parquet file of entity
rows, materialize, online reads, pushes, and hostile requests (clear 4xx, nothing changed)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shamal.client import ShamalClient
from tests.datasets._cli import cli_against
from tests.features._live import server_with_dataset
from tests.live import LiveServer

pytestmark = pytest.mark.slow

NOW = datetime.now(UTC).replace(microsecond=0)

YAML = """
entities:
  - name: customer
    join_keys: [customer_id]
feature_views:
  - name: customer_stats
    entities: [customer]
    source: payments
    timestamp_field: ts
    ttl_seconds: 864000
    owner: analytics
    features:
      - {name: amount, dtype: float64}
"""

PYTHON = """
from shamal.features import FeatureService

fraud = FeatureService(name="fraud", owner="analytics", features=("customer_stats:amount",))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    rows = pa.table(
        {
            "customer_id": pa.array([1, 1, 2], pa.int64()),
            "ts": pa.array(
                [
                    NOW - timedelta(days=3),
                    NOW - timedelta(days=1),
                    NOW - timedelta(days=2),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "amount": [10.0, 11.0, 20.0],
        }
    )
    home = tmp_path_factory.mktemp("features-home")
    with server_with_dataset(home, "analytics", "payments", rows) as (live, api):
        yield live


@pytest.fixture
def shamal(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str]]:
    return cli_against(server, monkeypatch, columns=140)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "features.yaml").write_text(YAML)
    (folder / "services.py").write_text(PYTHON)
    return folder


def test_plan_apply_train_materialize_and_read_online(
    shamal: Callable[..., tuple[int, str]], repo: Path, tmp_path: Path
) -> None:
    code, out = shamal("features", "plan", str(repo))
    assert code == 0, out
    assert "+ feature view customer_stats" in out
    assert "+ feature service fraud" in out
    code, out = shamal("features", "apply", str(repo))
    assert code == 0, out
    assert "Applied as registry number" in out
    code, out = shamal("features", "plan", str(repo))
    assert "No changes" in out
    code, out = shamal("features", "list", "--json")
    assert {(o["kind"], o["name"]) for o in json.loads(out)} >= {
        ("entity", "customer"),
        ("feature_view", "customer_stats"),
        ("feature_service", "fraud"),
    }

    entities = tmp_path / "entities.parquet"
    pq.write_table(
        pa.table(
            {
                "customer_id": pa.array([1, 1, 2], pa.int64()),
                "event_timestamp": pa.array(
                    [NOW - timedelta(days=2), NOW, NOW - timedelta(days=3)],
                    pa.timestamp("us", tz="UTC"),
                ),
            }
        ),
        entities,
    )
    out_file = tmp_path / "train.parquet"
    code, out = shamal(
        "features", "historical", str(entities), "--service", "fraud", "-o", str(out_file)
    )
    assert code == 0, out
    assert "3 rows" in out
    assert pq.read_table(out_file).column("amount").to_pylist() == [10.0, 11.0, None]

    code, out = shamal("features", "materialize", "--json")
    assert code == 0, out
    (run,) = json.loads(out)
    assert (run["state"], run["rows"]) == ("succeeded", 2)
    code, out = shamal(
        "features", "online", "-e", "customer_id=1,2,3", "--service", "fraud", "--json"
    )
    assert code == 0, out
    found = json.loads(out)
    assert found["features"]["amount"] == [11.0, 20.0, None]
    assert found["views"] == {"amount": "customer_stats"}
    assert found["status"]["customer_stats"] == ["present", "present", "not_found"]


def test_pushes_reach_the_online_store(
    server: LiveServer, shamal: Callable[..., tuple[int, str]], repo: Path
) -> None:
    assert shamal("features", "apply", str(repo))[0] == 0
    with ShamalClient(server.url, server.token) as api:
        written = api.push_features(
            "customer_stats",
            [{"customer_id": 9, "ts": NOW.isoformat(), "amount": 99.5}],
            offline=False,
        )
        assert written == 1
        found = api.online_features({"customer_id": [9]}, features=["customer_stats:amount"])
    assert found["features"]["amount"] == [99.5]


def _registry(server: LiveServer) -> dict[str, object]:
    with ShamalClient(server.url, server.token) as api:
        return api.feature_registry()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/api/v1/features/apply",
            {"definitions": {"entities": [{"name": "e", "join_keys": ["k"], "colour": 1}]}},
        ),
        ("/api/v1/features/apply", {"definitions": {}, "unknown": True}),
        (
            "/api/v1/features/apply",
            {
                "definitions": {
                    "entities": [{"name": "e", "join_keys": ["k"]}],
                    "feature_views": [
                        {
                            "name": "a",
                            "entities": ["e"],
                            "source": "view:b",
                            "timestamp_field": "t",
                            "owner": "analytics",
                            "features": [{"name": "x", "dtype": "int64"}],
                        },
                        {
                            "name": "b",
                            "entities": ["e"],
                            "source": "view:a",
                            "timestamp_field": "t",
                            "owner": "analytics",
                            "features": [{"name": "y", "dtype": "int64"}],
                        },
                    ],
                }
            },
        ),
        (
            "/api/v1/features/online",
            {"entities": {"customer_id": [1]}, "features": ["x'; DROP TABLE t; --:a"]},
        ),
        (
            "/api/v1/features/online",
            {"entities": {"customer_id": ["not", {"a": 1}]}, "feature_service": "fraud"},
        ),
        (
            "/api/v1/features/online",
            {"entities": {"customer_id": [1]}, "features": ["customer_stats:nope"]},
        ),
        (
            "/api/v1/features/online",
            {"entities": {"customer_id": list(range(20_000))}, "feature_service": "fraud"},
        ),
        ("/api/v1/features/views/customer_stats/push", {"rows": [{"customer_id": "x"}]}),
    ],
)
def test_hostile_requests_get_a_clear_4xx_and_change_nothing(
    server: LiveServer, path: str, body: dict[str, object]
) -> None:
    before = _registry(server)
    answer = httpx.post(
        server.url + path, json=body, headers={"Authorization": f"Bearer {server.token}"}
    )
    assert 400 <= answer.status_code < 500, answer.text
    assert "Traceback" not in answer.text
    assert _registry(server) == before


def test_a_million_entities_in_one_online_request_are_refused(server: LiveServer) -> None:
    body = json.dumps(
        {"entities": {"customer_id": list(range(1_000_000))}, "feature_service": "fraud"}
    )
    answer = httpx.post(
        server.url + "/api/v1/features/online",
        content=body,
        headers={"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"},
    )
    assert answer.status_code in (400, 413), answer.text
