"""Artifact storage: safe paths, object stores, content-addressed (encrypted) blobs.

* :func:`safe_relpath` is the one validator for user-supplied artifact paths;
  :func:`contained_path` maps a validated path under a directory without
  following symbolic links.
* :class:`ObjectStore` is the protocol of the dumb key -> bytes backends
  (:class:`LocalObjectStore`, :class:`S3ObjectStore`), chosen by
  ``settings.artifacts.type`` in :func:`open_object_store`.
* :class:`BlobStore` stores blobs by the sha256 of their content, verifies them
  on every read and, with a :class:`Keyring`, encrypts them at rest
  (AES-256-GCM envelope encryption; master keys rotate without rewriting blobs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shamal.artifacts._blobs import BlobInfo, BlobStore, open_blob_store, open_data_stores
from shamal.artifacts._entities import ArtifactFile, StoreInfo
from shamal.artifacts._keyring import Keyring
from shamal.artifacts._local import LocalObjectStore
from shamal.artifacts._objects import ObjectStore, open_object_store
from shamal.artifacts._paths import contained_path, safe_relpath
from shamal.artifacts._service import DEFAULT_STORE, ArtifactService, team_namespace
from shamal.artifacts._streaming import (
    PrincipalSlots,
    consume_body,
    download_headers,
    download_slot,
    principal_key,
    search_slot,
    sweep_spool,
)

if TYPE_CHECKING:
    from shamal.artifacts._s3 import S3ObjectStore

__all__ = [
    "DEFAULT_STORE",
    "ArtifactFile",
    "ArtifactService",
    "BlobInfo",
    "BlobStore",
    "Keyring",
    "LocalObjectStore",
    "ObjectStore",
    "PrincipalSlots",
    "S3ObjectStore",
    "StoreInfo",
    "consume_body",
    "contained_path",
    "download_headers",
    "download_slot",
    "open_blob_store",
    "open_data_stores",
    "open_object_store",
    "principal_key",
    "safe_relpath",
    "search_slot",
    "sweep_spool",
    "team_namespace",
]


def __getattr__(name: str) -> object:
    # The S3 backend imports boto3; load it only for those who use it.
    if name == "S3ObjectStore":
        from shamal.artifacts._s3 import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
