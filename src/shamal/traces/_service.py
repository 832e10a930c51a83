"""Rules of traces: who may write and read them, and what one may hold.

A trace belongs to an experiment and is reached through it, with the same roles as the
experiment's runs (:class:`~shamal.tracking.RunAccess`): viewers read, members write
(start traces, log spans, set tags, link to runs), maintainers delete. A trace of an
experiment the caller cannot see answers exactly as a missing one.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sqlalchemy.orm import Session

from shamal.db import Database
from shamal.errors import InvalidParameter, NotFound
from shamal.security import AuditContext, AuditLog, Principal, Role
from shamal.traces import _store
from shamal.traces._entities import TRACE_STATES, Span, Trace, TraceInfo
from shamal.traces._npmi import Correlation, correlation
from shamal.tracking import (
    TRACES,
    Experiment,
    RunAccess,
    decode_page_token,
    encode_page_token,
    parse_filter,
    parse_order_by,
)

logger = logging.getLogger(__name__)

#: What one request and one trace may hold. A stock server sets no such counts; these leave
#: room for every agent trace we know of and bound what one read of a trace costs.
MAX_SPANS_PER_REQUEST = 10_000
MAX_SPANS_PER_TRACE = 10_000
#: One span, and one trace's spans, as OTLP protobuf JSON (inputs and outputs included).
MAX_SPAN_BYTES = 1024 * 1024
MAX_TRACE_BYTES = 16 * 1024 * 1024
#: The most span bytes one batch read answers: ten whole traces of the largest size (the
#: stock client asks for ten at a time).
MAX_BATCH_BYTES = 10 * MAX_TRACE_BYTES
MAX_TAGS = 1_000
MAX_KEY = 250
#: Longer tag and metadata values are cut to this length, as run tag values are.
MAX_VALUE = 8_000
#: The most traces one read of infos or delete by ids names; one read of whole traces.
MAX_BATCH_TRACES = 1_000
MAX_BATCH_FULL_TRACES = 100
MAX_LINKED_TRACES = 100
#: Search pages: the default size, and the most one page holds (a client asking for more
#: follows the page token, as it does on a stock server).
DEFAULT_SEARCH_RESULTS = 100
MAX_SEARCH_RESULTS = 50_000
MAX_PAGE = 1_000
_LIMITS = _store.SpanLimits(spans=MAX_SPANS_PER_TRACE, bytes=MAX_TRACE_BYTES)
_TRACE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_NUM_SPANS_STAT = "num_spans"
_SIZE_STATS_METADATA = "mlflow.trace.sizeStats"


def check_trace_id(trace_id: str) -> str:
    """A trace id as Shamal stores it: 1-64 letters, digits, ``_``, ``.``, ``-``.

    Raises:
        InvalidParameter: anything else.
    """
    if not isinstance(trace_id, str) or not _TRACE_ID.fullmatch(trace_id):
        raise InvalidParameter(
            "Invalid trace ID: it must be 1-64 letters, digits, '_', '.' or '-' "
            "(such as 'tr-' and 32 hexadecimal digits)."
        )
    return trace_id


def check_key(kind: str, key: str) -> str:
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY or not key.isprintable():
        raise InvalidParameter(f"Invalid {kind} key: keys are 1-{MAX_KEY} printable characters.")
    return key


def checked_pairs(kind: str, items: Mapping[str, str]) -> dict[str, str]:
    """Tags or metadata as stored: checked keys, values cut to ``MAX_VALUE``."""
    if len(items) > MAX_TAGS:
        raise InvalidParameter(f"A trace may have at most {MAX_TAGS} {kind} entries.")
    if any("\x00" in v for v in items.values()):  # no database text column holds NUL
        raise InvalidParameter(f"A trace {kind} value holds a NUL character.")
    return {check_key(kind, k): v[:MAX_VALUE] for k, v in items.items()}


def _expected_spans(info: TraceInfo) -> int:
    """How many spans the client said the trace has (its size stats), else 0."""
    try:
        stats = json.loads(info.metadata.get(_SIZE_STATS_METADATA, "{}"))
        count = stats.get(_NUM_SPANS_STAT, 0) if isinstance(stats, dict) else 0
    except ValueError:
        return 0
    return count if isinstance(count, int) else 0


@dataclass(frozen=True, slots=True)
class TracePage:
    """A page of a trace search."""

    items: list[TraceInfo]
    next_page_token: str | None = None


class TraceService:
    """Traces of experiments. Thread-safe; one per process."""

    def __init__(self, db: Database, audit: AuditLog, runs: RunAccess) -> None:
        self._db = db
        self._audit = audit
        self._runs = runs

    def now_ms(self) -> int:
        """The clock of the experiments' owner, in milliseconds since the epoch."""
        return self._runs.now_ms()

    # ------------------------------------------------------------------ access
    def _writable(self, principal: Principal, experiment_id: str) -> Experiment:
        exp = self._runs.experiment(principal, experiment_id, Role.MEMBER)
        if exp.lifecycle_stage != "active":
            raise InvalidParameter(
                f"The experiment {experiment_id} must be in the 'active' state. "
                f"Current state is {exp.lifecycle_stage}."
            )
        return exp

    def _reach(self, principal: Principal, trace_id: str, needed: Role = Role.VIEWER) -> int:
        """The trace's experiment, when ``principal`` holds ``needed`` on it.

        Raises:
            NotFound: no such trace, or one the principal may not see.
            PermissionDenied: visible, but ``needed`` is not held.
        """
        if not isinstance(trace_id, str) or not _TRACE_ID.fullmatch(trace_id):
            raise _store.not_found(str(trace_id))
        with self._db.unit_of_work(write=False) as s:
            experiment_id = _store.experiment_of(s, trace_id)
        if experiment_id is None:
            raise _store.not_found(trace_id)
        try:
            self._runs.experiment(principal, str(experiment_id), needed)
        except NotFound:
            raise _store.not_found(trace_id) from None
        return experiment_id

    def _visible_ids(
        self,
        principal: Principal,
        trace_ids: Sequence[str],
        experiment_ids: Sequence[str],
        most: int = MAX_BATCH_TRACES,
    ) -> list[str]:
        """The traces of ``trace_ids`` the principal may read (within ``experiment_ids``
        when any are given), in the order asked; the others are left out."""
        if len(trace_ids) > most:
            raise InvalidParameter(f"Ask for at most {most} traces at a time.")
        wanted = [
            t for t in dict.fromkeys(trace_ids) if isinstance(t, str) and _TRACE_ID.fullmatch(t)
        ]
        with self._db.unit_of_work(write=False) as s:
            owners = _store.experiments_of(s, wanted)
        allowed = (
            {int(e) for e in experiment_ids if e.isascii() and e.isdigit()}
            if experiment_ids
            else None
        )
        readable: dict[int, bool] = {}
        for experiment_id in set(owners.values()):
            try:
                self._runs.experiment(principal, str(experiment_id))
                readable[experiment_id] = allowed is None or experiment_id in allowed
            except NotFound:
                readable[experiment_id] = False
        return [t for t in wanted if t in owners and readable[owners[t]]]

    # ------------------------------------------------------------------ writing
    def start(self, principal: Principal, info: TraceInfo) -> TraceInfo:
        """Record a trace's info (``StartTraceV3``, sent when the trace ends): a new trace,
        or the one its spans started.

        Raises:
            InvalidParameter: a bad id, state, key; the trace is another experiment's.
            NotFound, PermissionDenied: the experiment (or that of a trace the spans join)
                is not writable by the principal.
        """
        check_trace_id(info.trace_id)
        if info.state not in TRACE_STATES:
            raise InvalidParameter(f"Invalid trace state; one of {', '.join(TRACE_STATES)}.")
        info = replace(
            info,
            tags=checked_pairs("tag", info.tags),
            metadata=checked_pairs("metadata", info.metadata),
            client_request_id=(info.client_request_id or "")[:MAX_KEY] or None,
        )
        exp = self._writable(principal, info.experiment_id)
        info = replace(info, experiment_id=exp.experiment_id)
        return self._db.run(
            lambda s: _store.save_info(s, info, exp.artifact_location), retry_unique=True
        )

    def end(
        self,
        principal: Principal,
        trace_id: str,
        *,
        end_ms: int,
        state: str,
        metadata: Mapping[str, str],
        tags: Mapping[str, str],
    ) -> TraceInfo:
        """End a trace started by MLflow 2's API (``EndTrace``): its duration runs to
        ``end_ms``; metadata and tags are added."""
        if state not in TRACE_STATES:
            raise InvalidParameter(f"Invalid trace state; one of {', '.join(TRACE_STATES)}.")
        metadata, tags = checked_pairs("metadata", metadata), checked_pairs("tag", tags)
        self._reach(principal, trace_id, Role.MEMBER)
        return self._db.run(lambda s: _store.end_trace(s, trace_id, end_ms, state, metadata, tags))

    def log_spans(self, principal: Principal, experiment_id: str, spans: Sequence[Span]) -> int:
        """Store spans (OTLP ingestion) in one transaction: all of them, or none.

        Returns:
            How many traces the spans belong to.

        Raises:
            InvalidParameter: too many or too large spans.
            NotFound, PermissionDenied: the experiment (or that of a trace the spans join)
                is not writable by the principal.
        """
        if len(spans) > MAX_SPANS_PER_REQUEST:
            raise InvalidParameter(
                f"A request may carry at most {MAX_SPANS_PER_REQUEST} spans; got {len(spans)}."
            )
        by_trace: dict[str, dict[str, Span]] = defaultdict(dict)
        for span in spans:
            if len(span.content.encode()) > MAX_SPAN_BYTES:
                raise InvalidParameter(f"A span may be at most {MAX_SPAN_BYTES} bytes as JSON.")
            # A span sent twice in one request: the last one stands, as if sent again later.
            by_trace[check_trace_id(span.trace_id)][span.span_id] = span
        targets = self._span_targets(principal, experiment_id, list(by_trace))

        def work(s: Session) -> None:
            for trace_id in sorted(by_trace):  # one order for every writer: no deadlock
                number, root = targets[trace_id]
                _store.log_spans(
                    s, number, root, trace_id, list(by_trace[trace_id].values()), _LIMITS
                )

        if by_trace:
            self._db.run(work, retry_unique=True)
        return len(by_trace)

    def _span_targets(
        self, principal: Principal, experiment_id: str, trace_ids: Sequence[str]
    ) -> dict[str, tuple[int, str]]:
        """trace id -> (experiment, its artifact root) that its spans go to.

        A new trace goes to the header's experiment; spans of a trace that exists join it in
        its own experiment, as a stock server adds them, when the sender may write there too
        (otherwise the trace answers as a missing one would).
        """
        exp = self._writable(principal, experiment_id)
        header = (int(exp.experiment_id), exp.artifact_location)
        owners = self._db.run(lambda s: _store.experiments_of(s, trace_ids))
        roots: dict[int, tuple[int, str]] = {header[0]: header}
        for owner in set(owners.values()) - set(roots):
            other = self._writable(principal, str(owner))
            roots[owner] = (owner, other.artifact_location)
        return {tid: roots[owners[tid]] if tid in owners else header for tid in trace_ids}

    def set_tag(self, principal: Principal, trace_id: str, key: str, value: str) -> None:
        self._reach(principal, trace_id, Role.MEMBER)
        tags = checked_pairs("tag", {key: value})

        def work(s: Session) -> None:
            _store.set_tags(s, trace_id, tags)
            if _store.count_tags(s, trace_id) > MAX_TAGS:
                raise InvalidParameter(f"A trace may have at most {MAX_TAGS} tags.")

        self._db.run(work)

    def delete_tag(self, principal: Principal, trace_id: str, key: str) -> None:
        self._reach(principal, trace_id, Role.MEMBER)
        self._db.run(lambda s: _store.delete_tag(s, trace_id, key))

    def delete(
        self,
        ctx: AuditContext,
        experiment_id: str,
        *,
        max_timestamp_millis: int | None = None,
        max_traces: int | None = None,
        trace_ids: Sequence[str] = (),
    ) -> int:
        """Delete an experiment's traces: those named, or those that started at or before
        ``max_timestamp_millis`` (the oldest ``max_traces`` of them when given), as a
        stock server's ``delete-traces``. Maintainers of the experiment's team only.

        Returns:
            How many traces were deleted.
        """
        if max_timestamp_millis is None and not trace_ids:
            raise InvalidParameter(
                "Either `max_timestamp_millis` or `trace_ids` must be specified."
            )
        if max_timestamp_millis is not None and trace_ids:
            raise InvalidParameter(
                "Only one of `max_timestamp_millis` and `trace_ids` can be specified."
            )
        if trace_ids and max_traces is not None:
            raise InvalidParameter("`max_traces` can't be specified if `trace_ids` is specified.")
        if max_traces is not None and max_traces <= 0:
            raise InvalidParameter("`max_traces` must be a positive integer.")
        if len(trace_ids) > MAX_BATCH_TRACES:
            raise InvalidParameter(f"Delete at most {MAX_BATCH_TRACES} traces by id at a time.")
        exp = self._runs.experiment(ctx.require_principal(), experiment_id, Role.MAINTAINER)
        ctx.target = f"experiment:{exp.experiment_id}"

        def work(s: Session) -> int:
            deleted = _store.delete_traces(
                s,
                int(exp.experiment_id),
                max_timestamp_millis=max_timestamp_millis,
                max_traces=max_traces,
                trace_ids=list(trace_ids),
            )
            self._audit.record(s, ctx, ctx.target, traces_deleted=str(deleted))
            return deleted

        return self._db.run(work)

    def link_to_run(self, principal: Principal, trace_ids: Sequence[str], run_id: str) -> None:
        """Link traces to a run of the same experiment, so that ``run_id`` searches find
        them. A member of the run's experiment only; every trace must be readable."""
        if len(trace_ids) > MAX_LINKED_TRACES:
            raise InvalidParameter(
                f"Cannot link more than {MAX_LINKED_TRACES} traces to a run in a single "
                f"request. Provided {len(trace_ids)} traces."
            )
        if not trace_ids:
            return
        self._runs.run_info(principal, run_id, Role.MEMBER)
        for trace_id in trace_ids:
            self._reach(principal, trace_id, Role.MEMBER)
        self._db.run(lambda s: _store.link_to_run(s, trace_ids, run_id))

    # ------------------------------------------------------------------ reading
    def info(self, principal: Principal, trace_id: str) -> TraceInfo:
        self._reach(principal, trace_id)
        with self._db.unit_of_work(write=False) as s:
            return _store.get_info(s, trace_id)

    def infos(
        self, principal: Principal, trace_ids: Sequence[str], experiment_ids: Sequence[str] = ()
    ) -> list[TraceInfo]:
        ids = self._visible_ids(principal, trace_ids, experiment_ids)
        with self._db.unit_of_work(write=False) as s:
            return _store.get_infos(s, ids)

    def trace(self, principal: Principal, trace_id: str, *, allow_partial: bool = False) -> Trace:
        """A trace with its spans.

        Raises:
            NotFound: no such trace (or a hidden one), or, unless ``allow_partial``, one
                whose spans have not all arrived (as its size stats count them).
        """
        self._reach(principal, trace_id)
        traces = self._load([trace_id], allow_partial=allow_partial)
        if not traces:
            raise NotFound(
                f"Trace with ID {trace_id} is not fully exported yet, please try again later."
            )
        return traces[0]

    def traces(
        self, principal: Principal, trace_ids: Sequence[str], experiment_ids: Sequence[str] = ()
    ) -> list[Trace]:
        """The complete traces of ``trace_ids`` the principal may read, in the order asked.

        Raises:
            InvalidParameter: more than ``MAX_BATCH_FULL_TRACES`` ids, or traces whose spans
                together pass ``MAX_BATCH_BYTES`` (ask for fewer at a time).
        """
        ids = self._visible_ids(principal, trace_ids, experiment_ids, MAX_BATCH_FULL_TRACES)
        with self._db.unit_of_work(write=False) as s:
            size = _store.span_bytes(s, ids)
        if size > MAX_BATCH_BYTES:
            raise InvalidParameter(
                f"These traces hold {size} bytes of spans, more than one answer carries "
                f"({MAX_BATCH_BYTES}); ask for fewer at a time."
            )
        return self._load(ids)

    def _load(self, trace_ids: Sequence[str], *, allow_partial: bool = False) -> list[Trace]:
        with self._db.unit_of_work(write=False) as s:
            infos = _store.get_infos(s, trace_ids)
            spans = _store.spans_of(s, [i.trace_id for i in infos])
        return [
            Trace(info, tuple(spans[info.trace_id]))
            for info in infos
            if allow_partial or len(spans[info.trace_id]) >= max(_expected_spans(info), 1)
        ]

    def correlation(
        self,
        principal: Principal,
        experiment_ids: Sequence[str],
        filter1: str,
        filter2: str,
        base_filter: str | None = None,
    ) -> Correlation:
        """How the traces matching ``filter1`` and ``filter2`` go together (NPMI), among
        those of the experiments the principal may read that match ``base_filter``."""
        base = parse_filter(base_filter, TRACES)
        first = base + parse_filter(filter1, TRACES)
        second = base + parse_filter(filter2, TRACES)
        ids = self._runs.searched_experiment_ids(principal, experiment_ids, unknown="skip")
        with self._db.unit_of_work(write=False) as s:
            return correlation(
                _store.count(s, ids, base),
                _store.count(s, ids, first),
                _store.count(s, ids, second),
                _store.count(s, ids, first + second),
            )

    def search(
        self,
        principal: Principal,
        experiment_ids: Sequence[str],
        *,
        filter_string: str | None = None,
        order_by: Sequence[str] = (),
        max_results: int | None = None,
        page_token: str | None = None,
    ) -> TracePage:
        """A page of the traces of the experiments the principal may read; experiments that
        do not exist or are hidden are skipped, as a stock server skips unknown ones. A page
        holds at most ``MAX_PAGE`` traces; the token of the next one is None at the end.
        """
        size = DEFAULT_SEARCH_RESULTS if max_results is None else max_results
        if not 0 < size <= MAX_SEARCH_RESULTS:
            raise InvalidParameter(
                f"Invalid value {size} for parameter 'max_results' supplied. It must be "
                f"a positive integer at most {MAX_SEARCH_RESULTS}"
            )
        clauses = parse_filter(filter_string, TRACES)
        order = parse_order_by(list(order_by), TRACES)
        offset = decode_page_token(page_token)
        ids = self._runs.searched_experiment_ids(principal, experiment_ids, unknown="skip")
        page = min(size, MAX_PAGE)
        with self._db.unit_of_work(write=False) as s:
            infos = _store.search(s, ids, clauses, order, offset, page)
        token = encode_page_token(offset + page) if len(infos) == page else None
        return TracePage(infos, token)
