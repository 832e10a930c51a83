"""The search grammar: exact ASTs of legal forms, 400 for everything else, caps enforced."""

from __future__ import annotations

import base64

import pytest

from shamal.errors import InvalidParameter
from shamal.tracking._filters import (
    EXPERIMENTS,
    LOGGED_MODELS,
    MAX_PAGE_OFFSET,
    MODEL_VERSIONS,
    REGISTERED_MODELS,
    RUNS,
    Comparison,
    Grammar,
    OrderBy,
    decode_page_token,
    encode_page_token,
    parse_filter,
    parse_order_by,
    parse_order_by_objects,
)

C = Comparison


@pytest.mark.parametrize(
    ("text", "grammar", "expected"),
    [
        ("params.`a` = 'b'", RUNS, [C("param", "a", "=", "b")]),
        ("tags.\"a\" = 'b'", RUNS, [C("tag", "a", "=", "b")]),
        ("name = 'it''s'", EXPERIMENTS, [C("attribute", "name", "=", "it's")]),
        ("name = 'it\\'s'", EXPERIMENTS, [C("attribute", "name", "=", "it's")]),
        ('name = "say ""hi"""', EXPERIMENTS, [C("attribute", "name", "=", 'say "hi"')]),
        ("name = 'a\\\\b'", EXPERIMENTS, [C("attribute", "name", "=", "a\\b")]),
        ("name LIKE '100\\%'", EXPERIMENTS, [C("attribute", "name", "LIKE", "100\\%")]),
        (
            "metrics.acc >= 0.9 AND params.lr = '0.01'",
            RUNS,
            [C("metric", "acc", ">=", 0.9), C("param", "lr", "=", "0.01")],
        ),
        (
            "attributes.run_id IN ('ab','cd')",
            RUNS,
            [C("attribute", "run_id", "IN", ("ab", "cd"))],
        ),
        (
            "run_id not in ( 'ab' , \"cd\", 'EF' )",
            RUNS,
            [C("attribute", "run_id", "NOT IN", ("ab", "cd"))],
        ),
        (
            "metric.x < -1.5e-3 and Metrics.y != 2E+5 AnD metrics.z > .5",
            RUNS,
            [C("metric", "x", "<", -0.0015), C("metric", "y", "!=", 200000.0)]
            + [C("metric", "z", ">", 0.5)],
        ),
        ("metrics.x = -7", RUNS, [C("metric", "x", "=", -7.0)]),
        ("metrics.`my metric-1.b` <= 1", RUNS, [C("metric", "my metric-1.b", "<=", 1.0)]),
        ("metrics.a.b > 0", RUNS, [C("metric", "a.b", ">", 0.0)]),
        ("parameter.p like 'x%'", RUNS, [C("param", "p", "LIKE", "x%")]),
        ("params.p ilike 'x%'", RUNS, [C("param", "p", "ILIKE", "x%")]),
        ('"run name" = "x"', RUNS, [C("attribute", "run_name", "=", "x")]),
        ("attributes.`Run Name` != 'x'", RUNS, [C("attribute", "run_name", "!=", "x")]),
        ("attr.created > 10", RUNS, [C("attribute", "start_time", ">", 10.0)]),
        ("run.end_time <= 5", RUNS, [C("attribute", "end_time", "<=", 5.0)]),
        ("Status = 'FINISHED'", RUNS, [C("attribute", "status", "=", "FINISHED")]),
        ("datasets.context IN ('train')", RUNS, [C("dataset", "context", "IN", ("train",))]),
        ("dataset.digest = 'd'", RUNS, [C("dataset", "digest", "=", "d")]),
        ("\t name = 'x'\n", EXPERIMENTS, [C("attribute", "name", "=", "x")]),
        ("creation_time >= 1", EXPERIMENTS, [C("attribute", "creation_time", ">=", 1.0)]),
        ("tags.k != ''", EXPERIMENTS, [C("tag", "k", "!=", "")]),
        ("name ILIKE '%m%'", REGISTERED_MODELS, [C("attribute", "name", "ILIKE", "%m%")]),
        (
            "version_number IN (1, '2', 3.0)",
            MODEL_VERSIONS,
            [C("attribute", "version_number", "IN", ("1", "2", "3"))],
        ),
        ("version_number > 2", MODEL_VERSIONS, [C("attribute", "version_number", ">", 2.0)]),
        (
            "run_id IN ('ab', 'AB')",
            MODEL_VERSIONS,
            [C("attribute", "run_id", "IN", ("ab",))],
        ),
        ("source_path LIKE 'm%'", MODEL_VERSIONS, [C("attribute", "source_path", "LIKE", "m%")]),
        (
            "creation_time > 5 AND metrics.a < 1",
            LOGGED_MODELS,
            [C("attribute", "creation_timestamp", ">", 5.0), C("metric", "a", "<", 1.0)],
        ),
        ("experiment_id = '06'", LOGGED_MODELS, [C("attribute", "experiment_id", "=", "6")]),
        ("experiment_id != 6", LOGGED_MODELS, [C("attribute", "experiment_id", "!=", "6")]),
        ("experiment_id = 'x'", LOGGED_MODELS, [C("attribute", "experiment_id", "=", "x")]),
        ("tags.experiment_id IN ('01')", LOGGED_MODELS, [C("tag", "experiment_id", "IN", ("01",))]),
        ("tags.experiment_id = '01'", LOGGED_MODELS, [C("tag", "experiment_id", "=", "01")]),
        ("experiment_id LIKE '0%'", LOGGED_MODELS, [C("attribute", "experiment_id", "LIKE", "0%")]),
        (
            "attributes.experiment_id IN ('01', 2)",
            LOGGED_MODELS,
            [C("attribute", "experiment_id", "IN", ("1", "2"))],
        ),
        (
            "lifecycle_stage ILIKE 'ACT%'",
            LOGGED_MODELS,
            [C("attribute", "lifecycle_stage", "ILIKE", "ACT%")],
        ),
        ("tags.t IS NULL", RUNS, [C("tag", "t", "IS NULL", ())]),
        (
            "params.`a b` is  not\tnull AND tags.t = 'x'",
            RUNS,
            [C("param", "a b", "IS NOT NULL", ()), C("tag", "t", "=", "x")],
        ),
        ("tags.t IS NOT NULL", EXPERIMENTS, [C("tag", "t", "IS NOT NULL", ())]),
        ("experiment_id = '007'", EXPERIMENTS, [C("attribute", "experiment_id", "=", "7")]),
        (
            "attribute.experiment_id NOT IN ('1', \"2\")",
            EXPERIMENTS,
            [C("attribute", "experiment_id", "NOT IN", ("1", "2"))],
        ),
        (None, RUNS, []),
        ("", RUNS, []),
        (" \t\r\n ", RUNS, []),
    ],
)
def test_legal_filters_parse_to_exact_asts(
    text: str | None, grammar: Grammar, expected: list[Comparison]
) -> None:
    assert parse_filter(text, grammar) == expected


