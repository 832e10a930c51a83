"""Memory per device through the API and the CLI: validated, stored, shown, and refused when
no GPU of the cluster could ever give a worker that much."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from shamal.cli import app
from shamal.config import GpuSettings, PoolSettings, SchedulerSettings
from shamal.scheduler.core import GPU_MILLI, Cluster, Gpu, Node, Placement, Pool, Request, Slot
from shamal.scheduler.live._fit import DEVICE_MEMORY_ENV, device_memory_env
from tests.cli_checks import one_clean_error
from tests.scheduler.live.test_fit import _node, accepted, refused
from tests.scheduler.live.test_fit import api as api  # noqa: PLC0414 - the fixtures
from tests.scheduler.live.test_fit import platform as platform  # noqa: PLC0414

GPUS = SchedulerSettings(
    pools=(
        PoolSettings(
            name="gpu",
            nodes=(
                _node("small", 8, 65536, GpuSettings(model="L4", memory_mib=24576, count=2)),
                _node("big1", 8, 65536, GpuSettings(model="A100-80GB", memory_mib=81920)),
                _node("big2", 8, 65536, GpuSettings(model="A100-80GB", memory_mib=81920)),
            ),
        ),
    )
)


@pytest.fixture
def cluster() -> SchedulerSettings:
    return GPUS


def test_memory_per_device_is_stored_and_shown(api: TestClient) -> None:
    job = accepted(api, gpus=1, workers=2, gpu_memory_mib=40960)
    assert job["gpu_memory_mib"] == 40960
    assert job["resources"] == "1 CPU, 1024 MiB, 1 GPU, >= 40960 MiB per device, x2 workers"
    again = api.get(f"/api/v1/jobs/{job['id']}").json()
    assert again["gpu_memory_mib"] == 40960
    assert accepted(api, gpus=1)["gpu_memory_mib"] == 0  # the default: any device
    half = accepted(api, gpu_fraction=0.5, gpu_memory_mib=40960)  # half of the A100: 40 GiB
    assert half["gpu_memory_mib"] == 40960


def test_memory_no_gpu_could_give_is_refused_with_what_the_largest_offers(
    api: TestClient,
) -> None:
    assert refused(api, gpus=1, gpu_memory_mib=81921).startswith(
        "no GPU of pool 'gpu' gives a worker 80 GiB of device memory (at most 80 GiB for "
        "this request): lower --gpu-memory, ask for a larger share of a GPU, or split the "
        "model into more pipeline stages"
    )
    assert refused(api, gpu_fraction=0.5, gpu_memory_mib=40961).startswith(
        "no GPU of pool 'gpu' gives a worker 40 GiB of device memory (at most 40 GiB"
    )
    three = refused(api, gpus=1, workers=3, gpu_memory_mib=40960)  # two 80 GB GPUs in all
    assert three.startswith(
        "pool 'gpu' holds at most 2 of the gang's 3 workers at once (each: 1 CPU, 1 GiB and "
        "1 GPU with 40 GiB of memory)"
    )
    assert accepted(api, gpus=1, workers=3)["workers"] == 3  # any GPU: the L4s count
    assert len(api.get("/api/v1/jobs").json()) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "Input should be greater than or equal to 0"),
        (4 * 1024 * 1024 + 1, "Input should be less than or equal to 4194304"),
        (2**63, "Input should be less than or equal to 4194304"),
        (1.5, "Input should be a valid integer"),
        ("lots", "Input should be a valid integer"),
        (None, "Input should be a valid integer"),
        ([1], "Input should be a valid integer"),
    ],
)
def test_hostile_memory_per_device_is_refused_and_changes_nothing(
    api: TestClient, value: Any, message: str
) -> None:
    response = api.post(
        "/api/v1/jobs", json={"command": ["true"], "gpus": 1, "gpu_memory_mib": value}
    )
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]
    assert "Traceback" not in response.text
    assert api.get("/api/v1/jobs").json() == []


def test_memory_per_device_needs_a_gpu_request(api: TestClient) -> None:
    response = api.post("/api/v1/jobs", json={"command": ["true"], "gpu_memory_mib": 1024})
    assert response.status_code == 400, response.text
    assert "needs a GPU request (--gpus, --gpu-fraction or --mig)" in response.json()["message"]
    assert api.get("/api/v1/jobs").json() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--gpus", "1", "--gpu-memory", "-5"], "--gpu-memory takes sizes such as 4GiB"),
        (["--gpus", "1", "--gpu-memory", "0"], "--gpu-memory must be at least 1MiB"),
        (["--gpus", "1", "--gpu-memory", "lots"], "--gpu-memory takes sizes such as 4GiB"),
        (["--gpus", "1", "--gpu-memory", "5TiB"], "--gpu-memory: Input should be less than"),
        (["--gpus", "1", "--gpu-memory", "99999TiB"], "--gpu-memory may be at most 16TiB"),
        (["--gpu-memory", "40GiB"], "--gpu-memory: needs a GPU request (--gpus, --gpu-fraction"),
    ],
)
def test_the_cli_refuses_bad_memory_per_device_before_any_request(
    offline_cli: CliRunner, options: list[str], message: str
) -> None:
    one_clean_error(offline_cli.invoke(app, ["job", "submit", *options, "--", "true"]), message)


def test_workers_are_told_the_memory_of_the_smallest_device_of_their_placement() -> None:
    node = Node(
        "n",
        "p",
        64_000,
        65536,
        gpus=[Gpu(0, "A100", 81920), Gpu(1, "L4", 24576), Gpu(2, "A100", 81920, mig_slices=7)],
    )
    template = Cluster.of([Pool("p")], [node])

    def env(request: Request, *slots: Slot) -> dict[str, str]:
        return device_memory_env(template, Placement(slots), request)

    whole = Request(gpus=1, workers=2)
    assert env(whole, Slot("n", 1000, 1024, (0,)), Slot("n", 1000, 1024, (1,))) == {
        DEVICE_MEMORY_ENV: "24576"
    }
    half = Request(gpu_milli=GPU_MILLI // 2)
    assert env(half, Slot("n", 1000, 1024, (0,), gpu_milli=500)) == {DEVICE_MEMORY_ENV: "40960"}
    mig = Request(mig_profile="3g.40gb")
    slot = Slot("n", 1000, 1024, (2,), mig_profile="3g.40gb", mig_start=0)
    assert env(mig, slot) == {DEVICE_MEMORY_ENV: "40960"}
    cpu = Request(memory_mib=2048)
    assert env(cpu, Slot("n", 1000, 2048)) == {DEVICE_MEMORY_ENV: "2048"}  # its host memory
    assert env(cpu, Slot("gone", 1000, 2048)) == {}
