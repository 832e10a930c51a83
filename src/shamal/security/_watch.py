"""The server's own watch over the audit chain, with a witness kept outside the database.

Someone who can write the database but does not hold the key can still cut entries off
the end of the log and move the chain head back: every remaining link verifies. What
catches it is a *witness*, the newest head an earlier verification saw, kept where the
database's writers cannot reach it. ``shamal audit verify`` keeps one on the machine it
runs on; :class:`AuditWatch` keeps the server's, in a 0600 file in the server's home
(which jobs never see), verifies the chain against it every ``interval_s`` seconds,
logs the outcome (an error when broken) and keeps the last report in the same file so
that every worker of the server can answer ``GET /api/v1/audit/status``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shamal.security._audit import AuditLog
from shamal.security._entities import ChainReport

__all__ = ["AuditWatch", "WitnessFile"]

logger = logging.getLogger(__name__)


class WitnessFile:
    """Verified chain heads by name (one per database), in a file only its user reads."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def witness(self, name: str) -> tuple[int, str] | None:
        """The newest verified head recorded under ``name``, if any."""
        entry = self.read().get(name)
        if not isinstance(entry, dict) or not entry.get("seq"):
            return None
        try:
            return int(entry["seq"]), str(entry["hash"])
        except (KeyError, TypeError, ValueError):
            return None

    def record(self, name: str, report: ChainReport, **extra: Any) -> None:
        """Keep ``report`` under ``name``: its head becomes the witness when it is intact;
        a broken one leaves the last good witness in place."""
        entry = {**extra, "ok": report.ok, "report": dataclasses.asdict(report)}
        if report.ok:
            entry.update(seq=report.head_seq, hash=report.head_hash)
        self.keep(name, entry)

    def keep(self, name: str, entry: dict[str, Any]) -> None:
        """Merge ``entry`` into what is kept under ``name`` (``seq`` and ``hash``: the
        witness), atomically, mode 0600."""
        data = self.read()
        previous = data.get(name)
        data[name] = {**(previous if isinstance(previous, dict) else {}), **entry}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


class AuditWatch:
    """Verifies the chain against the server's witness, now and every ``interval_s``.

    Args:
        audit: the chain to verify.
        witnesses: where the server keeps its witness and last report.
        name: the key of this database in ``witnesses``.
        clock: seconds since the epoch, for the report's time.
    """

    def __init__(
        self,
        audit: AuditLog,
        witnesses: WitnessFile,
        name: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._audit = audit
        self._witnesses = witnesses
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()

    def verify(self, client_witness: tuple[int, str] | None = None) -> ChainReport:
        """Verify against the server's witness (and ``client_witness``, one a client
        kept); the first broken report, else the server's. Does not record anything."""
        report = self._audit.verify(self._witnesses.witness(self._name))
        if report.ok and client_witness is not None:
            return self._audit.verify(client_witness)
        return report

    def check(self) -> ChainReport:
        """Verify, record the outcome and log it (an error when the chain is broken)."""
        with self._lock:
            report = self.verify()
            self._witnesses.record(self._name, report, checked_at=self._clock())
        if report.ok:
            logger.info("audit chain intact: %d entries verified", report.entries_checked)
        else:
            logger.error(
                "audit chain BROKEN at entry %s: %s; run `shamal audit verify` and restore "
                "the log from a backup",
                report.first_broken_seq,
                report.reason,
            )
        return report

    def last(self) -> dict[str, Any] | None:
        """The last recorded check: ``ok``, ``checked_at`` and the ``report``."""
        entry = self._witnesses.read().get(self._name)
        return entry if isinstance(entry, dict) and "report" in entry else None

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """Check now, then every ``interval_s`` seconds until ``stop`` is set."""
        while True:
            try:
                self.check()
            except Exception:  # a database hiccup must not end the watch
                logger.exception("could not verify the audit chain; trying again later")
            if stop.wait(interval_s):
                return
