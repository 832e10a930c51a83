"""The curve read the web UI draws from: a metric's points in a step range, NaNs left out,
in step order, only for those who may read the run."""

from __future__ import annotations

import math

import pytest

from shamal.errors import NotFound
from shamal.security import AccountKind, AuditContext
from shamal.server import Platform
from shamal.tracking import Metric
from shamal.tracking._service import LoggedData


def test_a_ranged_read_gives_the_points_in_step_order_without_nans(
    platform: Platform, admin_token: str
) -> None:
    admin = platform.security.authenticate(admin_token)
    ctx = AuditContext(action="test", actor="admin", principal=admin)
    tracking = platform.tracking
    experiment = tracking.create_experiment(ctx, "curves", {}).experiment_id
    run = tracking.create_run(ctx, experiment, "r", None, {}).info.run_id
    values = {step: step / 10 for step in range(200)}
    values[50] = math.nan
    values[60] = math.inf
    metrics = [Metric("loss", v, 1000 + s, s) for s, v in reversed(values.items())]
    metrics.append(Metric("loss", 99.0, 5000, 10))  # a second point at step 10, logged later
    tracking.log(admin, run, LoggedData(metrics=metrics))
    whole = tracking.metric_points(admin, run, "loss")
    assert len(whole) == 200  # 201 points, the NaN left out
    assert [s for s, _ in whole] == sorted(s for s, _ in whole)
    assert (10, 1.0) in whole
    assert (10, 99.0) in whole
    assert (60, math.inf) in whole  # an infinity is the caller's to drop
    ranged = tracking.metric_points(admin, run, "loss", 45, 55)
    assert [s for s, _ in ranged] == [45, 46, 47, 48, 49, 51, 52, 53, 54, 55]
    assert tracking.metric_points(admin, run, "loss", 300, None) == []
    assert tracking.metric_points(admin, run, "other") == []
    platform.security.create_user(ctx, "outsider", AccountKind.USER, is_admin=False)
    secret = platform.security.create_token(ctx, "t", None, for_user="outsider").secret
    outsider = platform.security.authenticate(secret)
    team_run = tracking.create_experiment(
        ctx, "private", {"shamal.team": _team(platform, ctx)}
    ).experiment_id
    private = tracking.create_run(ctx, team_run, "p", None, {}).info.run_id
    with pytest.raises(NotFound):
        tracking.metric_points(outsider, private, "loss")


def _team(platform: Platform, ctx: AuditContext) -> str:
    platform.security.create_team(ctx, "curves-team")
    return "curves-team"
