"""SQL access for traces: infos, tags, metadata, spans, run links. ORM rows never leave
this module."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, defer

from shamal.db.models import (
    TraceMetadataRow,
    TraceRow,
    TraceRunLinkRow,
    TraceSpanRow,
    TraceTagRow,
)
from shamal.errors import InvalidParameter, NotFound
from shamal.traces._entities import (
    ARTIFACT_LOCATION_TAG,
    SPANS_IN_TRACKING_STORE,
    SPANS_LOCATION_TAG,
    TRACE_NAME_TAG,
    Span,
    TraceInfo,
)
from shamal.traces._search import condition, ordering
from shamal.tracking import Comparison, OrderBy

#: How long a request or response preview may be, as a stock server cuts them.
MAX_PREVIEW = 1000


@dataclass(frozen=True, slots=True)
class SpanLimits:
    """What one trace may hold: spans, and UTF-8 bytes of their JSON."""

    spans: int
    bytes: int


#: Rows per multi-row INSERT: SQLite binds at most 32,766 values in one statement.
_ROWS_PER_INSERT = 500


def not_found(trace_id: str) -> NotFound:
    """A stock server's words for a trace that does not exist (or that the caller may not
    see, which reads the same)."""
    return NotFound(f"Trace with ID '{trace_id[:64]}' not found.")


def _upsert(s: Session, table: Any, values: list[dict[str, Any]], keys: Sequence[str]) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE the other columns, on either backend."""
    if not values:
        return
    dialect = s.get_bind().dialect.name
    insert = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    columns = [c for c in values[0] if c not in keys]
    for start in range(0, len(values), _ROWS_PER_INSERT):
        statement = insert.values(values[start : start + _ROWS_PER_INSERT])
        statement = statement.on_conflict_do_update(
            index_elements=list(keys), set_={c: statement.excluded[c] for c in columns}
        )
        s.execute(statement)


def _pairs(trace_id: str, items: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"trace_id": trace_id, "key": k, "value": v} for k, v in items.items()]


# ---------------------------------------------------------------------- reading
def experiment_of(s: Session, trace_id: str) -> int | None:
    """The experiment a trace belongs to, or None when there is no such trace."""
    return s.scalar(select(TraceRow.experiment_id).where(TraceRow.trace_id == trace_id))


def experiments_of(s: Session, trace_ids: Sequence[str]) -> dict[str, int]:
    """trace id -> experiment, for the traces of ``trace_ids`` that exist."""
    rows = s.execute(
        select(TraceRow.trace_id, TraceRow.experiment_id).where(
            TraceRow.trace_id.in_(list(trace_ids))
        )
    )
    return {str(trace_id): int(experiment_id) for trace_id, experiment_id in rows}


