"""Jobs that could never start are refused at submission, saying which resource is
missing; queued jobs say what they wait for (quota, resources, the scheduler)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shamal.config import (
    GpuSettings,
    NodeSettings,
    PoolSettings,
    QuotaSettings,
    SchedulerSettings,
    Settings,
)
from shamal.scheduler.live import JobLifecycle
from shamal.server import Platform, create_app, start_platform
from tests.jobs.test_api import _team_member

SMALL = {"command": ["true"], "cpus": 1, "memory_mib": 1024}
A100 = GpuSettings(model="A100-80GB", memory_mib=81920)


def _node(name: str, cpus: float, memory_mib: int, *gpus: GpuSettings) -> NodeSettings:
    return NodeSettings(name=name, cpus=cpus, memory_mib=memory_mib, gpus=gpus)


@pytest.fixture
def cluster() -> SchedulerSettings:
    """What each test declares (the default: this machine's size, without GPUs)."""
    return SchedulerSettings(pools=(PoolSettings(name="local", nodes=(_node("n1", 2, 8192),)),))


@pytest.fixture
def platform(
    tmp_path_factory: pytest.TempPathFactory, cluster: SchedulerSettings
) -> Iterator[Platform]:
    home = tmp_path_factory.mktemp("home")
    settings = Settings(
        home=home,
        database_url=f"sqlite:///{home / 'shamal.db'}",
        allowed_hosts=("*",),
        scheduler=cluster,
    )
    running = start_platform(settings)
    yield running
    running.close()


@pytest.fixture
def api(platform: Platform) -> Iterator[TestClient]:
    app = create_app(platform.settings, platform)
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {platform.admin_secret}"
        yield client


def refused(api: TestClient, **job: Any) -> str:
    response = api.post("/api/v1/jobs", json={**SMALL, **job})
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    message: str = response.json()["message"]
    assert message.startswith("this job could never start: ")
    return message.removeprefix("this job could never start: ")


def accepted(api: TestClient, **job: Any) -> dict[str, Any]:
    response = api.post("/api/v1/jobs", json={**SMALL, **job})
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


LARGEST = "; the largest node offers 2 CPUs, 8 GiB"


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"gpus": 1}, "pool 'local' has no GPUs" + LARGEST),
        ({"gpu_fraction": 0.25}, "pool 'local' has no GPUs" + LARGEST),
        ({"mig_profile": "1g.10gb"}, "pool 'local' has no GPUs" + LARGEST),
        ({"cpus": 999}, "999 CPUs per worker is more than any node of pool 'local' has" + LARGEST),
        ({"memory_mib": 16384}, "16 GiB per worker is more than any node of pool 'local' has"),
        (
            {"workers": 3, "cpus": 1},
            "pool 'local' holds at most 2 of the gang's 3 workers at once "
            "(each: 1 CPU and 1 GiB)" + LARGEST,
        ),
    ],
)
def test_a_cpu_only_pool_refuses_what_it_could_never_hold(
    api: TestClient, job: dict[str, Any], message: str
) -> None:
    assert refused(api, **job).startswith(message)
    assert api.get("/api/v1/jobs").json() == []
    assert accepted(api, cpus=2, memory_mib=8192)["state"] == "queued"  # the whole node: fine
    assert accepted(api, workers=2, cpus=1)["workers"] == 2


@pytest.mark.parametrize(
    "cluster",
    [
        SchedulerSettings(
            pools=(
                PoolSettings(
                    name="mig",
                    nodes=(_node("m1", 8, 65536, A100.model_copy(update={"mig_slices": 7})),),
                ),
            )
        )
    ],
)
def test_a_mig_only_pool_points_whole_gpu_requests_at_its_slices(api: TestClient) -> None:
    slices = "(1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
    whole = refused(api, gpus=1)
    assert whole.startswith(
        f"the GPUs of pool 'mig' are MIG-partitioned: ask for a slice with --mig {slices}"
    )
    assert whole.endswith("the largest node offers 8 CPUs, 64 GiB, 1 MIG-partitioned GPU")
    assert refused(api, gpu_fraction=0.5).startswith("the GPUs of pool 'mig' are MIG-partitioned")
    assert refused(api, mig_profile="1g.5gb").startswith(
        f"no GPU of pool 'mig' offers MIG slice 1g.5gb {slices}"
    )
    assert accepted(api, mig_profile="3g.40gb")["mig_profile"] == "3g.40gb"


TWO_POOLS = SchedulerSettings(
    pools=(
        PoolSettings(name="cpu", nodes=(_node("c1", 16, 65536),)),
        PoolSettings(
            name="gpu",
            nodes=(
                _node("g1", 8, 65536, A100.model_copy(update={"count": 2})),
                _node("g2", 8, 65536, A100.model_copy(update={"count": 2})),
            ),
        ),
    ),
    quotas=(QuotaSettings(team="vision", pool="gpu", gpus=1, borrow_gpus=1),),
)


