"""ORM rows. Only domain ``_store`` modules import these; rows never leave a store."""

from __future__ import annotations

from shamal.db.models._base import Base, UTCDateTime
from shamal.db.models.artifacts import ArtifactFileRow
from shamal.db.models.audit import AuditEntryRow, AuditHeadRow
from shamal.db.models.datasets import (
    DataAliasRow,
    DataDeadLetterRow,
    DataErasureRow,
    DataPartStoreRow,
    DataSetRow,
    DataStreamKeyRow,
    DataVersionRow,
    DataVersionTagRow,
)
from shamal.db.models.deployments import (
    DeploymentEventRow,
    DeploymentLabelRow,
    DeploymentRow,
    DeploymentSampleRow,
    DeploymentStatsRow,
)
from shamal.db.models.events import (
    EventConsumerRow,
    EventRow,
    WebhookDeliveryRow,
    WebhookRow,
)
from shamal.db.models.features import (
    FeatureApplyRow,
    FeatureMaterializationRow,
    FeatureObjectRow,
)
from shamal.db.models.jobs import (
    JobAttemptRow,
    JobEventRow,
    JobRow,
    SchedulerRow,
    SnapshotOwnerRow,
)
from shamal.db.models.monitoring import (
    MonitorPointRow,
    MonitorReferenceRow,
    MonitorResultRow,
    MonitorRow,
)
from shamal.db.models.pipelines import (
    PipelineCacheRow,
    PipelineRow,
    PipelineRunRow,
    PipelineScheduleRow,
    PipelineStepRow,
    PipelineVersionRow,
)
from shamal.db.models.registry import (
    ModelAliasRow,
    ModelVersionRow,
    ModelVersionTagRow,
    RegisteredModelRow,
    RegisteredModelTagRow,
)
from shamal.db.models.security import (
    ApiTokenRow,
    SignInLinkRow,
    TeamInvitationRow,
    TeamMemberRow,
    TeamRow,
    UserRow,
)
from shamal.db.models.tracking import (
    DatasetRow,
    ExperimentRow,
    ExperimentTagRow,
    LatestMetricRow,
    LoggedModelParamRow,
    LoggedModelRow,
    LoggedModelTagRow,
    MetricRow,
    ParamRow,
    RunInputRow,
    RunModelLinkRow,
    RunRow,
    RunTagRow,
)

__all__ = [
    "ApiTokenRow",
    "ArtifactFileRow",
    "AuditEntryRow",
    "AuditHeadRow",
    "Base",
    "DataAliasRow",
    "DataDeadLetterRow",
    "DataErasureRow",
    "DataPartStoreRow",
    "DataSetRow",
    "DataStreamKeyRow",
    "DataVersionRow",
    "DataVersionTagRow",
    "DatasetRow",
    "DeploymentEventRow",
    "DeploymentRow",
    "DeploymentLabelRow",
    "DeploymentSampleRow",
    "DeploymentStatsRow",
    "EventConsumerRow",
    "EventRow",
    "ExperimentRow",
    "ExperimentTagRow",
    "FeatureApplyRow",
    "FeatureMaterializationRow",
    "FeatureObjectRow",
    "JobAttemptRow",
    "JobEventRow",
    "JobRow",
    "LatestMetricRow",
    "LoggedModelParamRow",
    "LoggedModelRow",
    "LoggedModelTagRow",
    "MetricRow",
    "ModelAliasRow",
    "MonitorPointRow",
    "MonitorReferenceRow",
    "MonitorResultRow",
    "MonitorRow",
    "ModelVersionRow",
    "ModelVersionTagRow",
    "ParamRow",
    "PipelineCacheRow",
    "PipelineRow",
    "PipelineRunRow",
    "PipelineScheduleRow",
    "PipelineStepRow",
    "PipelineVersionRow",
    "RegisteredModelRow",
    "RegisteredModelTagRow",
    "RunInputRow",
    "RunModelLinkRow",
    "RunRow",
    "RunTagRow",
    "SchedulerRow",
    "SnapshotOwnerRow",
    "SignInLinkRow",
    "TeamInvitationRow",
    "TeamMemberRow",
    "TeamRow",
    "UTCDateTime",
    "UserRow",
    "WebhookDeliveryRow",
    "WebhookRow",
]
