"""A step naming an executor the server does not run is refused when the pipeline is
registered, not halfway through a run; one it runs is taken."""

from __future__ import annotations

import pytest

from shamal.errors import InvalidParameter
from shamal.pipelines import PipelineSpec
from shamal.security import AuditContext
from shamal.server import Platform


def _spec(executor: str) -> PipelineSpec:
    return PipelineSpec.from_json(
        {
            "name": "p",
            "steps": [
                {"name": "prep", "command": ["echo", "a"]},
                {
                    "name": "train",
                    "command": ["echo", "b"],
                    "after": ["prep"],
                    "executor": executor,
                },
            ],
        }
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_step_on_an_executor_the_server_lacks_is_refused_at_registration(
    platform: Platform,
) -> None:
    principal = platform.security.authenticate(platform.admin_secret or "")
    ctx = AuditContext(action="pipeline.register", actor=principal.name, principal=principal)
    with pytest.raises(InvalidParameter) as refused:
        platform.pipelines.register(ctx, _spec("ray"))
    assert refused.value.message.startswith("step 'train': this server runs jobs on")
    assert "SHAMAL_SCHEDULER__EXECUTORS" in refused.value.message
    info, created = platform.pipelines.register(ctx, _spec("local"))
    assert created
    assert info.name == "p"