HOSTILE_FILTERS = [
    "name = 'x' OR 1=1",
    "name = 'x' OR '1'='1'",
    "name = 'x'; DROP TABLE runs; --",
    "metrics.acc > 0 UNION SELECT password FROM users",
    "name = \u2018x\u2019",
    "name = \u201cx\u201d",
    "LIKE '%%%%%%%%'",
    "run_id IN (" + ", ".join(f"'{i:032x}'" for i in range(10_000)) + ")",
    "(" * 5000 + "name = 'x'" + ")" * 5000,
    " AND ".join(["name = 'x'"] * 2001),
    "metrics.\x00 = 1",
    "name",
    "= = =",
    "name = 'x' --",
    "name = 'x' /* c */",
    "(name = 'x')",
    "NOT name = 'x'",
    "name = 'x' AND",
    "AND name = 'x'",
    "name = 'x' AND AND name = 'y'",
    "name = 'unterminated",
    "name = x",
    "name = ?",
    "name = :p",
    "name = 1",
    "name == 'x'",
    "name <> 'x'",
    "name IN ('a')",
    "name NOT LIKE 'x'",
    "name IS NULL",
    "name = 'x' name = 'y'",
    "name = ('a', 'b')",
    "creation_time > '5'",
    "creation_time > 1e999",
    "creation_time > 1x",
    "creation_time > 0x10",
    "creation_time > 1.2.3",
    "creation_time > - 1",
    "creation_time > NaN",
    "creation_time > inf",
    "tags.`a\x00b` = 'x'",
    "tags.`a\nb` = 'x'",
    "tags.\"\" = 'x'",
    "tags.`" + "k" * 251 + "` = 'x'",
    "tags.a = '\x00'",
    "tags.a = '\ud800'",
    "tags. a = 'x'",
    "tags.a. = 'x'",
    "tags..a = 'x'",
    "tag = 'x'",
    "metrics.m > 1",
    "users.password = 'x'",
    "experiment_id = 1",
    "experiment_id = 'x'",
    "experiment_id = '-1'",
    "experiment_id = '1.5'",
    "experiment_id = '" + "9" * 19 + "'",
    "experiment_id = '\uff11'",
    "experiment_id > '1'",
    "experiment_id LIKE '1%'",
    "experiment_id IN (1)",
    "experiment_id IN ('1', 'x')",
    "experiment_id IS NULL",
    "tags.t IS 'x'",
    "tags.t IS NOT 'x'",
    "tags.t IS",
    "tags.t IS NOT",
    "tags.t ISNULL",
    "tags.t IS NULLS",
    "tags.t IS NULL 'x'",
    "tags.t IS NOT NULL NULL",
    "tags.t = NULL",
    "lifecycle_stage = 'deleted'",
]