def _keyed_values(s: Session, table: Any, trace_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = defaultdict(dict)
    if trace_ids:
        rows = s.execute(
            select(table.trace_id, table.key, table.value).where(
                table.trace_id.in_(list(trace_ids))
            )
        )
        for trace_id, key, value in rows:
            found[trace_id][key] = value
    return found


def _infos(s: Session, rows: Sequence[TraceRow]) -> list[TraceInfo]:
    ids = [r.trace_id for r in rows]
    tags = _keyed_values(s, TraceTagRow, ids)
    metadata = _keyed_values(s, TraceMetadataRow, ids)
    return [
        TraceInfo(
            trace_id=r.trace_id,
            experiment_id=str(r.experiment_id),
            request_time=r.request_time,
            state=r.state,
            client_request_id=r.client_request_id,
            execution_duration=r.execution_duration,
            request_preview=r.request_preview,
            response_preview=r.response_preview,
            metadata=metadata[r.trace_id],
            tags=tags[r.trace_id],
        )
        for r in rows
    ]


def get_infos(s: Session, trace_ids: Sequence[str]) -> list[TraceInfo]:
    """The infos of the traces of ``trace_ids`` that exist, in the order asked."""
    rows = s.scalars(select(TraceRow).where(TraceRow.trace_id.in_(list(trace_ids)))).all()
    by_id = {info.trace_id: info for info in _infos(s, rows)}
    return [by_id[t] for t in dict.fromkeys(trace_ids) if t in by_id]


def get_info(s: Session, trace_id: str) -> TraceInfo:
    infos = get_infos(s, [trace_id])
    if not infos:
        raise not_found(trace_id)
    return infos[0]


def spans_of(s: Session, trace_ids: Sequence[str]) -> dict[str, list[Span]]:
    """Each trace's spans: its root first, then by start time."""
    spans: dict[str, list[Span]] = defaultdict(list)
    if not trace_ids:
        return spans
    rows = s.scalars(
        select(TraceSpanRow)
        .options(defer(TraceSpanRow.search_text))  # only searches read it
        .where(TraceSpanRow.trace_id.in_(list(trace_ids)))
        .order_by(
            TraceSpanRow.trace_id,
            TraceSpanRow.parent_span_id.is_not(None),
            TraceSpanRow.start_time_ns,
            TraceSpanRow.span_id,
        )
    )
    for r in rows:
        spans[r.trace_id].append(
            Span(
                trace_id=r.trace_id,
                span_id=r.span_id,
                parent_span_id=r.parent_span_id,
                name=r.name,
                span_type=r.span_type,
                status=r.status,
                start_time_ns=r.start_time_ns,
                end_time_ns=r.end_time_ns,
                content=r.content,
            )
        )
    return spans


def search(
    s: Session,
    experiment_ids: Sequence[int],
    clauses: Sequence[Comparison],
    order_by: Sequence[OrderBy],
    offset: int,
    limit: int,
) -> list[TraceInfo]:
    """A page of the traces of ``experiment_ids`` that satisfy every clause."""
    if not experiment_ids:
        return []
    query = (
        select(TraceRow)
        .where(TraceRow.experiment_id.in_(list(experiment_ids)))
        .where(*[condition(c) for c in clauses])
        .order_by(*ordering(order_by))
        .offset(offset)
        .limit(limit)
    )
    return _infos(s, s.scalars(query).all())


# ---------------------------------------------------------------------- writing
def _new_trace_tags(experiment_root: str, trace_id: str) -> dict[str, str]:
    """The tags a stock server gives every trace it stores: where its spans and its
    attachments are."""
    return {
        SPANS_LOCATION_TAG: SPANS_IN_TRACKING_STORE,
        ARTIFACT_LOCATION_TAG: f"{experiment_root}/traces/{trace_id}/artifacts",
    }


def _check_experiment(row: TraceRow, experiment_id: int) -> None:
    if row.experiment_id != experiment_id:
        # The id is the client's: a trace of another experiment keeps its own.
        raise InvalidParameter(
            f"Trace '{row.trace_id}' belongs to another experiment; its spans and info "
            "must be logged there."
        )


def save_info(s: Session, info: TraceInfo, experiment_root: str) -> TraceInfo:
    """Create the trace, or complete one its spans created: the info's fields replace the
    stored ones (previews only when given), its tags and metadata are added."""
    experiment_id = int(info.experiment_id)
    row = s.get(TraceRow, info.trace_id, with_for_update=True)
    if row is None:
        row = TraceRow(
            trace_id=info.trace_id, experiment_id=experiment_id, span_count=0, span_bytes=0
        )
        s.add(row)
    _check_experiment(row, experiment_id)
    row.request_time = info.request_time
    row.execution_duration = info.execution_duration
    row.state = info.state
    row.client_request_id = info.client_request_id
    if info.request_preview is not None:
        row.request_preview = info.request_preview[:MAX_PREVIEW]
    if info.response_preview is not None:
        row.response_preview = info.response_preview[:MAX_PREVIEW]
    s.flush()
    tags = {**info.tags, **_new_trace_tags(experiment_root, info.trace_id)}
    _upsert(s, TraceTagRow, _pairs(info.trace_id, tags), ("trace_id", "key"))
    _upsert(s, TraceMetadataRow, _pairs(info.trace_id, info.metadata), ("trace_id", "key"))
    return get_info(s, info.trace_id)


def end_trace(
    s: Session,
    trace_id: str,
    end_ms: int,
    state: str,
    metadata: Mapping[str, str],
    tags: Mapping[str, str],
) -> TraceInfo:
    """End a trace started by the legacy API: its duration and state, and more metadata
    and tags."""
    row = s.get(TraceRow, trace_id, with_for_update=True)
    if row is None:
        raise not_found(trace_id)
    row.execution_duration = max(0, end_ms - row.request_time)
    row.state = state
    s.flush()
    set_tags(s, trace_id, tags)
    _upsert(s, TraceMetadataRow, _pairs(trace_id, metadata), ("trace_id", "key"))
    return get_info(s, trace_id)


def count(s: Session, experiment_ids: Sequence[int], clauses: Sequence[Comparison]) -> int:
    """How many traces of ``experiment_ids`` satisfy every clause."""
    if not experiment_ids:
        return 0
    query = (
        select(func.count())
        .select_from(TraceRow)
        .where(TraceRow.experiment_id.in_(list(experiment_ids)))
        .where(*[condition(c) for c in clauses])
    )
    return s.scalar(query) or 0


def _preview(value: str | None) -> str | None:
    return None if value is None else value[:MAX_PREVIEW]


def _root_updates(row: TraceRow, root: Span) -> None:
    """What a root span says of its trace: how it ended (while the trace's own info has
    not said), its request and response (while no preview is set)."""
    if row.state in ("IN_PROGRESS", "STATE_UNSPECIFIED"):
        row.state = "ERROR" if root.status == "ERROR" else "OK"
    if row.request_preview is None:
        row.request_preview = _preview(root.inputs)
    if row.response_preview is None:
        row.response_preview = _preview(root.outputs)


def _span_values(span: Span) -> dict[str, Any]:
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "name": span.name,
        "span_type": span.span_type,
        "status": span.status,
        "start_time_ns": span.start_time_ns,
        "end_time_ns": span.end_time_ns,
        "size": len(span.content.encode()),
        "content": span.content,
        "search_text": span.content if span.search_text is None else span.search_text,
    }


