"""The running platform: every service, built once from settings."""

from __future__ import annotations

import hashlib
import logging
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from shamal.artifacts import ArtifactService, BlobStore, Keyring, open_blob_store, open_data_stores
from shamal.clock import utc_now
from shamal.config import Settings
from shamal.datasets import DatasetService, Limits, SourceIngestion, SourcePolicy
from shamal.db import Database, open_database, server_warnings, upgrade
from shamal.deployments import DeploymentService
from shamal.events import EventOutlets, EventService
from shamal.executors import detect_local_gpus
from shamal.features import FeatureStoreService
from shamal.jobs import JobService
from shamal.lineage import LineageService
from shamal.monitoring import MonitorService, MonitorServices, ReferenceService
from shamal.pipelines import (
    PipelineService,
    PipelineTriggers,
    PromotionService,
    check_trigger,
)
from shamal.registry import RegistryService
from shamal.scheduler.core import Cluster
from shamal.scheduler.live import (
    SchedulerLoop,
    build_cluster,
    build_loop,
    cluster_capacity,
    effective_settings,
)
from shamal.security import (
    AuditContext,
    AuditLog,
    AuditWatch,
    PseudonymKeys,
    SecurityService,
    WitnessFile,
    load_or_create_key,
)
from shamal.traces import TraceService
from shamal.tracking import TrackingService
from shamal.tune import TuneService

logger = logging.getLogger(__name__)


@dataclass
class Platform:
    """Everything a server process needs, opened and migrated.

    ``admin_secret`` is set only on the very first start, when the bootstrap
    admin token was just created (it is also in ``settings.token_file``).
    """

    settings: Settings
    db: Database
    audit: AuditLog
    security: SecurityService
    blobs: BlobStore
    artifacts: ArtifactService
    tracking: TrackingService
    registry: RegistryService
    jobs: JobService
    cluster: Cluster
    tune: TuneService
    deployments: DeploymentService
    datasets: DatasetService
    lineage: LineageService
    dataset_sources: SourceIngestion
    features: FeatureStoreService
    pipelines: PipelineService
    promotion: PromotionService
    audit_watch: AuditWatch
    events: EventService
    event_outlets: EventOutlets
    pipeline_triggers: PipelineTriggers
    references: ReferenceService
    monitors: MonitorService
    traces: TraceService
    admin_secret: str | None = None

    def close(self) -> None:
        self.event_outlets.close()
        self.features.close()
        self.tune.close()
        self.db.dispose()

    def scheduler_loop(
        self, *, name: str | None = None, api_url: str | None = None
    ) -> SchedulerLoop:
        """The live scheduler's loop over this platform, with the platform's periodic work:
        trials whose jobs died fail, and a canary whose traffic stopped still moves on (or
        back) after its interval."""
        loop = build_loop(self, name=name, api_url=api_url)
        self.jobs.on_submit.append(loop.wake.set)
        loop.periodic.append((10.0, self.tune.fail_stale_trials))
        loop.periodic.append((10.0, self.deployments.check_rollouts))
        # Each pass is cheap when nothing moved; a step's successor starts within a tick.
        loop.periodic.append((0.0, self.pipelines.advance_all))
        loop.periodic.append((1.0, self.pipeline_triggers.consume_events))
        loop.periodic.append((5.0, self.pipeline_triggers.fire_schedules))
        loop.periodic.append((2.0, self.event_outlets.run_once))
        # Due monitors run under a lease each: cheap when none is due.
        loop.periodic.append((5.0, self.monitors.run_due))
        loop.periodic.append((2.0, self.monitors.apply_policies))
        return loop


