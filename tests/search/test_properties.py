"""Property tests: any text either fails with a 400 or becomes plain data bound into SQL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from shamal.errors import InvalidParameter
from shamal.registry._search import model_versions_query, registered_models_query
from shamal.tracking._filters import (
    EXPERIMENTS,
    LOGGED_MODELS,
    MODEL_VERSIONS,
    REGISTERED_MODELS,
    RUNS,
    Comparison,
    Grammar,
    OrderBy,
    parse_filter,
    parse_order_by,
)
from shamal.tracking._search import (
    experiments_query,
    logged_models_query,
    runs_query,
)

Compiler = Callable[[list[Comparison], list[OrderBy]], Select[Any]]
COMPILERS: dict[str, tuple[Grammar, Compiler]] = {
    "runs": (RUNS, lambda f, o: runs_query([1, 2], f, o, "active")),
    "experiments": (EXPERIMENTS, lambda f, o: experiments_query(f, o, "all")),
    "logged_models": (LOGGED_MODELS, lambda f, o: logged_models_query([1], f, o)),
    "registered_models": (REGISTERED_MODELS, registered_models_query),
    "model_versions": (MODEL_VERSIONS, model_versions_query),
}
DIALECTS: tuple[Dialect, ...] = (sqlite.dialect(), postgresql.psycopg.dialect())

ALPHABET = "'\"`()=!<>,;-%_\\ .*?[]\t\nabcAB019éß\u2018\u2019\u201c"
FRAGMENTS = [
    "AND", "and", "OR", "or", "NOT", "IN", "NOT IN", "LIKE", "ILIKE", "IS", "NULL",
    "SELECT", "UNION SELECT password FROM users", "DROP TABLE runs", ";", "--", "/*", "*/",
    "1=1", "'1'='1'", "metrics.", "params.", "tags.", "attributes.", "datasets.", "run.",
    "metrics.acc", "params.lr", "tags.`a b`", 'tags."x"', "run_id", "run_name", "name",
    "start_time", "created", "version_number", "source_path", "datasets.context",
    "'", '"', "`", "(", ")", ",", "=", "!=", ">=", "<=", ">", "<", "0.5", "-1e3", "7",
    "'x'", "('a', 'b')", "''", "\\'", "%", "_",
]  # fmt: skip
RANDOM_TEXT = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet=ALPHABET, max_size=6)),
    max_size=14,
).map(" ".join)

HOSTILE = st.one_of(
    st.text(alphabet=ALPHABET, min_size=0, max_size=24),
    st.sampled_from(
        ["x' OR 1=1 --", "'; DROP TABLE runs; --", "\\' OR '1'='1", "%%%%%%%%", "a*b?[c"]
    ),
)
KEY = st.text(alphabet=ALPHABET.replace("\t", "").replace("\n", ""), min_size=1, max_size=12)


def _quote(text: str, quote: str) -> str:
    return quote + text.replace("\\", "\\\\").replace(quote, quote * 2) + quote


@st.composite
def _clause(draw: st.DrawFn, grammar_name: str) -> str:
    """One clause the grammar allows, carrying hostile keys and values."""
    key = _quote(draw(KEY), draw(st.sampled_from(["`", '"'])))
    value = _quote(draw(HOSTILE), draw(st.sampled_from(["'", '"'])))
    items = ", ".join(_quote(v, "'") for v in draw(st.lists(HOSTILE, min_size=1, max_size=4)))
    number = draw(st.floats(allow_nan=False, allow_infinity=False, width=32))
    string_op = draw(st.sampled_from(["=", "!=", "LIKE", "ILIKE", "like", "ilike"]))
    numeric_op = draw(st.sampled_from(["=", "!=", ">", ">=", "<", "<="]))
    tag = f"{draw(st.sampled_from(['tags', 'tag']))}.{key} {string_op} {value}"
    has_key = f"{draw(st.sampled_from(['tags', 'params']))}.{key} " + draw(
        st.sampled_from(["IS NULL", "IS NOT NULL", "is not null"])
    )
    experiment_ids = ", ".join(
        f"'{n}'" for n in draw(st.lists(st.integers(0, 10**18 - 1), min_size=1, max_size=3))
    )
    name = f"name {string_op} {value}"
    metric = f"metrics.{key} {numeric_op} {number!r}"
    param = f"params.{key} {string_op} {value}"
    templates = {
        "runs": [
            tag,
            metric,
            param,
            f"attributes.run_id {draw(st.sampled_from(['IN', 'NOT IN']))} ({items})",
            f"datasets.{draw(st.sampled_from(['name', 'digest', 'context']))} {string_op} {value}",
            f"datasets.context IN ({items})",
            f"run_name {string_op} {value}",
            f"start_time {numeric_op} {number!r}",
            has_key,
        ],
        "experiments": [
            tag,
            name,
            f"creation_time {numeric_op} {number!r}",
            f"tags.{key} IS NOT NULL",
            f"experiment_id {draw(st.sampled_from(['=', '!=']))} '{draw(st.integers(0, 99))}'",
            f"experiment_id {draw(st.sampled_from(['IN', 'NOT IN']))} ({experiment_ids})",
        ],
        "logged_models": [tag, metric, param, name],
        "registered_models": [tag, name],
        "model_versions": [
            tag,
            name,
            f"source_path {string_op} {value}",
            f"run_id IN ({items})",
            f"version_number IN ({draw(st.integers(0, 99))}, '{draw(st.integers(0, 99))}')",
        ],
    }
    return draw(st.sampled_from(templates[grammar_name]))


FILTERS = {
    name: st.one_of(RANDOM_TEXT, st.lists(_clause(name), min_size=1, max_size=5).map(" AND ".join))
    for name in COMPILERS
}
ORDER_BY = st.lists(
    st.one_of(
        st.builds(lambda k, d: f"metrics.{_quote(k, '`')} {d}", KEY, st.sampled_from(["", "DESC"])),
        st.builds(lambda k: f"params.{_quote(k, '`')}", KEY),
        st.sampled_from(["name", "start_time DESC", "version_number", "creation_timestamp"]),
        RANDOM_TEXT,
    ),
    max_size=3,
)


def _placeholders(filters: list[Comparison], order_by: list[OrderBy]) -> tuple[Any, Any]:
    """The same search with every user-supplied key and value replaced by a fixed one."""

    def neutral(c: Comparison) -> Comparison:
        key = "k" if c.entity in ("metric", "param", "tag") else c.key
        if isinstance(c.value, tuple):
            return replace(c, key=key, value=tuple("1" for _ in c.value))
        if isinstance(c.value, float):
            return replace(c, key=key, value=0.0)
        return replace(c, key=key, value="1" if c.key == "experiment_id" else "v")

    def neutral_order(o: OrderBy) -> OrderBy:
        return replace(o, key="k") if o.entity != "attribute" else o

    return [neutral(c) for c in filters], [neutral_order(o) for o in order_by]


def _user_strings(filters: list[Comparison], order_by: list[OrderBy]) -> list[str]:
    out: list[str] = [o.key for o in order_by if o.entity != "attribute"]
    for c in filters:
        if c.entity != "attribute":
            out.append(c.key)
        out.extend(c.value if isinstance(c.value, tuple) else [str(c.value)])
    return out


def _assert_plain_data(filters: list[Comparison]) -> None:
    for c in filters:
        assert type(c) is Comparison
        assert c.entity in ("metric", "param", "tag", "attribute", "dataset")
        assert c.op in (
            "=", "!=", ">", ">=", "<", "<=", "LIKE", "ILIKE", "IN", "NOT IN", "IS NULL",
            "IS NOT NULL",
        )  # fmt: skip
        assert type(c.key) is str
        if c.op in ("IS NULL", "IS NOT NULL"):
            assert c.value == ()
        elif isinstance(c.value, tuple):
            assert c.op in ("IN", "NOT IN")
            assert all(type(v) is str for v in c.value)
        else:
            assert type(c.value) in (str, float)


@settings(
    max_examples=1000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(grammar_name=st.sampled_from(sorted(COMPILERS)), data=st.data(), order_items=ORDER_BY)
def test_any_text_is_a_400_or_bound_plain_data(
    grammar_name: str, data: st.DataObject, order_items: list[str]
) -> None:
    grammar, compile_query = COMPILERS[grammar_name]
    text = data.draw(FILTERS[grammar_name], label="filter")
    try:
        filters = parse_filter(text, grammar)
    except InvalidParameter:
        filters = []
    try:
        order_by = parse_order_by(order_items, grammar)
    except InvalidParameter:
        order_by = []
    event(f"filter clauses parsed: {min(len(filters), 2)}+")
    _assert_plain_data(filters)
    neutral_filters, neutral_order = _placeholders(filters, order_by)
    for dialect in DIALECTS:
        sql = str(compile_query(filters, order_by).compile(dialect=dialect))
        neutral_sql = str(compile_query(neutral_filters, neutral_order).compile(dialect=dialect))
        # The SQL text depends on the shape of the search only, never on its values...
        assert sql == neutral_sql
        # ...so no user text is in it, except by coincidence with the schema's own words.
        for value in _user_strings(filters, order_by):
            assert value not in sql or value in neutral_sql
            if len(value) >= 3 and any(ch in value for ch in "'\";"):
                assert value not in sql