def _trace_for_spans(
    s: Session, experiment_id: int, experiment_root: str, trace_id: str, start_ms: int
) -> TraceRow:
    """The trace's row, locked; created (in progress) when its spans come first."""
    row = s.get(TraceRow, trace_id, with_for_update=True)
    if row is None:
        row = TraceRow(
            trace_id=trace_id,
            experiment_id=experiment_id,
            request_time=start_ms,
            state="IN_PROGRESS",
            span_count=0,
            span_bytes=0,
        )
        s.add(row)
        s.flush()
        set_tags(s, trace_id, _new_trace_tags(experiment_root, trace_id))
    _check_experiment(row, experiment_id)
    return row


def _count_spans(
    s: Session, row: TraceRow, values: list[dict[str, Any]], limits: SpanLimits
) -> None:
    """Add the spans to the trace's count and size (a span sent again replaces its old
    size), refusing what would pass ``limits``."""
    replaced = dict(
        s.execute(
            select(TraceSpanRow.span_id, TraceSpanRow.size).where(
                TraceSpanRow.trace_id == row.trace_id,
                TraceSpanRow.span_id.in_([v["span_id"] for v in values]),
            )
        ).all()
    )
    row.span_count += len(values) - len(replaced)
    row.span_bytes += sum(v["size"] for v in values) - sum(replaced.values())
    if row.span_count > limits.spans:
        raise InvalidParameter(
            f"A trace may have at most {limits.spans} spans; this request would make it "
            f"{row.span_count}."
        )
    if row.span_bytes > limits.bytes:
        raise InvalidParameter(
            f"A trace's spans may take at most {limits.bytes} bytes; this request would make "
            f"them {row.span_bytes}."
        )