def start_platform(settings: Settings, *, migrate: bool = True) -> Platform:
    """Open the database (migrating it to head), the audit chain and the services."""
    private_home(settings.home)
    db = open_database(settings.resolved_database_url)
    if migrate:
        upgrade(db)
    for warning in server_warnings(db):
        logger.warning(warning)
    key = load_or_create_key(settings.keys_dir / "audit.key", settings.audit_key)
    audit = AuditLog(db, key)
    security = SecurityService(db, audit)
    admin_secret = security.bootstrap(settings.token_file)
    if admin_secret:
        logger.info("created the admin account; its token is in %s", settings.token_file)
    blobs = open_blob_store(settings)
    artifacts = ArtifactService(
        db,
        blobs,
        audit,
        security,
        region=settings.artifacts.labels.get("region") or None,
        data_stores=open_data_stores(settings, blobs.keyring),
    )
    tracking = TrackingService(db, audit, security, artifacts)
    registry = RegistryService(db, audit, tracking, files=tracking.files, runs=tracking)
    scheduler_settings = effective_settings(settings.scheduler)
    cluster = build_cluster(scheduler_settings, detect_local_gpus)
    # Sources are spooled and parts written beside upload bodies: one disk, already private.
    # A key ring of its own: retiring the master keys of encryption at rest must never make
    # tokens unrevealable, nor erased subjects unmatchable.
    sources = _source_policy(settings)
    pseudonym_file = settings.resolved_pseudonym_key_file
    privacy_keys = PseudonymKeys(
        Keyring.load_or_create(pseudonym_file), path=pseudonym_file, load=Keyring.load
    )
    datasets = DatasetService(
        db,
        audit,
        security,
        artifacts,
        settings.resolved_upload_spool_dir / "datasets",
        privacy_keys=privacy_keys,
        limits=sources.limits,
    )
    jobs = JobService(
        db,
        audit,
        security,
        artifacts,
        scheduler_settings,
        cluster,
        capacity=cluster_capacity(scheduler_settings, cluster),
        # A job reading datasets runs only in the regions their residency policies allow.
        data_regions=datasets.allowed_regions,
    )
    tune = TuneService(db, audit, settings.resolved_database_url)
    # Keyed by a digest of the database's URL: no password lands in the file.
    database_name = hashlib.sha256(settings.resolved_database_url.encode()).hexdigest()[:16]
    deployments = DeploymentService(db, audit, security, registry)
    # Webhook secrets are sealed under keys derived (purpose "webhook-secrets") from the
    # pseudonymization ring: a ring of its own, never retired with the at-rest keys.
    events = EventService(
        db, audit, security, keys=privacy_keys, allow_private=settings.events.allow_private_webhooks
    )
    pipelines = PipelineService(
        db,
        audit,
        security,
        jobs,
        tracking,
        resolve_dataset=_dataset_resolver(datasets),
        check_trigger=check_trigger,
    )
    references = ReferenceService(
        db, audit, registry, datasets, settings.resolved_upload_spool_dir / "monitoring"
    )
    monitors = MonitorService(
        MonitorServices(
            db=db,
            audit=audit,
            security=security,
            deployments=deployments,
            registry=registry,
            references=references,
            pipelines=pipelines,
            events=events,
        ),
        retrain_backoff=timedelta(seconds=settings.monitoring.retrain_backoff_s),
    )
    return Platform(
        settings=settings,
        db=db,
        audit=audit,
        security=security,
        blobs=blobs,
        artifacts=artifacts,
        tracking=tracking,
        registry=registry,
        jobs=jobs,
        cluster=cluster,
        tune=tune,
        deployments=deployments,
        datasets=datasets,
        lineage=LineageService(datasets, tracking, registry, deployments),
        dataset_sources=SourceIngestion(
            datasets, sources, settings.resolved_upload_spool_dir / "datasets"
        ),
        features=FeatureStoreService(
            db,
            audit,
            security,
            datasets,
            settings.features,
            settings.home,
            in_use=deployments.feature_services_in_use,
        ),
        pipelines=pipelines,
        promotion=PromotionService(db, audit, registry, tracking, datasets),
        audit_watch=AuditWatch(audit, WitnessFile(settings.audit_witness_file), database_name),
        events=events,
        event_outlets=EventOutlets(events, settings.events),
        pipeline_triggers=PipelineTriggers(db, security, pipelines, events, utc_now),
        references=references,
        monitors=monitors,
        traces=TraceService(db, audit, tracking),
        admin_secret=admin_secret,
    )


def _dataset_resolver(datasets: DatasetService) -> Callable[[AuditContext, str], str]:
    """``NAME[@ALIAS]`` -> ``NAME/NUMBER``, as the step's user may read it."""

    def resolve(ctx: AuditContext, reference: str) -> str:
        found = datasets.version(ctx.require_principal(), reference)
        return f"{found.dataset}/{found.version}"

    return resolve


def private_home(home: Path) -> None:
    """Make ``home`` (mode 0700), or take back what its mode gives others: it holds the
    admin token, the keys and the database."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(home.stat().st_mode)
    if mode & 0o077:
        logger.warning("SHAMAL_HOME %s was open to others (mode %o); it is now 0700", home, mode)
        home.chmod(0o700)


def _source_policy(settings: Settings) -> SourcePolicy:
    """What the server may read for a dataset (``data_sources``): nothing unless listed."""
    sources = settings.data_sources
    return SourcePolicy(
        s3_buckets=frozenset(sources.s3_buckets),
        s3_endpoint_url=sources.s3_endpoint_url,
        s3_region=sources.s3_region,
        sql_hosts=frozenset(h.lower() for h in sources.sql_hosts),
        sql_timeout_s=sources.sql_timeout_s,
        max_object_bytes=settings.max_upload_bytes,
        limits=Limits(sources.max_expansion, sources.expansion_allowance_mib << 20),
    )
