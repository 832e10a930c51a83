"""What the gate tests share: a team's model ``churn`` with an experiment, and a helper that
makes candidates the way a training job would (a run with metrics, params, tags and inputs,
registered as the next version and named @candidate)."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from shamal.errors import NotFound
from shamal.pipelines import GateReport, PromotionService
from shamal.registry import TEAM_TAG
from shamal.security import AuditContext
from shamal.server import Platform
from shamal.tracking import Dataset, DatasetInput, LoggedData, Metric
from tests.registry.conftest import People, people

__all__ = ["SUITE", "TOLERANT", "World", "csv_bytes", "people"]

TOLERANT = "metrics.f1 >= champion.metrics.f1 - 0.01"
SUITE = """
version: 1
expectations:
  - {kind: range, column: x, min: 0, max: 2}
  - {kind: not_null, column: id, severity: warning}
"""


def csv_bytes(xs: list[float]) -> list[bytes]:
    sink = io.BytesIO()
    pacsv.write_csv(pa.table({"id": list(range(len(xs))), "x": xs}), sink)
    return [sink.getvalue()]


@dataclass
class World:
    platform: Platform
    people: People
    service: PromotionService
    experiment: str

    def ctx(self, who: str = "mo", action: str = "models.promote") -> AuditContext:
        return self.people.ctx(who, action)

    def candidate(
        self,
        f1: float,
        *,
        data: str | None = None,
        tags: dict[str, str] | None = None,
        model: str = "churn",
        metrics: dict[str, float] | None = None,
    ) -> int:
        """A run that logged f1 (an earlier, lower point first: the latest counts), read
        ``data`` (NAME/N) if given, and became the model's next version at @candidate."""
        who = self.people.principals["mo"]
        tracking = self.platform.tracking
        run = tracking.create_run(
            self.ctx(action="setup"), self.experiment, "train", None, {}
        ).info.run_id
        points = [Metric("f1", f1 / 2, 1, 0), Metric("f1", f1, 2, 1)]
        points += [Metric(key, value, 2, 0) for key, value in (metrics or {}).items()]
        tracking.log(
            who,
            run,
            LoggedData(metrics=points, params=[("lr", "0.01")], tags=[("team", "churn")]),
        )
        if data is not None:
            used = Dataset(data, "d", "shamal", json.dumps({"uri": f"data:/{data}"}))
            tracking.log_inputs(who, run, [DatasetInput(used)], [])
        registry = self.platform.registry
        version = registry.create_model_version(
            self.ctx(action="setup"), model, f"runs:/{run}/model", run_id=run, tags=tags
        ).version
        registry.set_registered_model_alias(self.ctx(action="setup"), model, "candidate", version)
        return version

    def champion(self, model: str = "churn") -> int | None:
        try:
            return self.platform.registry.get_model_version_by_alias(
                self.people.principals["vi"], model, "champion"
            ).version
        except NotFound:
            return None

    def promote(self, *rules: str, who: str = "mo", dry_run: bool = False) -> GateReport:
        return self.service.promote(
            self.ctx(who),
            "churn",
            from_alias="candidate",
            to_alias="champion",
            rules=rules,
            dry_run=dry_run,
        )


@pytest.fixture
def world(platform: Platform, people: People) -> World:
    ctx = people.ctx("mo")
    tags = {TEAM_TAG: "red"}
    platform.registry.create_registered_model(ctx, "churn", tags=tags)
    experiment = platform.tracking.create_experiment(ctx, "churn", tags).experiment_id
    service = PromotionService(
        platform.db, platform.audit, platform.registry, platform.tracking, platform.datasets
    )
    return World(platform, people, service, experiment)
