"""The audit hash chain, as pure functions.

Each entry's hash is an HMAC-SHA256, under a key kept outside the database, of
the canonical JSON of its fields and the previous entry's hash. Editing,
deleting or reordering rows breaks the chain, and without the key nobody who can
only write to the database can forge a consistent replacement chain.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from shamal.security._entities import AuditEntry, ChainReport

GENESIS_HASH = "0" * 64


_FIELDS = ("seq", "ts", "actor", "action", "target", "outcome", "detail", "prev_hash")


def entry_hash(key: bytes, fields: Mapping[str, Any]) -> str:
    """HMAC of an entry's fields (everything but its own hash), in a fixed canonical form."""
    values = [fields[name] for name in _FIELDS]
    values[1] = values[1].isoformat()
    values[6] = dict(values[6])
    payload = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(key, payload.encode("ascii"), hashlib.sha256).hexdigest()


def _recomputed(key: bytes, entry: AuditEntry) -> str:
    return entry_hash(key, {name: getattr(entry, name) for name in _FIELDS})


def _entry_problem(
    key: bytes, entry: AuditEntry, expected_seq: int, prev: str, witness: tuple[int, str] | None
) -> str | None:
    if entry.seq != expected_seq:
        return "entry missing (sequence gap)"
    if entry.prev_hash != prev:
        return "link to the previous entry broken"
    if not hmac.compare_digest(_recomputed(key, entry), entry.hash):
        return "entry contents altered"
    if witness is not None and entry.seq == witness[0] and entry.hash != witness[1]:
        return "differs from a verified checkpoint"
    return None


def _tail_problem(
    checked: int, last_hash: str, head_seq: int, head_hash: str, witness: tuple[int, str] | None
) -> str | None:
    if head_seq != checked or not hmac.compare_digest(head_hash, last_hash):
        return "tail of the log removed or head altered"
    if witness is not None and witness[0] > checked:
        return f"log ends before entry {witness[0]}, which was verified earlier"
    return None


def verify_chain(
    key: bytes,
    entries: Iterable[AuditEntry],
    head_seq: int,
    head_hash: str,
    witness: tuple[int, str] | None = None,
) -> ChainReport:
    """Walk ``entries`` in ascending ``seq`` order and report the first broken link.

    ``head_seq``/``head_hash`` is the chain head the writers maintain; a tail cut
    off the log shows up as a head that points past the last entry. Someone who
    can write the database can cut the tail *and* rewind the head; ``witness``
    (a head seen by an earlier verification, kept outside the database) catches
    that: the entry it names must still be there with the same hash.
    """
    checked, prev = 0, GENESIS_HASH
    for entry in entries:
        problem = _entry_problem(key, entry, checked + 1, prev, witness)
        if problem is not None:
            return ChainReport(False, checked, checked + 1, problem)
        prev = entry.hash
        checked += 1
    problem = _tail_problem(checked, prev, head_seq, head_hash, witness)
    if problem is not None:
        return ChainReport(False, checked, checked + 1, problem)
    return ChainReport(True, checked, head_seq=checked, head_hash=prev)