@pytest.mark.parametrize("text", HOSTILE_FILTERS, ids=range(len(HOSTILE_FILTERS)))
def test_hostile_and_malformed_filters_are_400(text: str) -> None:
    with pytest.raises(InvalidParameter) as caught:
        parse_filter(text, EXPERIMENTS)
    assert caught.value.status == 400
    assert caught.value.code == "INVALID_PARAMETER_VALUE"
    assert len(caught.value.message) < 200  # fixed, short: never an echo of the input


@pytest.mark.parametrize(
    "text",
    [
        "attributes.run_name = 'x' OR 1=1",
        "attributes.run_name = 'x'; DROP TABLE runs; --",
        "metrics.acc > 0 UNION SELECT password FROM users",
        "metrics.\x00 = 1",
        "metrics.acc = '1'",
        "metrics.acc LIKE 'x'",
        "params.p > 1",
        "params.p = 1",
        "params.p IN ('a')",
        "tags.t NOT IN ('a')",
        "status IN ('a')",
        "run_id IN 'a'",
        "run_id IN ()",
        "run_id IN ('a',)",
        "run_id IN (1, 2)",
        "run_id = ('a')",
        "start_time LIKE '1'",
        "start_time = '1'",
        "start_time IN (1)",
        "datasets.schema = 'x'",
        "datasets.name > 'x'",
        "foo.bar = 'x'",
        "name = 'x'",
        "run_name = 'x' OR run_name = 'y'",
        "metrics.m IS NULL",
        "metrics.m IS NOT NULL",
        "run_name IS NULL",
        "end_time IS NOT NULL",
        "datasets.name IS NULL",
        "experiment_id = '1'",
    ],
)
def test_runs_grammar_whitelist(text: str) -> None:
    with pytest.raises(InvalidParameter):
        parse_filter(text, RUNS)


@pytest.mark.parametrize(
    ("grammar", "text"),
    [
        (REGISTERED_MODELS, "version_number = 1"),
        (REGISTERED_MODELS, "metrics.a > 1"),
        (REGISTERED_MODELS, "name IN (1)"),
        (MODEL_VERSIONS, "version_number = 'x'"),
        (MODEL_VERSIONS, "version_number = '1.5'"),
        (MODEL_VERSIONS, "run_id > 'a'"),
        (MODEL_VERSIONS, "version_number IN ('x')"),
        (MODEL_VERSIONS, "version_number IN (1.5)"),
        (MODEL_VERSIONS, "version_number NOT IN (1)"),
        (MODEL_VERSIONS, "params.a = 'x'"),
        (EXPERIMENTS, "params.a = 'x'"),
        (LOGGED_MODELS, "datasets.name = 'x'"),
        (LOGGED_MODELS, "tags.t IS NULL"),
        (REGISTERED_MODELS, "tags.t IS NULL"),
        (MODEL_VERSIONS, "tags.t IS NOT NULL"),
        (LOGGED_MODELS, "creation_timestamp = 'x'"),
        (LOGGED_MODELS, "experiment_id > '1'"),
        (LOGGED_MODELS, "experiment_id LIKE 1"),
        (LOGGED_MODELS, "experiment_id IS NULL"),
        (LOGGED_MODELS, "lifecycle_stage > 'a'"),
        (LOGGED_MODELS, "lifecycle_stage = 1"),
    ],
)
def test_other_grammars_whitelist(grammar: Grammar, text: str) -> None:
    with pytest.raises(InvalidParameter):
        parse_filter(text, grammar)


