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


def verify_chain(
    key: bytes, entries: Iterable[AuditEntry], head_seq: int, head_hash: str
) -> ChainReport:
    """Walk ``entries`` in ascending ``seq`` order and report the first broken link.

    ``head_seq``/``head_hash`` is the chain head the writers maintain; a tail cut
    off the log shows up as a head that points past the last entry.
    """
    expected_seq, prev = 1, GENESIS_HASH
    checked = 0
    for entry in entries:
        if entry.seq != expected_seq:
            return ChainReport(False, checked, expected_seq, "entry missing (sequence gap)")
        if entry.prev_hash != prev:
            return ChainReport(False, checked, entry.seq, "link to the previous entry broken")
        if not hmac.compare_digest(_recomputed(key, entry), entry.hash):
            return ChainReport(False, checked, entry.seq, "entry contents altered")
        prev = entry.hash
        expected_seq += 1
        checked += 1
    if head_seq != checked or not hmac.compare_digest(head_hash, prev):
        return ChainReport(False, checked, checked + 1, "tail of the log removed or head altered")
    return ChainReport(True, checked)
