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

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "LocalArtifactSettings",
    "S3ArtifactSettings",
    "Settings",
    "is_loopback_host",
]

_MIB = 1024 * 1024


class LocalArtifactSettings(BaseModel):
    """Artifacts in a directory of this machine (default: ``SHAMAL_HOME/artifacts``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["local"] = "local"
    root: Path | None = None


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


ArtifactSettings = Annotated[
    LocalArtifactSettings | S3ArtifactSettings, Field(discriminator="type")
]


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
    graceful_shutdown_s: float = Field(default=20.0, ge=0)

    artifacts: ArtifactSettings = Field(default_factory=LocalArtifactSettings)
    encrypt_artifacts: bool = False
    master_key_file: Path | None = Field(
        default=None, description="Keyring of master keys; default SHAMAL_HOME/keys/master.json"
    )
    audit_key: str | None = Field(
        default=None,
        repr=False,
        description="Key of the audit hash chain (hex); default SHAMAL_HOME/keys/audit.key",
    )

    # ------------------------------------------------------------------ derived paths
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
    def keys_dir(self) -> Path:
        return self.home / "keys"

    @property
    def resolved_master_key_file(self) -> Path:
        return self.master_key_file or self.keys_dir / "master.json"

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