def test_backslash_escaped_quote_keeps_an_injection_inside_one_literal() -> None:
    """The one item of the hostile catalogue that is legal: a single bound string."""
    text = "name = 'x\\' OR 1=1 --'"
    assert parse_filter(text, EXPERIMENTS) == [C("attribute", "name", "=", "x' OR 1=1 --")]


def test_caps_accept_the_limit_and_refuse_one_more() -> None:
    clauses = ["tags.t = 'x'"] * 100
    assert len(parse_filter(" AND ".join(clauses), EXPERIMENTS)) == 100
    with pytest.raises(InvalidParameter):
        parse_filter(" AND ".join([*clauses, "tags.t = 'x'"]), EXPERIMENTS)

    ids = [f"'{i:x}'" for i in range(1000)]
    (parsed,) = parse_filter(f"run_id IN ({','.join(ids)})", RUNS)
    assert isinstance(parsed.value, tuple)
    assert len(parsed.value) == 1000
    with pytest.raises(InvalidParameter):
        parse_filter("run_id IN (" + ",".join([*ids, "'f'"]) + ")", RUNS)

    assert parse_filter(f"tags.t = '{'v' * 6000}'", EXPERIMENTS)[0].value == "v" * 6000
    with pytest.raises(InvalidParameter):
        parse_filter(f"tags.t = '{'v' * 6001}'", EXPERIMENTS)

    assert parse_filter(f"tags.`{'k' * 250}` = 'x'", EXPERIMENTS)[0].key == "k" * 250
    with pytest.raises(InvalidParameter):
        parse_filter(f"tags.`{'k' * 251}` = 'x'", EXPERIMENTS)
    with pytest.raises(InvalidParameter):
        parse_filter(f"tags.{'k' * 251} = 'x'", EXPERIMENTS)

    padded = "name = 'x'" + " " * (20_000 - len("name = 'x'"))
    assert len(parse_filter(padded, EXPERIMENTS)) == 1
    with pytest.raises(InvalidParameter):
        parse_filter(padded + " ", EXPERIMENTS)


def test_error_messages_never_echo_the_input() -> None:
    secret = "s3cr3t-" + "z" * 50
    for text in (f"name = '{secret}' OR 1=1", f"{secret} = 'x'", f"name = {secret}"):
        with pytest.raises(InvalidParameter) as caught:
            parse_filter(text, EXPERIMENTS)
        assert secret not in caught.value.message
        assert "s3cr3t" not in caught.value.message


@pytest.mark.parametrize(
    ("items", "grammar", "expected"),
    [
        (None, RUNS, []),
        ([], RUNS, []),
        (["metrics.`x` DESC"], RUNS, [OrderBy("metric", "x", ascending=False)]),
        (["params.lr"], RUNS, [OrderBy("param", "lr", ascending=True)]),
        (['tags."a b" asc'], RUNS, [OrderBy("tag", "a b", ascending=True)]),
        (
            ['attributes."run name" DESC', "created", "start_time desc"],
            RUNS,
            [
                OrderBy("attribute", "run_name", ascending=False),
                OrderBy("attribute", "start_time", ascending=True),
                OrderBy("attribute", "start_time", ascending=False),
            ],
        ),
        (["  run_id  "], RUNS, [OrderBy("attribute", "run_id", ascending=True)]),
        (["experiment_id DESC"], EXPERIMENTS, [OrderBy("attribute", "experiment_id", False)]),
        (["timestamp"], REGISTERED_MODELS, [OrderBy("attribute", "last_updated_timestamp", True)]),
        (["version_number"], MODEL_VERSIONS, [OrderBy("attribute", "version_number", True)]),
        (["creation_time"], LOGGED_MODELS, [OrderBy("attribute", "creation_timestamp", True)]),
    ],
)
def test_order_by_parses(
    items: list[str] | None, grammar: Grammar, expected: list[OrderBy]
) -> None:
    assert parse_order_by(items, grammar) == expected


HOSTILE_ORDER_BY = [
    "name; DROP TABLE runs",
    "name DESC, (SELECT 1)",
    "1",
    "name ASC NULLS FIRST --",
    "metrics.`x` DESC; --",
    "CASE WHEN 1=1 THEN name END",
    "",
    "   ",
    "name DESC DESC",
    "name ASCENDING",
    "name, experiment_id",
    "name DESC --",
    "(name)",
    "tags.a",
    "lower(name)",
    "name\x00",
    "`name\x00`",
    "name " + "x" * 1000,
]


