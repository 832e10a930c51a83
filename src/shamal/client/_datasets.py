"""Client calls about datasets (``shamal data ...``, ``shamal.data.load``).

Answers are the server's JSON (see ``shamal.datasets.api``): a dataset has ``name``, ``team``,
``latest_version`` and ``aliases``; a version has ``version``, ``uri``, ``digest``, ``status``,
``row_count``, ``columns``, ``parts`` and ``profile``. A version's rows are its Parquet parts,
downloaded as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from shamal.client._calls import CHUNK, ClientCalls, raise_for
from shamal.errors import InvalidParameter, ServiceUnavailable

#: The formats a source is read as, by file suffix (``--format`` names one otherwise).
SUFFIX_FORMATS = {
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
}


#: Sources the server reads itself (``POST /api/v1/datasets/NAME/ingestions``); anything
#: else given to ``--from`` is a local file, uploaded.
REMOTE_SCHEMES = ("s3", "postgresql", "postgres", "mysql", "mariadb")
#: Suffixes of a compressed CSV or JSON-lines file (the server tells gzip and zstd apart by
#: their first bytes).
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")


def is_remote(source: str) -> bool:
    """Whether ``source`` names a source the server reads (s3://, postgresql://, mysql://)."""
    scheme, sep, _rest = source.partition("://")
    return bool(sep) and scheme in REMOTE_SCHEMES


def redact(source: str) -> str:
    """``source`` with the password of its user info (if any) replaced by ``***``."""
    scheme, sep, rest = source.partition("://")
    if not sep:
        return source
    auth, at, host = rest.rpartition("@")
    if not at or ":" not in auth:
        return source
    return f"{scheme}://{auth.split(':', 1)[0]}:***@{host}"


def has_password(source: str) -> bool:
    return redact(source) != source


def _path(name: str, *rest: str) -> str:
    return "/".join(("/api/v1/datasets", quote(name, safe=""), *rest))


def source_format(path: Path, given: str | None = None) -> str:
    """The format a source file is read as: ``given``, else told by its suffix."""
    if given:
        return given
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes.pop()
    found = SUFFIX_FORMATS.get(suffixes[-1]) if suffixes else None
    if found is None:
        known = ", ".join(sorted(SUFFIX_FORMATS))
        raise InvalidParameter(
            f"cannot tell the format of {path.name!r} from its suffix ({known}, optionally "
            "followed by .gz or .zst); give --format"
        )
    return found


class DatasetCalls(ClientCalls):
    """Calls of the datasets API."""

    def create_dataset(
        self, name: str, *, team: str | None = None, description: str = ""
    ) -> dict[str, Any]:
        body = {"name": name, "team": team, "description": description}
        result: dict[str, Any] = self.request("POST", "/api/v1/datasets", json=body)
        return result

    def list_datasets(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return self.list_pages("/api/v1/datasets", limit=limit)

    def get_dataset(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", _path(name))
        return result

    def dataset_versions(self, name: str, *, limit: int = 100) -> list[dict[str, Any]]:
        return self.list_pages(_path(name, "versions"), limit=limit)

    def dataset_version(self, reference: str) -> dict[str, Any]:
        """The version ``NAME`` (latest valid), ``NAME/3`` or ``NAME@alias`` names."""
        body = reference.removeprefix("data:/")
        if "@" in body:
            name, _, alias = body.partition("@")
            path = _path(name, "aliases", quote(alias, safe=""))
        elif "/" in body:
            name, _, number = body.partition("/")
            path = _path(name, "versions", quote(number, safe=""))
        else:
            path = _path(body, "latest")
        result: dict[str, Any] = self.request("GET", path)
        return result

    def ingest_file(
        self,
        name: str,
        source: Path,
        *,
        fmt: str | None = None,
        mode: str = "append",
        on_progress: Callable[[int], None] | None = None,
        store: str | None = None,
    ) -> dict[str, Any]:
        """Write a version of ``name`` from a local file, streamed to the server (its part
        into ``store``; None: the first store the dataset's residency policy allows)."""
        chosen = source_format(source, fmt)
        try:
            handle = source.open("rb")
        except OSError as exc:
            raise InvalidParameter(f"cannot read {source}: {exc.strerror}") from None

        def chunks() -> Iterator[bytes]:
            with handle:
                while block := handle.read(CHUNK):
                    if on_progress is not None:
                        on_progress(len(block))
                    yield block

        result: dict[str, Any] = self.request(
            "POST",
            f"/api/v1/dataset-uploads/{quote(name, safe='')}",
            params={"format": chosen, "mode": mode, **({"store": store} if store else {})},
            content=chunks(),
            headers={"Content-Type": "application/octet-stream"},
            timeout=httpx.Timeout(self._http.timeout.connect, read=None, write=None),
        )
        return result

    def ingest_source(
        self,
        name: str,
        source: str,
        *,
        query: str | None = None,
        fmt: str | None = None,
        mode: str = "append",
    ) -> dict[str, Any]:
        """Write a version of ``name`` from a source the server reads itself: an S3 object
        (``s3://BUCKET/KEY``) or a SQL ``query`` on ``postgresql://`` / ``mysql://``. The
        server must be allowed to read it (its operator's ``data_sources``)."""
        body = {"source": source, "query": query, "format": fmt, "mode": mode}
        result: dict[str, Any] = self.request(
            "POST",
            _path(name, "ingestions"),
            json={k: v for k, v in body.items() if v is not None},
            timeout=httpx.Timeout(self._http.timeout.connect, read=None, write=None),
        )
        return result

    def stage_partition(
        self,
        name: str,
        source: str,
        *,
        batch: str,
        partition: int,
        partitions: int,
        query: str | None = None,
        fmt: str | None = None,
        partition_by: str | None = None,
    ) -> dict[str, Any]:
        """Have the server read partition ``partition`` of ``partitions`` of ``source`` (the
        objects of an ``s3://BUCKET/PREFIX/``, or a query's rows by ``partition_by``) and
        stage it as a part of this caller's ``batch`` (see :meth:`commit_partitions`)."""
        body = {
            "source": source,
            "query": query,
            "format": fmt,
            "partition_by": partition_by,
            "batch": batch,
            "partition": partition,
            "partitions": partitions,
        }
        result: dict[str, Any] = self.request(
            "POST",
            _path(name, "ingestions", "parts"),
            json={k: v for k, v in body.items() if v is not None},
            timeout=httpx.Timeout(self._http.timeout.connect, read=None, write=None),
        )
        return result

    def staged_partitions(self, name: str, batch: str) -> list[dict[str, Any]]:
        """This caller's staged parts of ``batch`` of ``name``, by partition."""
        result: list[dict[str, Any]] = self.request(
            "GET", _path(name, "ingestions", "parts"), params={"batch": batch}
        )
        return result

    def commit_partitions(
        self, name: str, batch: str, partitions: int, *, mode: str = "append"
    ) -> dict[str, Any]:
        """Commit this caller's ``partitions`` staged parts of ``batch`` as one version."""
        result: dict[str, Any] = self.request(
            "POST",
            _path(name, "ingestions", "commits"),
            json={"batch": batch, "partitions": partitions, "mode": mode},
            timeout=httpx.Timeout(self._http.timeout.connect, read=None, write=None),
        )
        return result

    def get_dataset_suite(self, name: str) -> str | None:
        """The YAML of the suite new versions of ``name`` are validated against, if any."""
        suite: str | None = self.request("GET", _path(name, "suite"))["yaml"]
        return suite

    def set_dataset_suite(self, name: str, yaml_text: str | None) -> None:
        """Validate every new version of ``name`` against ``yaml_text`` (None: no suite)."""
        if yaml_text is None:
            self.request("DELETE", _path(name, "suite"))
        else:
            self.request("PUT", _path(name, "suite"), json={"yaml": yaml_text})

    def set_dataset_alias(self, name: str, alias: str, version: int) -> dict[str, Any]:
        path = _path(name, "aliases", quote(alias, safe=""))
        result: dict[str, Any] = self.request("PUT", path, json={"version": version})
        return result

    def delete_dataset_alias(self, name: str, alias: str) -> None:
        self.request("DELETE", _path(name, "aliases", quote(alias, safe="")))

    def diff_dataset_versions(self, name: str, before: str, after: str) -> dict[str, Any]:
        """How version ``after`` of ``name`` differs from ``before`` (each a number, an alias
        or ``latest``): ``added``, ``removed``, ``type_changes``, ``row_change`` and, per
        column, ``null_rate_change``, ``mean_change``, ``distinct_change``, ``ks``, ``psi``."""
        params = {"from": before, "to": after}
        result: dict[str, Any] = self.request("GET", _path(name, "diff"), params=params)
        return result

    def download_dataset_part(self, name: str, version: int, index: int, dest: Path) -> Path:
        """Write part ``index`` of version ``version`` (a Parquet file) to ``dest``."""
        url = _path(name, "versions", str(version), "parts", str(index))
        try:
            with self._http.stream("GET", url, timeout=httpx.Timeout(30.0, read=None)) as answer:
                raise_for(answer)  # before the file is made: an error leaves nothing behind
                with dest.open("wb") as out:
                    for block in answer.iter_bytes(CHUNK):
                        out.write(block)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"download from {self.url} failed ({exc.__class__.__name__})"
            ) from exc
        return dest

    def dataset_residency(self, name: str) -> dict[str, Any]:
        """``name``'s residency policy (``regions``, null: anywhere) and the ``stores``, each
        with its ``region``, whether the policy ``allowed`` it and the ``parts`` it holds."""
        result: dict[str, Any] = self.request("GET", _path(name, "residency"))
        return result

    def set_dataset_residency(self, name: str, regions: list[str] | None) -> dict[str, Any]:
        """Allow ``name``'s data only in ``regions`` (None: anywhere); maintainers."""
        result: dict[str, Any] = self.request(
            "PUT", _path(name, "residency"), json={"regions": regions}
        )
        return result

    def copy_dataset_version(self, name: str, version: int, store: str) -> dict[str, Any]:
        """Copy version ``version`` of ``name`` into ``store``: the ``stores`` holding it."""
        result: dict[str, Any] = self.request(
            "POST", _path(name, "versions", str(version), "copies"), json={"store": store}
        )
        return result

    def dataset_version_stores(self, name: str, version: int) -> list[str]:
        """The stores that hold every part of version ``version`` of ``name``."""
        stores: list[str] = self.request("GET", _path(name, "versions", str(version), "stores"))[
            "stores"
        ]
        return stores

    def write_stream_batch(
        self,
        name: str,
        stream: str,
        records: Sequence[tuple[str, dict[str, Any]]],
        dead: Sequence[Any] = (),
    ) -> dict[str, Any]:
        """Append a consumer's micro-batch to ``name``, exactly once by key within
        ``stream``; ``dead`` are records that could not be decoded (key, reason, digest and
        size, never the payload), parked on the server. Answers ``written``, ``skipped``,
        ``parked`` and the ``version`` written (None when nothing was)."""
        body = {
            "stream": stream,
            "records": [{"key": key, "row": row} for key, row in records],
            "dead": [
                {"key": d.key, "reason": d.reason, "digest": d.digest, "size": d.size} for d in dead
            ],
        }
        result: dict[str, Any] = self.request(
            "POST", _path(name, "stream-batches"), json=body, timeout=httpx.Timeout(30.0, read=None)
        )
        return result

    def push_rows(self, name: str, rows: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
        """Append ``rows`` to ``name`` once per idempotency ``key`` (a retry with the same
        key answers with the version the first push wrote, ``replayed`` true)."""
        result: dict[str, Any] = self.request(
            "POST", _path(name, "push"), json=list(rows), headers={"Idempotency-Key": key}
        )
        return result

    def dead_letters(self, name: str, *, limit: int = 100) -> list[dict[str, Any]]:
        """The records of ``name``'s streams that were parked, newest first."""
        result: list[dict[str, Any]] = self.request(
            "GET", _path(name, "dead-letters"), params={"limit": limit}
        )
        return result

    # ------------------------------------------------------------------ privacy
    def get_dataset_privacy(self, name: str) -> dict[str, Any]:
        """``{"policy": ..., "yaml": ...}`` of the privacy policy of ``name`` (both None
        without one)."""
        result: dict[str, Any] = self.request("GET", _path(name, "privacy"))
        return result

    def set_dataset_privacy(self, name: str, yaml_text: str | None) -> dict[str, Any] | None:
        """Pseudonymize new versions of ``name`` under the policy ``yaml_text`` (YAML or
        JSON; None removes it)."""
        if yaml_text is None:
            self.request("DELETE", _path(name, "privacy"))
            return None
        result: dict[str, Any] = self.request(
            "PUT", _path(name, "privacy"), json={"yaml": yaml_text}
        )
        return result

    def reveal_tokens(self, name: str, column: str, tokens: list[str]) -> list[str | None]:
        """The values behind tokenized values of ``column`` (privacy officers)."""
        body = {"column": column, "tokens": tokens}
        values: list[str | None] = self.request("POST", _path(name, "reveal"), json=body)["values"]
        return values

    def erase_subject(self, name: str, column: str, subject: str) -> dict[str, Any]:
        """Remove the rows whose ``column`` holds ``subject`` from every version of ``name``."""
        body = {"column": column, "subject": subject}
        result: dict[str, Any] = self.request(
            "POST",
            _path(name, "erasures"),
            json=body,
            timeout=httpx.Timeout(self._http.timeout.connect, read=None),
        )
        return result

    def dataset_erasures(self, name: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", _path(name, "erasures"))
        return result

    def rotate_privacy_key(self) -> str:
        """Make a new pseudonymization key active (platform admins); its id."""
        key: str = self.request("POST", "/api/v1/privacy/keys")["key"]
        return key
