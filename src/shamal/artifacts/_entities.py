"""What the artifact service hands to callers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class ArtifactFile:
    """One file in a namespace's artifact tree, pointing at a content-addressed blob."""

    namespace: str
    path: str
    digest: str
    size: int
    created_at: datetime
    created_by: str


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """A named store blobs may be kept in, and the region its ``region`` label names
    (None: unlabelled). ``default`` is the artifact store itself."""

    name: str
    region: str | None