@pytest.mark.parametrize("item", HOSTILE_ORDER_BY, ids=range(len(HOSTILE_ORDER_BY)))
def test_hostile_order_by_is_400(item: str) -> None:
    with pytest.raises(InvalidParameter):
        parse_order_by([item], EXPERIMENTS)


def test_order_by_caps_and_whitelists() -> None:
    assert len(parse_order_by(["name"] * 20, EXPERIMENTS)) == 20
    with pytest.raises(InvalidParameter):
        parse_order_by(["name"] * 21, EXPERIMENTS)
    for item in ("datasets.name", "metrics.x", "tags.a", "end_time", "run_id"):
        with pytest.raises(InvalidParameter):
            parse_order_by([item], EXPERIMENTS)
    with pytest.raises(InvalidParameter):
        parse_order_by(["version_number"], REGISTERED_MODELS)
    with pytest.raises(InvalidParameter):
        parse_order_by(["run_name"], MODEL_VERSIONS)
    with pytest.raises(InvalidParameter):
        parse_order_by("name", EXPERIMENTS)  # a bare string is not a list of items


def test_order_by_objects_parse() -> None:
    """The logged-model search's form: one key per object, metrics may name a dataset."""
    items: list[object] = [
        {"field_name": "metrics.acc", "ascending": False, "dataset_name": "eval"},
        {"field_name": "metrics.`a b`", "dataset_name": "", "dataset_digest": "d1"},
        {"field_name": "creation_time"},
        {"field_name": "name", "ascending": True, "dataset_name": "ignored"},
    ]
    assert parse_order_by_objects(items, LOGGED_MODELS) == [
        OrderBy("metric", "acc", False, dataset_name="eval"),
        OrderBy("metric", "a b", True, dataset_digest="d1"),
        OrderBy("attribute", "creation_timestamp", True),
        OrderBy("attribute", "name", True),
    ]
    assert parse_order_by_objects(None, LOGGED_MODELS) == []
    assert parse_order_by_objects([], LOGGED_MODELS) == []


@pytest.mark.parametrize(
    "item",
    [
        "metrics.acc DESC",
        ["metrics.acc"],
        {},
        {"ascending": False},
        {"field_name": ""},
        {"field_name": 5},
        {"field_name": "metrics.acc DESC"},
        {"field_name": "metrics.acc; DROP TABLE metrics"},
        {"field_name": "params.alpha"},
        {"field_name": "tags.t"},
        {"field_name": "datasets.name"},
        {"field_name": "no_such_attribute"},
        {"field_name": "metrics.acc", "ascending": "false"},
        {"field_name": "metrics.acc", "ascending": 0},
        {"field_name": "metrics.acc", "dataset_name": 5},
        {"field_name": "metrics.acc", "dataset_name": "x" * 501},
        {"field_name": "metrics.acc", "dataset_digest": "a\x00b"},
        {"field_name": "m" * 1001},
    ],
)
def test_hostile_order_by_objects_are_400(item: object) -> None:
    with pytest.raises(InvalidParameter) as caught:
        parse_order_by_objects([item], LOGGED_MODELS)
    assert len(caught.value.message) < 200


def test_order_by_objects_caps() -> None:
    item = {"field_name": "metrics.acc"}
    assert len(parse_order_by_objects([item] * 20, LOGGED_MODELS)) == 20
    for bad in ([item] * 21, item, "metrics.acc"):
        with pytest.raises(InvalidParameter):
            parse_order_by_objects(bad, LOGGED_MODELS)  # type: ignore[arg-type]


def test_page_tokens_round_trip_and_refuse_garbage() -> None:
    for offset in (0, 1, 25, 50_000, MAX_PAGE_OFFSET):
        assert decode_page_token(encode_page_token(offset)) == offset
    assert decode_page_token(None) == 0
    assert decode_page_token("") == 0
    token = encode_page_token(1000)
    assert "1000" not in token  # opaque

    def forged(body: str) -> str:
        return base64.urlsafe_b64encode(body.encode()).decode()

    for bad in (
        "garbage",
        "!!!!",
        "e30=",  # {}
        forged('{"offset": -1}'),
        forged('{"offset": 1e3}'),
        forged('{"offset": "5"}'),
        forged('{"offset": true}'),
        forged('{"offset": 99999999999999999999}'),
        forged('{"offset": 1, "x": 2}'),
        forged("[1]"),
        forged("\xff"),
        "A" * 10_000,
        token + "\x00",
    ):
        with pytest.raises(InvalidParameter):
            decode_page_token(bad)
