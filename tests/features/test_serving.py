"""A model served with a feature service: requests carry entity keys, the inference core reads
their online features from a real control plane (a server process, SQLite online store) and
the model answers on them; an entity without features is a clear 400, never a guess."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shamal.client import ShamalClient
from shamal.errors import InvalidParameter
from shamal.serving import OnlineFeatureLookup
from shamal.serving._backends import BackendOptions
from shamal.serving._core import InferenceCore
from shamal.serving._repository import ModelSource, load_repository
from shamal.serving._routing import LatestVersionRouter
from shamal.serving._types import InferInput, InferRequest
from tests.features._live import server_with_dataset
from tests.live import LiveServer
from tests.serving.models import scale_model

pytestmark = pytest.mark.slow

NOW = datetime.now(UTC).replace(microsecond=0)

DEFINITIONS = {
    "entities": [{"name": "sensor", "join_keys": ["sensor_id"]}],
    "feature_views": [
        {
            "name": "readings",
            "entities": ["sensor"],
            "source": "data:readings",
            "timestamp_field": "ts",
            "owner": "iot",
            "features": [{"name": "a", "dtype": "float64"}, {"name": "b", "dtype": "float64"}],
        }
    ],
    "feature_services": [{"name": "scale_inputs", "owner": "iot", "features": ["readings:*"]}],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    rows = pa.table(
        {
            "sensor_id": pa.array([7, 8, 7], pa.int64()),
            "ts": pa.array(
                [NOW - timedelta(hours=3), NOW - timedelta(hours=2), NOW],
                pa.timestamp("us", tz="UTC"),
            ),
            "a": [1.0, 10.0, 2.0],
            "b": [0.5, 20.0, 4.0],
        }
    )
    home = tmp_path_factory.mktemp("serving-features")
    with server_with_dataset(home, "iot", "readings", rows) as (live, api):
        api.apply_features(DEFINITIONS)
        api.materialize_features()
        yield live


class SamplingRouter(LatestVersionRouter):
    """The latest version answers; every request is kept as a deployment's router keeps its
    samples (what a monitor reads)."""

    def __init__(self, versions: Mapping[str, Sequence[str]]) -> None:
        super().__init__(versions)
        self.samples: list[tuple[dict[str, np.ndarray], str | None]] = []

    def sample(
        self,
        model: str,
        version: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
        request_id: str | None = None,
    ) -> None:
        self.samples.append((dict(inputs), request_id))


def _core(
    tmp_path: Path, lookup: OnlineFeatureLookup, router: SamplingRouter | None = None
) -> InferenceCore:
    sources = [ModelSource("scale", "1", str(scale_model(tmp_path / "s.onnx", 2.0)))]
    repository = load_repository(sources, BackendOptions(threads=1), work_dir=tmp_path)
    chosen = router or SamplingRouter(repository.version_map())
    return InferenceCore(repository, chosen, features=lookup)


def _infer(core: InferenceCore, *inputs: InferInput) -> np.ndarray:
    async def main() -> np.ndarray:
        core.start()
        try:
            answer = await core.infer(InferRequest("scale", None, "r1", list(inputs)))
            return answer.outputs[0].data
        finally:
            await core.drain(10)
            await core.stop()

    return asyncio.run(main())


def _keys(*ids: int) -> InferInput:
    data = np.array(ids, dtype=np.int64)
    return InferInput("sensor_id", "INT64", data.shape, data)


def test_requests_with_entity_keys_are_answered_on_their_online_features(
    server: LiveServer, tmp_path: Path
) -> None:
    router = SamplingRouter({"scale": ["1"]})
    with ShamalClient(server.url, server.token) as api:
        lookup = OnlineFeatureLookup(api, lambda model: "scale_inputs")
        got = _infer(_core(tmp_path, lookup, router), _keys(7, 8))
    # Sensor 7's newest row (a=2, b=4) and sensor 8's, each times 2 by the model.
    assert got.tolist() == [[4.0, 8.0], [20.0, 40.0]]
    # The sample a monitor reads holds the online features the model was called on.
    ((inputs, request_id),) = router.samples
    assert request_id == "r1"
    assert [v.tolist() for v in inputs.values()] == [[[2.0, 4.0], [10.0, 20.0]]]


def test_features_the_caller_sends_are_used_as_they_are(server: LiveServer, tmp_path: Path) -> None:
    with ShamalClient(server.url, server.token) as api:
        lookup = OnlineFeatureLookup(api, lambda model: "scale_inputs")
        x = np.array([[1.0, 1.5]], dtype=np.float32)
        got = _infer(_core(tmp_path, lookup), InferInput("x", "FP32", x.shape, x))
    assert got.tolist() == [[2.0, 3.0]]


def test_an_entity_without_online_features_is_refused_by_row(
    server: LiveServer, tmp_path: Path
) -> None:
    with ShamalClient(server.url, server.token) as api:
        lookup = OnlineFeatureLookup(api, lambda model: "scale_inputs")
        with pytest.raises(InvalidParameter, match=r"row\(s\) 1 .*materialize"):
            _infer(_core(tmp_path, lookup), _keys(7, 99))
        data = np.array([1], dtype=np.int64)
        wrong = InferInput("device", "INT64", data.shape, data)
        with pytest.raises(InvalidParameter, match="sensor_id"):
            _infer(_core(tmp_path, lookup), wrong)
