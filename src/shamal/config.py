"""Settings: read once in an entry point, then passed down, never re-read.

Every setting comes from an environment variable with the ``SHAMAL_`` prefix
(nested ones with ``__``, e.g. ``SHAMAL_ARTIFACTS__TYPE=s3``). The object is
frozen: code that wants different settings builds a new one with
:meth:`Settings.model_copy`.

The embedded default needs no configuration at all: SQLite and a local artifact
directory under ``SHAMAL_HOME`` (``~/.shamal``), a server bound to 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "GpuSettings",
    "DataSourceSettings",
    "FeatureSettings",
    "LocalArtifactSettings",
    "MonitoringSettings",
    "NodeSettings",
    "PoolSettings",
    "PriorityClassSettings",
    "QuotaSettings",
    "SchedulerSettings",
    "S3ArtifactSettings",
    "STORE_NAME_PATTERN",
    "Settings",
    "is_loopback_host",
]

_MIB = 1024 * 1024
#: A data store's name (``data_stores``); ``default`` names the artifact store itself.
STORE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
_LABELS_HELP = (
    'labels of the store; "region" (e.g. "ae-dubai") is where its bytes are kept, which '
    "datasets' residency policies are checked against"
)


class LocalArtifactSettings(BaseModel):
    """Artifacts in a directory of this machine (default: ``SHAMAL_HOME/artifacts``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["local"] = "local"
    root: Path | None = None
    labels: dict[str, str] = Field(default_factory=dict, description=_LABELS_HELP)


class S3ArtifactSettings(BaseModel):
    """Artifacts in an S3-compatible object store.

    Credentials are taken the standard AWS way (environment, profile, instance role)
    unless given here.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["s3"] = "s3"
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = Field(default=None, repr=False)
    #: ``region`` above is the S3 API's (where the client connects); the residency region
    #: the data is held in is ``labels["region"]``, as on every store and pool.
    labels: dict[str, str] = Field(default_factory=dict, description=_LABELS_HELP)


ArtifactSettings = Annotated[
    LocalArtifactSettings | S3ArtifactSettings, Field(discriminator="type")
]


class DataSourceSettings(BaseModel):
    """What the server itself may read when asked to ingest a dataset from a remote source
    (``POST /api/v1/datasets/NAME/ingestions``). Nothing by default: a server that reads
    any URL a user names is an SSRF hole, so the operator lists the S3 buckets and database
    hosts it may reach. Local files of the server are never a source (users upload theirs).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    s3_buckets: tuple[str, ...] = Field(
        default=(),
        description="S3 buckets datasets may be ingested from (the server's own S3 "
        "credentials read them: the AWS environment, profile or instance role)",
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="S3-compatible endpoint of those buckets (default: AWS)"
    )
    s3_region: str | None = None
    sql_hosts: tuple[str, ...] = Field(
        default=(),
        description="`host:port` of the PostgreSQL and MariaDB/MySQL servers SQL sources "
        "may name; give the platform a least-privilege, read-only database user there",
    )
    sql_timeout_s: float = Field(
        default=3600.0, gt=0, le=86_400, description="statement timeout of a SQL source"
    )
    max_expansion: int = Field(
        default=200,
        ge=2,
        description="a compressed source (gzip, zstd) may expand to at most this many times "
        "its compressed size (past expansion_allowance_mib): decompression bombs stop there",
    )
    expansion_allowance_mib: int = Field(default=256, ge=1)


class EventSettings(BaseModel):
    """Events: the webhooks and the optional broker that carry them out of the platform."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow_private_webhooks: bool = Field(
        default=False,
        description="let every webhook target loopback, private and link-local addresses "
        "(receivers on a private network); off, only public addresses are reached, unless "
        "an admin allows one webhook",
    )
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=60)
    broker: Literal["nats", "rabbitmq"] | None = Field(
        default=None, description="publish every event to this broker too"
    )
    broker_url: str | None = Field(default=None, repr=False)  # may hold a password
    broker_stream: str = Field(default="SHAMAL_EVENTS", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    broker_subject_prefix: str = Field(default="shamal.events", pattern=r"^[a-z0-9_.-]{1,64}$")
    broker_exchange: str = Field(default="shamal.events", pattern=r"^[A-Za-z0-9_.-]{1,64}$")


class MonitoringSettings(BaseModel):
    """Monitors: how their drift policies pace themselves."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retrain_backoff_s: float = Field(
        default=3600.0,
        ge=0,
        le=30 * 86400,
        description="after a retraining that did not take (its run failed or was "
        "cancelled, or its canary was rolled back), how long drift waits before it starts "
        "another (a new version of the pipeline ends the wait)",
    )


