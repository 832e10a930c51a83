"""DeploymentRouter's own parts: the wire format it reads, tensor excerpts, life without a spec."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from shamal.client import ShamalClient
from shamal.deployments import (
    Deployment,
    RolloutPhase,
    RolloutPlan,
    RolloutState,
    Route,
    RouteRole,
    Slo,
    TrafficSplit,
)
from shamal.deployments.api import DeploymentOut, TensorIn
from shamal.errors import NotFound
from shamal.serving._deployment import DeploymentRouter, deployment_from_json, tensor_excerpt
from tests.live import free_port


def test_the_router_reads_what_the_api_writes() -> None:
    since = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    deployment = Deployment(
        name="fraud-api",
        team="red",
        split=TrafficSplit(
            (
                Route("fraud", 1, 70, RouteRole.PRIMARY, "models:/fraud@champion"),
                Route("fraud", 4, 30, RouteRole.PRIMARY, "models:/fraud/4"),
                Route("fraud", 5, 25, RouteRole.CANARY, "models:/fraud/5"),
                Route("fraud", 2, 40, RouteRole.SHADOW, "models:/fraud/2"),
            )
        ),
        slo=Slo(0.02, 75.0, 500),
        plan=RolloutPlan((25, 60), 90.0),
        state=RolloutState(RolloutPhase.PROGRESSING, 25, 1, since),
        revision=7,
        sticky_header="x-user",
        sample_rate=0.125,
    )
    wire = DeploymentOut.of(deployment).model_dump(mode="json")
    assert deployment_from_json(wire) == deployment


def test_tensor_excerpts_are_small_plain_json() -> None:
    floats = np.arange(400, dtype=np.float64).reshape(40, 10)
    floats[0, 1], floats[0, 2] = np.nan, np.inf
    excerpt = tensor_excerpt(floats)
    # whole rows only: 25 rows of 10 values fit in 256
    assert (excerpt["shape"], excerpt["datatype"], excerpt["rows"], len(excerpt["data"])) == (
        [40, 10],
        "float64",
        25,
        250,
    )
    assert excerpt["data"][:4] == [0.0, None, None, 3.0]
    assert excerpt["data"][-1] == 249.0
    wide = tensor_excerpt(np.zeros((2, 300), dtype=np.float32))
    assert (wide["rows"], len(wide["data"])) == (0, 256)  # no whole row fits: its first values
    single = tensor_excerpt(np.array(7))
    assert (single["shape"], single["rows"], single["data"]) == ([], 1, [7])
    words = tensor_excerpt(np.array(["abc", "x" * 300]))
    assert words["datatype"] == "<U300"
    assert words["data"] == ["abc", "x" * 256]
    raw = tensor_excerpt(np.array([b"\x00\xff", b"ok"], dtype=object))
    assert raw["data"] == ["\x00\ufffd", "ok"]
    flags = tensor_excerpt(np.array([[True, False]]))
    assert (flags["datatype"], flags["data"]) == ("bool", [True, False])
    for sample in (excerpt, wide, single, words, raw, flags):
        TensorIn.model_validate(sample)  # what the control plane accepts


def test_without_a_control_plane_the_router_serves_nothing_and_does_not_crash() -> None:
    client = ShamalClient(f"http://127.0.0.1:{free_port()}", "t", timeout=2)
    router = DeploymentRouter(client, "fraud-api", interval_s=0.01)
    try:
        assert router.refresh() is False
        assert router.deployment is None
        assert router.versions() == {}
        assert router.model_uris() == {}
        with pytest.raises(NotFound):
            router.choose("fraud-api", {})
        router.observe("fraud-api", "1", latency_s=0.01, ok=True, shadow=False)
        router.sample("fraud-api", "1", {"x": np.zeros(2)}, {})
        assert router.push() is None
        router.start()
        router.stop()
        assert router.spec_age_s() is None
    finally:
        client.close()
    with pytest.raises(ValueError, match="interval_s"):
        DeploymentRouter(client, "x", interval_s=0)