def log_spans(
    s: Session,
    experiment_id: int,
    experiment_root: str,
    trace_id: str,
    spans: Sequence[Span],
    limits: SpanLimits,
) -> None:
    """Store the spans of one trace (a span sent again replaces the stored one), creating
    the trace in ``experiment_id`` when it is new, and widen its time to theirs.

    Raises:
        InvalidParameter: the trace belongs to another experiment, or would pass ``limits``.
    """
    start_ms = min(span.start_time_ns for span in spans) // 1_000_000
    ends = [span.end_time_ns for span in spans if span.end_time_ns is not None]
    row = _trace_for_spans(s, experiment_id, experiment_root, trace_id, start_ms)
    stored_end = row.request_time + (row.execution_duration or 0)
    row.request_time = min(row.request_time, start_ms)
    if ends:
        row.execution_duration = max(max(ends) // 1_000_000, stored_end) - row.request_time
    roots = [span for span in spans if span.parent_span_id is None]
    if roots:
        _root_updates(row, roots[0])
        if s.get(TraceTagRow, (trace_id, TRACE_NAME_TAG)) is None:
            s.add(TraceTagRow(trace_id=trace_id, key=TRACE_NAME_TAG, value=roots[0].name[:8000]))
    values = [_span_values(span) for span in spans]
    _count_spans(s, row, values, limits)
    s.flush()
    _upsert(s, TraceSpanRow, values, ("trace_id", "span_id"))


def set_tags(s: Session, trace_id: str, tags: Mapping[str, str]) -> None:
    _upsert(s, TraceTagRow, _pairs(trace_id, tags), ("trace_id", "key"))


def delete_tag(s: Session, trace_id: str, key: str) -> None:
    """Raises NotFound when the trace has no such tag."""
    gone = s.execute(
        delete(TraceTagRow).where(TraceTagRow.trace_id == trace_id, TraceTagRow.key == key)
    )
    if not getattr(gone, "rowcount", 0):
        raise NotFound(f"No trace tag with key '{key[:250]}' for trace with ID '{trace_id}'")


def span_bytes(s: Session, trace_ids: Sequence[str]) -> int:
    """The size of the spans of these traces, together."""
    return (
        s.scalar(
            select(func.coalesce(func.sum(TraceRow.span_bytes), 0)).where(
                TraceRow.trace_id.in_(list(trace_ids))
            )
        )
        or 0
    )


def count_tags(s: Session, trace_id: str) -> int:
    return (
        s.scalar(
            select(func.count()).select_from(TraceTagRow).where(TraceTagRow.trace_id == trace_id)
        )
        or 0
    )


def delete_traces(
    s: Session,
    experiment_id: int,
    *,
    max_timestamp_millis: int | None,
    max_traces: int | None,
    trace_ids: Sequence[str],
) -> int:
    """Delete the experiment's traces named by ``trace_ids``, or those that started at or
    before ``max_timestamp_millis`` (the oldest ``max_traces`` of them when given)."""
    query = select(TraceRow.trace_id).where(TraceRow.experiment_id == experiment_id)
    if trace_ids:
        query = query.where(TraceRow.trace_id.in_(list(trace_ids)))
    if max_timestamp_millis is not None:
        query = query.where(TraceRow.request_time <= max_timestamp_millis)
    if max_traces is not None:
        query = query.order_by(TraceRow.request_time, TraceRow.trace_id).limit(max_traces)
    doomed = list(s.scalars(query))
    deleted = 0
    for start in range(0, len(doomed), 500):  # bounded IN lists
        batch = doomed[start : start + 500]
        gone = s.execute(delete(TraceRow).where(TraceRow.trace_id.in_(batch)))
        deleted += getattr(gone, "rowcount", 0) or 0
    return deleted


def link_to_run(s: Session, trace_ids: Iterable[str], run_id: str) -> None:
    values = [{"trace_id": t, "run_id": run_id} for t in dict.fromkeys(trace_ids)]
    if not values:
        return
    dialect = s.get_bind().dialect.name
    insert = (
        postgresql.insert(TraceRunLinkRow)
        if dialect == "postgresql"
        else sqlite.insert(TraceRunLinkRow)
    )
    s.execute(insert.values(values).on_conflict_do_nothing())