@pytest.mark.parametrize("cluster", [TWO_POOLS])
def test_gangs_span_nodes_and_other_pools_are_named(api: TestClient) -> None:
    gang = accepted(api, gpus=2, workers=2, pool="gpu")  # two nodes of two GPUs: a set fits
    assert gang["workers"] == 2
    assert refused(api, gpus=2, workers=3, pool="gpu").startswith(
        "pool 'gpu' holds at most 2 of the gang's 3 workers at once "
        "(each: 1 CPU, 1 GiB and 2 GPUs); the largest node offers 8 CPUs, 64 GiB, 2 GPUs "
        "(A100-80GB)"
    )
    assert refused(api, gpus=1, pool="cpu") == (
        "pool 'cpu' has no GPUs; the largest node offers 16 CPUs, 64 GiB "
        "(it would fit in pool 'gpu': --pool gpu)"
    )
    assert refused(api, gpus=3) == (
        "no pool could ever hold it: pool 'cpu' has no GPUs (largest node: 16 CPUs, 64 GiB); "
        "3 GPUs per worker is more than any node of pool 'gpu' has (2) (largest node: "
        "8 CPUs, 64 GiB, 2 GPUs (A100-80GB))"
    )
    assert refused(api, gpu_models=["H100"], gpus=1, pool="gpu").startswith(
        "pool 'gpu' has no H100 GPU (it has A100-80GB)"
    )
    assert accepted(api, gpus=1)["pool"] is None  # any pool: the GPU pool holds it


@pytest.mark.parametrize("cluster", [TWO_POOLS])
def test_a_job_larger_than_its_teams_quota_and_borrow_limit_is_refused(
    api: TestClient,
) -> None:
    api.post("/api/v1/teams", json={"name": "vision"})
    assert refused(api, team="vision", gpus=2, workers=2, pool="gpu") == (
        "team 'vision' may hold at most 2 GPUs in pool 'gpu' (its quota plus what it may "
        "borrow) and the job needs 4 GPUs: ask for less, or for a larger quota"
    )
    assert accepted(api, team="vision", gpus=2, pool="gpu")["team"] == "vision"


WAITING = SchedulerSettings(
    pools=(
        PoolSettings(
            name="busy", nodes=(_node("b1", 4, 16384, A100.model_copy(update={"count": 2})),)
        ),
        PoolSettings(
            name="shared", nodes=(_node("s1", 4, 16384, A100.model_copy(update={"count": 2})),)
        ),
    ),
    quotas=(QuotaSettings(team="vision", pool="shared", gpus=1),),
)


def _hold(platform: Platform, job_id: str, node: str, gpus: list[int]) -> None:
    """Admit a job as a scheduler would: it holds its placement from now on."""
    slot = {"node": node, "cpu_milli": 1000, "memory_mib": 1024, "gpus": gpus}
    life = JobLifecycle(platform.db, platform.audit, "test-scheduler")
    assert life.admit(job_id, {"slots": [slot]}, "admitted by the test") is not None


@pytest.mark.parametrize("cluster", [WAITING])
def test_queued_jobs_say_whether_they_wait_for_quota_resources_or_the_scheduler(
    api: TestClient, platform: Platform
) -> None:
    api.post("/api/v1/teams", json={"name": "vision"})
    first = accepted(api, gpus=2, pool="busy")
    assert first["waiting"].startswith("waiting for the scheduler: resources and quota allow")
    _hold(platform, first["id"], "b1", [0, 1])
    blocked = accepted(api, gpus=1, pool="busy")
    assert blocked["waiting"] == (
        "waiting for resources: no node of pool 'busy' has 1 CPU, 1 GiB and 1 GPU free now; "
        "it starts when running jobs end (or are preempted for it)"
    )
    cpu_only = accepted(api, pool="busy")
    assert cpu_only["waiting"].startswith("waiting for the scheduler")
    own = accepted(api, team="vision", gpus=1, pool="shared")
    _hold(platform, own["id"], "s1", [0])
    over = accepted(api, team="vision", gpus=1, pool="shared")
    assert over["waiting"].startswith(
        "waiting for quota: team 'vision' holds its share of pool 'shared'"
    )
    listed = {job["id"]: job for job in api.get("/api/v1/jobs").json()}
    assert listed[first["id"]]["state"] == "admitted"
    assert listed[first["id"]]["waiting"] is None  # only queued jobs wait
    assert listed[blocked["id"]]["waiting"].startswith("waiting for resources")
    assert listed[over["id"]]["waiting"].startswith("waiting for quota")
    shown = api.get(f"/api/v1/jobs/{cpu_only['id']}").json()
    assert shown["waiting"].startswith("waiting for the scheduler")


