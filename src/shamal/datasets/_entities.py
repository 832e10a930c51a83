"""What the datasets domain returns: frozen, and free of ORM rows."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class VersionStatus(enum.StrEnum):
    """``valid`` versions are read by default; a ``quarantined`` one failed its validation
    suite and is kept, with its report, for people to look at, never aliased or read unless
    named by number."""

    VALID = "valid"
    QUARANTINED = "quarantined"


class WriteMode(enum.StrEnum):
    """``append``: the new version holds the latest valid version's rows and the new ones;
    ``overwrite``: only the new ones."""

    APPEND = "append"
    OVERWRITE = "overwrite"


@dataclass(frozen=True, slots=True)
class DataSet:
    """A named table owned by a team (``team`` empty: platform-wide)."""

    id: str
    name: str
    team: str
    description: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    latest_version: int | None = None
    aliases: dict[str, int] = field(default_factory=dict)
    #: The regions its data may be stored and processed in (None: anywhere).
    regions: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Part:
    """One Parquet file of a version, stored content-addressed in the artifact store."""

    path: str
    digest: str
    rows: int
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "digest": self.digest, "rows": self.rows, "size": self.size}


@dataclass(frozen=True, slots=True)
class DataVersion:
    """An immutable version: its parts, schema, row count, source, profile and validation."""

    id: str
    dataset: str
    version: int
    digest: str
    status: VersionStatus
    row_count: int
    size_bytes: int
    schema: tuple[dict[str, Any], ...]
    parts: tuple[Part, ...]
    source: dict[str, Any]
    mode: WriteMode
    profile: dict[str, Any]
    validation: dict[str, Any] | None
    transformations: tuple[dict[str, Any], ...]
    created_by: str
    created_at: datetime
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        """How other domains name it: ``data:/NAME/VERSION``."""
        return f"data:/{self.dataset}/{self.version}"


@dataclass(frozen=True, slots=True)
class StoreResidency:
    """A store data may be written to: its region, whether the dataset's policy allows it,
    and how many of the dataset's parts it holds."""

    name: str
    region: str | None
    allowed: bool
    parts: int = 0


@dataclass(frozen=True, slots=True)
class Residency:
    """A dataset's residency policy (``regions`` None: anywhere) and the stores, judged by
    it."""

    dataset: str
    regions: tuple[str, ...] | None
    stores: tuple[StoreResidency, ...]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A stream record that cannot be a row (unparseable, wrong columns), parked with the
    reason and its payload's sha256 and size, never the payload (it may hold personal
    values): it is acknowledged, not retried for ever, and blocks nothing behind it."""

    key: str
    reason: str
    digest: str
    size: int
    stream: str = ""
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Erasure:
    """A data subject's rows removed from every version of a dataset that held them.

    The subject is kept only as ``subject_hash``, a keyed hash (never the value); each
    entry of ``versions`` names a version changed, the rows it lost and its digests before
    and after.
    """

    id: str
    dataset: str
    column: str
    subject_hash: str
    rows_removed: int
    versions: tuple[dict[str, Any], ...]
    created_by: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StagedPart:
    """One partition of a partitioned ingestion, stored but not yet a version.

    A worker of a gang job reads partition ``partition`` of ``partitions`` of a source and the
    server stores it as a part (privacy policy and residency applied); the caller commits the
    ``partitions`` staged parts of its ``batch`` as one version. ``profile`` is this part's
    own; a staged part no version names is only an unreferenced blob.
    """

    batch: str
    partition: int
    partitions: int
    part: Part
    store: str
    schema: tuple[dict[str, Any], ...]
    profile: dict[str, Any]
    source: dict[str, Any]
    transformations: tuple[dict[str, Any], ...]
    staged_by: str
    staged_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "partition": self.partition,
            "partitions": self.partitions,
            "part": self.part.to_json(),
            "store": self.store,
            "schema": list(self.schema),
            "profile": self.profile,
            "source": self.source,
            "transformations": list(self.transformations),
            "staged_by": self.staged_by,
            "staged_at": self.staged_at.isoformat(),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StagedPart:
        """A record the server wrote (:meth:`to_json`)."""
        part = raw["part"]
        return cls(
            str(raw["batch"]),
            int(raw["partition"]),
            int(raw["partitions"]),
            Part(str(part["path"]), str(part["digest"]), int(part["rows"]), int(part["size"])),
            str(raw["store"]),
            tuple(raw["schema"]),
            dict(raw["profile"]),
            dict(raw["source"]),
            tuple(raw["transformations"]),
            str(raw["staged_by"]),
            datetime.fromisoformat(str(raw["staged_at"])),
        )