class FeatureSettings(BaseModel):
    """The feature store: where online features live, and how much a training-set join may
    hold in memory before it spills to disk."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    online_store: str = Field(
        default="sqlite",
        description="the online store: `sqlite` (a file under SHAMAL_HOME), "
        "`sqlite:////abs/path.db`, or `redis://HOST:PORT/DB` for production",
    )
    online_region: str | None = Field(
        default=None,
        description="the region the online store is in: a feature view over a dataset whose "
        "residency policy does not allow it is never materialized there",
    )
    join_memory_mb: int = Field(
        default=1024,
        ge=64,
        description="what one point-in-time join may hold in memory; past it, it spills to "
        "SHAMAL_HOME/features/spill",
    )
    materialize_chunk_rows: int = Field(default=100_000, ge=1000, le=10_000_000)


class GpuSettings(BaseModel):
    """GPUs of one model on a declared node (``count`` of them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1, max_length=64, examples=["H100-80GB"])
    memory_mib: int = Field(ge=1, examples=[81559])
    count: int = Field(default=1, ge=1, le=64)
    mig_slices: int = Field(default=0, ge=0, le=8, description="compute slices when in MIG mode")


class NodeSettings(BaseModel):
    """A node declared in configuration (tests, simulation, or machines NVML cannot see)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    cpus: float = Field(gt=0, le=4096)
    memory_mib: int = Field(ge=1)
    gpus: tuple[GpuSettings, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)


class PoolSettings(BaseModel):
    """A pool of nodes; labels carry region and prices (``cost_per_gpu_hour``, ...)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    labels: dict[str, str] = Field(default_factory=dict)
    nodes: tuple[NodeSettings, ...] = ()
    local: bool = Field(
        default=False, description="add this machine (CPUs, memory, detected GPUs) as a node"
    )


class QuotaSettings(BaseModel):
    """A team's guaranteed share of a pool and what idle capacity it may borrow."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    team: str = Field(min_length=1, max_length=64)
    pool: str = Field(min_length=1, max_length=64)
    gpus: float = Field(default=0, ge=0)
    cpus: float = Field(default=0, ge=0)
    memory_mib: int = Field(default=0, ge=0)
    borrow_gpus: float = Field(default=0, ge=0)
    borrow_cpus: float = Field(default=0, ge=0)
    borrow_memory_mib: int = Field(default=0, ge=0)
    cohort: str = "default"
    weight: float = Field(default=1.0, gt=0)


class PriorityClassSettings(BaseModel):
    """A named priority; ``preempts``: may preempt lower classes; ``preemptible``: may be."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9-]*$")
    value: int
    preempts: bool = True
    preemptible: bool = True


_DEFAULT_CLASSES = (
    PriorityClassSettings(name="low", value=0, preempts=False),
    PriorityClassSettings(name="normal", value=100),
    PriorityClassSettings(name="high", value=1000),
    PriorityClassSettings(name="critical", value=10000, preemptible=False),
)