RECLAIM = SchedulerSettings(
    pools=(
        PoolSettings(
            name="shared", nodes=(_node("s1", 4, 16384, A100.model_copy(update={"count": 2})),)
        ),
    ),
    quotas=(
        QuotaSettings(team="vision", pool="shared", gpus=1, borrow_gpus=1),
        QuotaSettings(team="nlp", pool="shared", gpus=1),
    ),
    policy_options={"min_run_s": 600},
)


@pytest.mark.parametrize("cluster", [RECLAIM])
def test_a_job_within_its_teams_guarantee_says_it_waits_for_reclaim_and_how_long(
    api: TestClient, platform: Platform
) -> None:
    """Another team borrows the pool: the job does not wait for jobs to end, the
    scheduler takes the capacity back once the borrowed jobs have run min_run_s."""
    for team in ("vision", "nlp"):
        api.post("/api/v1/teams", json={"name": team})
    for gpu in (0, 1):
        held = accepted(api, team="vision", gpus=1, pool="shared")
        _hold(platform, held["id"], "s1", [gpu])
    own = accepted(api, team="nlp", gpus=1, pool="shared")
    assert own["waiting"] == (
        "waiting for reclaim: team 'nlp' is within its guaranteed quota of pool 'shared', "
        "which team 'vision' borrows now; the scheduler preempts their jobs there for it "
        "once they have run 10m (a started job is protected that long)"
    )
    more = accepted(api, team="vision", gpus=1, pool="shared")
    assert more["waiting"].startswith("waiting for quota: team 'vision'")
    listed = {job["id"]: job for job in api.get("/api/v1/jobs").json()}
    assert listed[own["id"]]["waiting"].startswith("waiting for reclaim")


@pytest.mark.parametrize("cluster", [RECLAIM])
def test_the_quotas_say_what_each_team_holds_and_borrows_and_members_see_their_own(
    api: TestClient, platform: Platform
) -> None:
    for team in ("vision", "nlp"):
        api.post("/api/v1/teams", json={"name": team})
    for gpu in (0, 1):
        held = accepted(api, team="vision", gpus=1, pool="shared")
        _hold(platform, held["id"], "s1", [gpu])
    accepted(api, team="vision", gpus=1, pool="shared")
    accepted(api, team="nlp", gpus=1, pool="shared")
    rows = {row["team"]: row for row in api.get("/api/v1/scheduler/quotas").json()}
    assert rows["vision"] == {
        "team": "vision",
        "pool": "shared",
        "cohort": "default",
        "weight": 1.0,
        "guaranteed": {"cpus": 0.0, "memory_mib": 0, "gpus": 1.0},
        "borrow_limit": {"cpus": 0.0, "memory_mib": 0, "gpus": 1.0},
        "held": {"cpus": 2.0, "memory_mib": 2048, "gpus": 2.0},
        "running": 2,
        "queued": 1,
    }
    assert (rows["nlp"]["held"]["gpus"], rows["nlp"]["running"], rows["nlp"]["queued"]) == (
        0.0,
        0,
        1,
    )
    member = _team_member(api, "nlp", "ann")
    seen = api.get("/api/v1/scheduler/quotas", headers=member).json()
    assert [row["team"] for row in seen] == ["nlp"]


TWO_POOLS = SchedulerSettings(
    pools=(
        PoolSettings(name="east", nodes=(_node("e1", 4, 16384),)),
        PoolSettings(name="west", nodes=(_node("w1", 4, 16384, A100),)),
    ),
    quotas=(
        QuotaSettings(team="vision", pool="east", cpus=2),
        QuotaSettings(team="vision", pool="west", cpus=2, gpus=1),
    ),
)


@pytest.mark.parametrize("cluster", [TWO_POOLS])
def test_a_queued_job_naming_no_pool_counts_in_each_pool_that_could_run_it(
    api: TestClient, platform: Platform
) -> None:
    """With several pools, a job without --pool waits for whichever of them that could
    run it frees first: it counts in each such pool; one naming a pool counts there."""
    api.post("/api/v1/teams", json={"name": "vision"})
    accepted(api, team="vision")  # fits either pool
    accepted(api, team="vision", gpus=1)  # only west has a GPU
    accepted(api, team="vision", pool="west")
    rows = {row["pool"]: row for row in api.get("/api/v1/scheduler/quotas").json()}
    assert (rows["east"]["queued"], rows["west"]["queued"]) == (1, 3)
