"""The datasets domain's rules on names, references and versions (pure)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from shamal.errors import InvalidParameter

__all__ = [
    "MAX_REGIONS",
    "DataRef",
    "check_alias",
    "check_name",
    "check_regions",
    "check_tag",
    "parse_ref",
    "part_path",
    "version_digest",
]

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_ALIAS = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_REGION = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
MAX_TAG_KEY, MAX_TAG_VALUE, MAX_DESCRIPTION = 250, 5000, 5000
MAX_REGIONS = 64


def check_name(name: str) -> str:
    """A dataset name: lowercase letters, digits, ``.``, ``_`` and ``-``, 1 to 128 characters,
    starting with a letter or digit (it appears in paths and URIs)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidParameter(
            "a dataset name is 1 to 128 lowercase letters, digits, '.', '_' or '-', starting "
            "with a letter or digit"
        )
    return name


def check_alias(alias: str) -> str:
    """An alias: a lowercase letter, then letters, digits, ``_`` or ``-`` (64 at most); never a
    number (``NAME/3`` names version 3) nor ``latest`` (the latest valid version)."""
    if not isinstance(alias, str) or not _ALIAS.match(alias) or alias == "latest":
        raise InvalidParameter(
            "an alias is a lowercase letter then up to 63 letters, digits, '_' or '-', and not "
            "'latest'"
        )
    return alias


def check_regions(regions: Sequence[str]) -> tuple[str, ...]:
    """A residency policy's regions: 1 to 64 labels such as ``ae-dubai`` (lowercase
    letters, digits, ``.``, ``_``, ``-``), sorted, each once."""
    if isinstance(regions, str) or not 1 <= len(regions) <= MAX_REGIONS:
        raise InvalidParameter(
            f"a residency policy lists 1 to {MAX_REGIONS} regions, e.g. ae-dubai,ae-abudhabi "
            "(to let the data go anywhere, remove the policy)"
        )
    for region in regions:
        if not isinstance(region, str) or not _REGION.match(region):
            raise InvalidParameter(
                "a region is 1 to 64 lowercase letters, digits, '.', '_' or '-', as the "
                "stores' and pools' region labels are (e.g. ae-dubai)"
            )
    return tuple(sorted(set(regions)))


def check_tag(key: str, value: str) -> tuple[str, str]:
    if not key or len(key) > MAX_TAG_KEY or "\x00" in key:
        raise InvalidParameter(f"a tag key is 1 to {MAX_TAG_KEY} characters")
    if len(value) > MAX_TAG_VALUE or "\x00" in value:
        raise InvalidParameter(f"a tag value is at most {MAX_TAG_VALUE} characters")
    return key, value


@dataclass(frozen=True, slots=True)
class DataRef:
    """A dataset, and which of its versions: a number, an alias, or (both None) the latest
    valid one."""

    name: str
    version: int | None = None
    alias: str | None = None

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}/{self.version}"
        return f"{self.name}@{self.alias}" if self.alias else self.name


def parse_ref(text: str) -> DataRef:
    """``NAME`` (the latest valid version), ``NAME/3`` (version 3), ``NAME@prod`` (an alias),
    each optionally written as a URI, ``data:/NAME...``."""
    if not isinstance(text, str):
        raise InvalidParameter("a dataset reference is a string")
    body = text.removeprefix("data:/")
    if "@" in body:
        name, _, alias = body.partition("@")
        if alias == "latest":
            return DataRef(check_name(name))
        return DataRef(check_name(name), alias=check_alias(alias))
    name, sep, number = body.partition("/")
    if not sep:
        return DataRef(check_name(name))
    if not number.isascii() or not number.isdigit() or len(number) > 9 or int(number) < 1:
        raise InvalidParameter(f"{text!r}: a version is a positive number, as in {name}/3")
    return DataRef(check_name(name), version=int(number))


def version_digest(part_digests: Sequence[str]) -> str:
    """A version's digest: sha256 over its parts' digests, in order (the same rows in the same
    files give the same digest, whoever wrote them)."""
    hasher = hashlib.sha256()
    for digest in part_digests:
        hasher.update(digest.encode("ascii") + b"\n")
    return hasher.hexdigest()


def part_path(dataset_id: str, digest: str) -> str:
    """Where a part is stored in the datasets' artifact namespace, named by its content."""
    return f"{dataset_id}/parts/{digest}.parquet"


#: The most partitions one partitioned write has.
MAX_PARTITIONS = 1024
_BATCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def staged_folder(batch: str) -> str:
    """The folder of a partitioned write's staged parts, named by its ``batch`` label (a
    job id, say): letters, digits, ``_`` and ``-``, 1 to 64."""
    if not isinstance(batch, str) or not _BATCH.match(batch):
        raise InvalidParameter(
            "a batch label is 1 to 64 letters, digits, '_' or '-' (the job's id, say)"
        )
    return f"{batch}/"


def staged_name(partition: int, partitions: int) -> str:
    """A staged part's record name: ``<partition>-of-<partitions>.json``."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidParameter(f"a write has 1 to {MAX_PARTITIONS} partitions")
    if not 0 <= partition < partitions:
        raise InvalidParameter(
            f"partition {partition} is out of range: partitions are numbered 0 to {partitions - 1}"
        )
    return f"{partition}-of-{partitions}.json"
