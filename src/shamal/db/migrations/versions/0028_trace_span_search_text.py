"""trace spans: the text ``trace.text`` searches, as MLflow's span dict in JSON

Spans were searched in their OTLP protobuf JSON, whose own key names (``value``,
``string_value``, ``key``...) matched searches such as ``trace.text LIKE '%value%'``. A stock
MLflow server searches each span as MLflow's own span dict (``Span.to_dict``) in JSON. This
revision adds that text, ``search_text``, and fills it for every stored span from its OTLP
JSON, with the conversion as it stands at this revision (``shamal.mlflow._spans``, copied
here so that later changes to it do not change what this revision writes).

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-28
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | None = None
depends_on: str | None = None

#: Spans read and rewritten per statement while filling the column.
_BATCH = 500

_spans = sa.table(
    "trace_spans",
    sa.column("trace_id", sa.String()),
    sa.column("span_id", sa.String()),
    sa.column("content", sa.Text()),
    sa.column("search_text", sa.Text()),
)


def _plain(value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        return None
    kind, held = next(iter(value.items()))
    if kind == "int_value":
        return int(held)
    if kind == "array_value":
        return [_plain(v) for v in held.get("values", [])]
    if kind == "kvlist_value":
        return {kv.get("key"): _plain(kv.get("value")) for kv in held.get("values", [])}
    return held


def _search_text(content: str) -> str:
    """A stored span's OTLP JSON as MLflow's span dict in JSON; a span that does not read
    as JSON (none is stored so) keeps its text as it is."""
    try:
        span = json.loads(content)
    except ValueError:
        return content
    if not isinstance(span, dict):
        return content
    status = span.get("status", {})
    as_mlflow = {
        "trace_id": span.get("trace_id"),
        "span_id": span.get("span_id"),
        "parent_span_id": span.get("parent_span_id") or None,
        "name": span.get("name", ""),
        "start_time_unix_nano": int(span.get("start_time_unix_nano", 0)),
        "end_time_unix_nano": int(span.get("end_time_unix_nano", 0)) or None,
        "events": [
            {
                "name": event.get("name", ""),
                "time_unix_nano": int(event.get("time_unix_nano", 0)),
                "attributes": {
                    kv.get("key"): _plain(kv.get("value")) for kv in event.get("attributes", [])
                },
            }
            for event in span.get("events", [])
        ],
        "status": {
            "code": status.get("code", "STATUS_CODE_UNSET"),
            "message": status.get("message", ""),
        },
        "attributes": {
            kv.get("key"): json.dumps(_plain(kv.get("value")), ensure_ascii=False)
            for kv in span.get("attributes", [])
        },
        "links": [],
    }
    return json.dumps(as_mlflow, ensure_ascii=False)


def _fill(connection: sa.Connection) -> None:
    """Fill ``search_text`` for every span, a batch at a time in key order."""
    after = ("", "")
    while True:
        rows = connection.execute(
            sa.select(_spans.c.trace_id, _spans.c.span_id, _spans.c.content)
            .where(sa.tuple_(_spans.c.trace_id, _spans.c.span_id) > after)
            .order_by(_spans.c.trace_id, _spans.c.span_id)
            .limit(_BATCH)
        ).all()
        if not rows:
            return
        connection.execute(
            sa.update(_spans)
            .where(_spans.c.trace_id == sa.bindparam("t"), _spans.c.span_id == sa.bindparam("s"))
            .values(search_text=sa.bindparam("text")),
            [{"t": t, "s": s, "text": _search_text(content)} for t, s, content in rows],
        )
        after = (rows[-1][0], rows[-1][1])


def upgrade() -> None:
    with op.batch_alter_table("trace_spans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("search_text", sa.Text(), nullable=True))
    _fill(op.get_bind())
    with op.batch_alter_table("trace_spans", schema=None) as batch_op:
        batch_op.alter_column("search_text", existing_type=sa.Text(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("trace_spans", schema=None) as batch_op:
        batch_op.drop_column("search_text")