class SchedulerSettings(BaseModel):
    """The scheduler: its policy, executor, pools, quotas and priority classes.

    Without any pool configured, one pool ``local`` holds this machine (its CPUs,
    memory and the GPUs NVML detects). ``cluster_file`` (TOML with ``[[pools]]``,
    ``[[quotas]]`` and ``[[priority_classes]]`` tables) adds to what is given here.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    policy: str | None = Field(default=None, description="policy name; default: the platform's")
    policy_options: dict[str, float | tuple[float, ...]] = Field(
        default_factory=dict,
        description='options of the policy, e.g. {"min_run_s": 600} (see `shamal scheduler '
        "policies`)",
    )
    executor: Literal["local", "ray"] = Field(
        default="local",
        description="the executor that runs jobs which name none (and every job started "
        "before jobs could name one)",
    )
    executors: tuple[Literal["local", "ray"], ...] = Field(
        default=(),
        description='executors this scheduler also runs, for jobs that name one, e.g. ["ray"] '
        "beside the default local one",
    )
    ray_address: str | None = Field(
        default=None,
        description="the Ray cluster the ray executor uses (default: a local Ray head it starts)",
    )
    api_url: str | None = Field(
        default=None,
        description="the URL jobs reach the API at (default: the server's own address; "
        "`shamal scheduler run` gives jobs no credentials without it)",
    )
    tick_s: float = Field(default=1.0, gt=0, le=60)
    launch_concurrency: int = Field(
        default=8, ge=1, le=64, description="jobs a scheduler launches at once in one tick"
    )
    fair_share_half_life_h: float = Field(
        default=168.0, gt=0, description="past usage counts half after this many hours"
    )
    grace_s: float = Field(default=30.0, ge=0, le=3600)
    lease_s: float = Field(
        default=60.0,
        ge=1,
        le=86_400,
        description="a scheduler silent for this long is presumed dead and a live one adopts "
        "its jobs (at least 5 ticks are always allowed)",
    )
    default_retries: int = Field(default=0, ge=0, le=100)
    run_jobs_as: Literal["team-users", "server-user"] = Field(
        default="team-users",
        description="the OS user local jobs run as: one per team (`shamal-<team>`, made on "
        "first use; needs the scheduler to run as root), or the server's own user (a "
        "single-user laptop only; refused when the server runs as root)",
    )
    sandbox: bool = Field(
        default=True,
        description="run local jobs in mount, PID and IPC namespaces that hide the server's "
        "home and every other job; false runs them unconfined (only with run_jobs_as = "
        "server-user)",
    )
    job_folders: Path | None = Field(
        default=None,
        description="where jobs' working folders go, outside SHAMAL_HOME (default: "
        "SHAMAL_HOME's sibling `<name>-jobs`)",
    )
    job_shared_folders: tuple[Path, ...] = Field(
        default=(),
        description="folders every job may read and write at their own paths (a shared "
        "scratch or dataset folder): every tenant sees them, so never put secrets there",
    )
    job_pids_max: int = Field(
        default=4096, ge=16, le=4_194_304, description="processes and threads per worker"
    )
    job_disk_mib: int = Field(
        default=20480,
        ge=0,
        description="the most a local job's working folder may hold (0: no limit); a job past "
        "it fails with 'disk limit exceeded'",
    )
    job_tmp_mib: int = Field(
        default=1024,
        ge=1,
        description="size of a job's private /tmp (memory that counts against its own limit)",
    )
    job_network: Literal["platform", "host", "none"] = Field(
        default="platform",
        description="`platform`: each job gets a network of its own whose only way out is "
        "the platform's API (no database port, no other job's services, no internet); "
        "`host`: the machine's network; `none`: loopback only. Gangs use the machine's",
    )
    name: str | None = Field(
        default=None,
        description="this scheduler's name (default: host name); jobs it claims carry it",
    )
    pools: tuple[PoolSettings, ...] = ()
    quotas: tuple[QuotaSettings, ...] = ()
    priority_classes: tuple[PriorityClassSettings, ...] = _DEFAULT_CLASSES
    default_priority: str = "normal"
    cluster_file: Path | None = None

    @property
    def executor_names(self) -> tuple[str, ...]:
        """Every executor this scheduler runs: the default first, then the others, once."""
        return tuple(dict.fromkeys((self.executor, *self.executors)))


class Settings(BaseSettings):
    """All of Shamal's configuration. Frozen once built."""

    model_config = SettingsConfigDict(
        env_prefix="SHAMAL_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    home: Path = Field(default_factory=lambda: Path.home() / ".shamal")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default sqlite:///SHAMAL_HOME/shamal.db",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8600, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    allowed_hosts: tuple[str, ...] = Field(
        default=(),
        description="Host header allow-list; empty means loopback names plus the bound host",
    )
    max_request_bytes: int = Field(default=16 * _MIB, ge=1024)
    max_upload_bytes: int = Field(default=50 * 1024 * _MIB, ge=1024)
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="longest wait for the next piece of a request body (408)"
    )
    min_body_rate: int = Field(
        default=1024,
        ge=0,
        description="least average bytes a second of a request body once body_rate_grace_s "
        "have passed (408 below it; 0: no floor)",
    )
    body_rate_grace_s: float = Field(default=30.0, ge=0)
    max_uploads_per_principal: int = Field(
        default=8, ge=1, description="uploads one account may stream at once (429 beyond)"
    )
    max_searches_per_principal: int = Field(
        default=4, ge=1, description="searches and list pages one account may run at once (429)"
    )
    max_downloads_per_principal: int = Field(
        default=8,
        ge=1,
        description="downloads and job-log reads one account may stream at once (429 beyond)",
    )
    upload_spool_dir: Path | None = Field(
        default=None,
        description="where upload bodies gather before they go to the store; default the "
        "local store's own staging folder, or SHAMAL_HOME/uploads",
    )
    max_page_bytes: int = Field(
        default=4 * _MIB,
        ge=64 * 1024,
        description="a search or list page stops early past this many bytes of JSON and "
        "gives a next_page_token",
    )
    graceful_shutdown_s: float = Field(default=20.0, ge=0)
    access_log: bool = Field(default=True, description="Log one line per HTTP request")

    artifacts: ArtifactSettings = Field(default_factory=LocalArtifactSettings)
    data_stores: dict[
        Annotated[str, StringConstraints(pattern=STORE_NAME_PATTERN)], ArtifactSettings
    ] = Field(
        default_factory=dict,
        description="further named stores datasets may be written to, each labelled with "
        'its region (e.g. {"dubai": {"type": "local", "root": "/srv/dubai", "labels": '
        '{"region": "ae-dubai"}}}); a local one without a root is SHAMAL_HOME/data-stores/'
        "NAME; the artifact store itself is named `default`",
    )
    encrypt_artifacts: bool = False
    master_key_file: Path | None = Field(
        default=None, description="Keyring of master keys; default SHAMAL_HOME/keys/master.json"
    )
    pseudonym_key_file: Path | None = Field(
        default=None,
        description="Key ring of the pseudonymization secrets (hmac and tokenize privacy "
        "policies); default SHAMAL_HOME/keys/pseudonyms.json. Every server of a deployment "
        "needs the same file",
    )
    audit_key: str | None = Field(
        default=None,
        repr=False,
        description="Key of the audit hash chain (hex); default SHAMAL_HOME/keys/audit.key",
    )
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    data_sources: DataSourceSettings = Field(default_factory=DataSourceSettings)
    features: FeatureSettings = Field(default_factory=FeatureSettings)
    events: EventSettings = Field(default_factory=EventSettings)
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings)
    audit_check_s: float = Field(
        default=300.0,
        ge=0,
        description="how often the server verifies the audit chain against its own witness "
        "(0: never)",
    )
    audit_reads: bool = Field(
        default=False,
        description="record an audit entry (artifact.read) for every download of an artifact "
        "or a model's files, through the Shamal API and the MLflow-artifacts proxy, refusals "
        "included; off by default: one entry per download",
    )
    mlflow_ui: bool = Field(
        default=True,
        description="serve MLflow's own UI under /mlflow/, behind the web UI's sign-in, and "
        "open the mlflow client's 'View run at' links there, when the mlflow package (the "
        "mlflow-ui extra) is installed; false keeps /mlflow/ off and the links in Shamal's UI",
    )

    @field_validator("data_stores")
    @classmethod
    def _no_default_store(cls, value: dict[str, ArtifactSettings]) -> dict[str, ArtifactSettings]:
        if "default" in value:
            raise ValueError("'default' names the artifact store itself: name the store otherwise")
        return value

    # ------------------------------------------------------------------ derived paths
    def data_store_root(self, name: str) -> Path:
        """The folder of the local data store ``name`` (its ``root``, else under ``home``)."""
        store = self.data_stores[name]
        if isinstance(store, LocalArtifactSettings) and store.root is not None:
            return store.root
        return self.home / "data-stores" / name

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to SQLite under ``home``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / 'shamal.db'}"

    @property
    def artifact_root(self) -> Path:
        """Root directory of the local artifact store."""
        if isinstance(self.artifacts, LocalArtifactSettings) and self.artifacts.root is not None:
            return self.artifacts.root
        return self.home / "artifacts"

    @property
    def resolved_upload_spool_dir(self) -> Path:
        """Where upload bodies gather: beside the local store's own temporary files (one
        disk, and the store's staging folder already), else under ``home``."""
        if self.upload_spool_dir is not None:
            return self.upload_spool_dir
        if isinstance(self.artifacts, LocalArtifactSettings):
            return self.artifact_root / ".tmp"
        return self.home / "uploads"

    @property
    def jobs_dir(self) -> Path:
        """Where the local executor unpacks snapshots and writes logs of running jobs."""
        return self.home / "jobs"

    @property
    def job_folders(self) -> Path:
        """Where local jobs' working folders go: outside ``home``, so a job's folder is
        never next to the server's secrets."""
        configured = self.scheduler.job_folders
        return (
            configured if configured is not None else self.home.with_name(self.home.name + "-jobs")
        )

    @property
    def keys_dir(self) -> Path:
        return self.home / "keys"

    @property
    def audit_witness_file(self) -> Path:
        """The server's witness of the audit chain: outside the database, with the keys."""
        return self.keys_dir / "audit-witness.json"

    @property
    def resolved_master_key_file(self) -> Path:
        return self.master_key_file or self.keys_dir / "master.json"

    @property
    def resolved_pseudonym_key_file(self) -> Path:
        return self.pseudonym_key_file or self.keys_dir / "pseudonyms.json"

    @property
    def token_file(self) -> Path:
        """Where the embedded default writes the first admin token (mode 0600)."""
        return self.home / "token"

    @property
    def effective_allowed_hosts(self) -> tuple[str, ...]:
        """Host names the server answers to (guards loopback servers against DNS rebinding)."""
        if self.allowed_hosts:
            return self.allowed_hosts
        if _is_wildcard(self.host):
            return ("*",)
        return tuple(sorted({"localhost", "127.0.0.1", "::1", "[::1]", self.host}))


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """True when ``host`` names only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
