"""The gate's rule language: what it reads, what it explains, the first promotion without a
champion, hostile text refused at parse time, and arithmetic that agrees with Python's; the
JUnit XML of a report, read back with ElementTree."""

from __future__ import annotations

import math
import operator
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shamal.errors import InvalidParameter
from shamal.pipelines import GateReport, Rule, RuleResult, junit_xml, parse_rules

CONTEXT: dict[str, Any] = {
    "version": 4,
    "metrics": {"f1": 0.91, "auc": 0.88, "val/loss": 0.2, "nan": math.nan},
    "params": {"lr": "0.01", "optimizer": "adam", "it's": "x"},
    "tags": {"team": "churn"},
    "version_tags": {"stage": "candidate"},
    "data": {"validation": "passed", "failed_expectations": 0},
    "fidelity": {"max_abs_diff": 0.0004, "cosine": 0.9999},
    "champion": {"version": 3, "metrics": {"f1": 0.9, "auc": 0.9}},
}
NO_CHAMPION = {**CONTEXT, "champion": None}


def check(text: str, context: dict[str, Any] = CONTEXT) -> RuleResult:
    return Rule.parse(text).evaluate(context)


def test_the_example_rule_explains_itself() -> None:
    result = check("metrics.f1 >= champion.metrics.f1 - 0.01")
    assert result.passed
    assert result.explanation == "metrics.f1 = 0.91 >= champion.metrics.f1 - 0.01 = 0.89: passed"
    assert result.values == {"metrics.f1": 0.91, "champion.metrics.f1": 0.9}
    worse = check("metrics.auc >= champion.metrics.auc")
    assert not worse.passed
    assert worse.explanation == "metrics.auc = 0.88 >= champion.metrics.auc = 0.9: failed"


@pytest.mark.parametrize(
    ("text", "passed"),
    [
        ("data.validation == 'passed'", True),
        ("data.validation != 'passed'", False),
        ("data.failed_expectations == 0 and fidelity.max_abs_diff < 1e-3", True),
        ("fidelity.cosine > 0.999 or metrics.f1 > 0.99", True),
        ("not (metrics.f1 > 0.95)", True),
        ("not metrics.f1 > 0.95 and version > champion.version", True),
        ("abs(metrics.f1 - champion.metrics.f1) <= 0.02", True),
        ("min(metrics.f1, metrics.auc) >= 0.9", False),
        ("max(metrics.f1, metrics.auc, 0.5) == metrics.f1", True),
        ("number(params.lr) < 0.1", True),
        ("params.optimizer == 'adam'", True),
        ("params.`it''s` == 'x'", False),  # the backquoted name is it''s, not it's
        ("params.`it's` == 'x'", True),
        ("metrics.`val/loss` < 0.25", True),
        ("tags.team == 'churn' and version_tags.stage == 'candidate'", True),
        ("version == 4 and champion.version == 3", True),
        ("metrics.nan > 0 or metrics.nan <= 0", False),  # NaN compares false, as in Python
        ("true", True),
        ("false or 2 * 3 == 6", True),
        ("'a' < 'b'", True),
        ("1 == true", False),  # a boolean equals only a boolean
        ("data.validation != null", True),
    ],
)
def test_rules_over_the_context(text: str, passed: bool) -> None:
    assert check(text).passed is passed


def test_a_missing_name_fails_the_rule_and_says_which() -> None:
    result = check("metrics.precision >= 0.8")
    assert not result.passed
    assert "metrics.precision is missing" in result.explanation
    # Wherever it stands: `or` does not rescue a rule that reads a name the run never logged.
    assert not check("metrics.f1 > 0.5 or metrics.precision > 0.5").passed
    gone = {k: v for k, v in CONTEXT.items() if k != "data"}
    assert "data.validation is missing" in check("data.validation == 'passed'", gone).explanation


def test_without_a_champion_comparisons_against_it_pass_with_a_note() -> None:
    """A first promotion: no version at the target alias yet. Only comparisons that read a
    champion name are satisfied; the rest of the rule still counts."""
    result = check("metrics.f1 >= champion.metrics.f1 - 0.01", NO_CHAMPION)
    assert result.passed
    assert result.no_champion
    assert "no champion" in result.explanation
    assert result.values["champion.metrics.f1"] is None
    assert check("not (metrics.f1 < champion.metrics.f1)", NO_CHAMPION).passed
    assert check("metrics.f1 > champion.metrics.f1 and metrics.f1 > 0.9", NO_CHAMPION).passed
    assert not check("metrics.f1 > champion.metrics.f1 and metrics.f1 > 0.95", NO_CHAMPION).passed
    assert not check("metrics.precision > champion.metrics.f1", NO_CHAMPION).passed
    # With a champion that lacks the metric, the rule fails: only a missing champion is excused.
    assert not check("metrics.f1 > champion.metrics.precision").passed


def test_evaluation_failures_are_results_not_exceptions() -> None:
    assert check("metrics.f1 / 0 > 1").explanation == "division by zero: failed"
    assert not check("metrics.f1 / (champion.version - 3) > 1").passed
    typed = check("params.lr < 0.1")
    assert not typed.passed
    assert "number(params.x)" in typed.explanation
    assert not check("number(params.optimizer) > 0").passed
    assert not check("abs(params.lr) > 0").passed
    assert not check("metrics.f1 > 1", {"metrics": {"f1": [1, 2]}}).passed
    assert not check("metrics.f1 > 1", {"metrics": {"f1": {"a": 1}}}).passed
    assert not check("metrics.f1 > 1", {"metrics": "f1"}).passed


def test_canonical_text_keeps_the_meaning() -> None:
    for text in (
        "metrics.f1 - (metrics.auc - 1) > 0",
        "metrics.f1 / (2 * 3) > 0",
        "-(metrics.f1 + 1) < 0",
        "(metrics.f1 > 1 or true) and false",
        "not (true and false)",
        "metrics.`a b`.x == 1 or true",
    ):
        rule = Rule.parse(text)
        again = Rule.parse(rule.text)
        assert again.text == rule.text
        assert again.evaluate(CONTEXT).passed == rule.evaluate(CONTEXT).passed, text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "non-empty"),
        ("   ", "non-empty"),
        ("x" * 100_000, "longer than"),
        ("(" * 10_000 + "1" + ")" * 10_000 + " > 0", "longer than"),
        ("(" * 1000 + "true" + ")" * 1000, "nested more than"),
        ("-" * 2000 + "1 > 0", "nested more than"),
        ("not " * 500 + "true", "nested more than"),
        ("abs(" * 100 + "1" + ")" * 100 + " > 0", "nested more than"),
        ("__class__ > 1", "'__'"),
        ("metrics.__class__ > 1", "'__'"),
        ("metrics.`__globals__` > 1", "'__'"),
        ("eval('1') > 2", "unknown function"),
        ("__import__('os') == 1", "unknown function"),
        ("metrics.f1.__class__ == 1", "'__'"),
        ("os.system == 1", "unknown name"),
        ("champion.champion.f1 > 1", "unknown name"),
        ("metrics > 1", "a group"),
        ("version.x > 1", "no parts"),
        ("metrics.f1", "must compare"),
        ("1 + 2", "must compare"),
        ("1 < 2 < 3", "do not chain"),
        ("metrics.f1 > 'a' + 1", "takes numbers"),
        ("(1 > 0) + 1 > 0", "takes numbers"),
        ("1 and true", "takes conditions"),
        ("(1 > 0) == true", "a condition"),
        ("metrics.f1 >", "expected a value"),
        ("metrics.f1 > 0.9)", "expected an operator"),
        ("(metrics.f1 > 0.9", "expected ')'"),
        ("metrics.f1 >= 0.9; DROP TABLE runs", "unexpected character"),
        ("metrics.f1 > 0.9 # comment", "unexpected character"),
        ("metrics.f1 > 1e999", "out of range"),
        ("metrics.f1 > 1\x00", "control characters"),
        ("metrics.f1 > '\x1b[31m'", "control characters"),
        ("abs() > 1", "arguments"),
        ("abs(1, 2) > 1", "arguments"),
        ("max(" + ", ".join(["1"] * 40) + ") > 1", "arguments"),
        ("metrics.`` > 1", "backquoted"),
        ("metrics.'f1' > 1", "expected a name"),
        ("metrics." + ".".join(["a"] * 20) + " > 1", "at most"),
        ("and > 1", "expected a value"),
        ("'unterminated > 1", "unexpected character"),
        ("metrics.f1 > \u00b2", "unexpected character"),  # superscript two: not a digit here
        ("metrics.f1 > \u0661\u0662", "unexpected character"),  # Arabic-Indic digits
        ("metrics.f1 > \uff11", "unexpected character"),  # fullwidth one
    ],
)
def test_hostile_rules_are_refused_at_parse_time(text: str, says: str) -> None:
    start = time.perf_counter()
    with pytest.raises(InvalidParameter) as caught:
        Rule.parse(text)
    assert says in caught.value.message
    assert len(caught.value.message) < 300  # never the whole rule echoed back
    assert time.perf_counter() - start < 1.0


def test_a_gate_needs_rules_and_names_the_bad_one() -> None:
    with pytest.raises(InvalidParameter, match="at least one rule"):
        parse_rules([])
    with pytest.raises(InvalidParameter, match="rule 2: unknown function"):
        parse_rules(["metrics.f1 > 0", "exec(1) > 0"])
    with pytest.raises(InvalidParameter, match="at most"):
        parse_rules(["true"] * 51)
    assert [r.text for r in parse_rules(["metrics.f1>0", "true"])] == ["metrics.f1 > 0", "true"]


def test_names_lists_what_a_rule_reads() -> None:
    rule = Rule.parse("metrics.f1 >= champion.metrics.f1 - 0.01 and metrics.f1 > 0.5")
    assert rule.names() == ("metrics.f1", "champion.metrics.f1")


def test_huge_values_fail_the_rule_without_raising() -> None:
    big = {"metrics": {"x": 1e308}}
    assert check("metrics.x * 10 > 1", big).passed  # inf, as Python's floats give
    assert not check("metrics.x * 10 - metrics.x * 10 > 0", big).passed  # nan


# ---------------------------------------------------------------------- property tests
_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
}
_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_numbers = st.one_of(
    st.integers(min_value=0, max_value=10**6),
    st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
)


_Drawn = tuple[str, Any, dict[str, Any]]


def _leaf(draw: st.DrawFn, depth: int) -> _Drawn:
    number = draw(_numbers)
    if draw(st.booleans()):
        key = f"m{draw(st.integers(0, 5))}_{depth}_{len(str(number))}"
        return f"metrics.{key}", number, {key: number}
    return repr(number), number, {}


def _combined(kind: str, op: str, left: _Drawn, right: _Drawn) -> _Drawn:
    """Two drawn expressions joined by ``kind`` (min, max, or ``op`` for a binary one);
    the value None stands for a division by zero somewhere inside."""
    (ltext, a, names), (rtext, b, more) = left, right
    for key, value in more.items():
        if names.setdefault(key, value) != value:  # one name, one value
            return left
    text = f"{kind}({ltext}, {rtext})" if kind in ("min", "max") else f"({ltext}) {op} ({rtext})"
    if a is None or b is None or (kind == "binary" and op == "/" and b == 0):
        return text, None, names
    if kind in ("min", "max"):
        return text, (min if kind == "min" else max)(a, b), names
    return text, _OPS[op](a, b), names


@st.composite
def _expressions(draw: st.DrawFn, depth: int = 0) -> _Drawn:
    """(text, Python's value, the metrics it names): each node computed with Python's own
    operators, written with full parentheses, sometimes read through a metric name."""
    if depth >= 4 or draw(st.booleans()):
        return _leaf(draw, depth)
    kind = draw(st.sampled_from(["binary", "binary", "negate", "abs", "min", "max"]))
    left, a, names = draw(_expressions(depth + 1))
    if kind in ("negate", "abs"):
        value = None if a is None else (-a if kind == "negate" else abs(a))
        return (f"-({left})" if kind == "negate" else f"abs({left})"), value, names
    right = draw(_expressions(depth + 1))
    return _combined(kind, draw(st.sampled_from(sorted(_OPS))), (left, a, names), right)


@settings(max_examples=300, deadline=None)
@given(_expressions(), _numbers, st.sampled_from(sorted(_CMP)))
def test_arithmetic_agrees_with_python(
    expression: tuple[str, Any, dict[str, Any]], bound: Any, op: str
) -> None:
    text, value, names = expression
    rule = f"{text} {op} {bound!r}"
    if len(rule) > 4096:
        return
    result = Rule.parse(rule).evaluate({"metrics": names})
    if value is None:  # a division by zero somewhere: a failed rule that says so
        assert not result.passed
        assert "division by zero" in result.explanation
        return
    if isinstance(value, float) and math.isnan(value):
        assert not result.passed or op == "!="
        return
    assert result.passed is _CMP[op](value, bound), (rule, value)


@settings(max_examples=200, deadline=None)
@given(_expressions())
def test_canonical_text_reads_back_the_same(expression: _Drawn) -> None:
    text, _value, names = expression
    rule = Rule.parse(f"{text} >= 0")
    again = Rule.parse(rule.text)
    assert again.text == rule.text
    context = {"metrics": names}
    assert again.evaluate(context) == rule.evaluate(context)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_parses_or_is_refused_cleanly(text: str) -> None:
    try:
        rule = Rule.parse(text)
    except InvalidParameter:
        return
    result = rule.evaluate(CONTEXT)
    assert isinstance(result.passed, bool)


# ---------------------------------------------------------------------- JUnit XML
def _report(model: str, results: tuple[RuleResult, ...], **kw: Any) -> GateReport:
    return GateReport(model, "candidate", "champion", 4, kw.pop("champion", 3), results, **kw)


def test_junit_has_one_case_per_rule_and_a_failure_where_one_failed() -> None:
    passed = check("metrics.f1 >= champion.metrics.f1 - 0.01")
    failed = check("metrics.auc >= champion.metrics.auc")
    report = _report("churn", (passed, failed), dry_run=True)
    root = ET.fromstring(junit_xml(report))
    suite = root.find("testsuite")
    assert suite is not None
    assert suite.get("name") == "shamal.promote.churn"
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [passed.rule, failed.rule]
    assert cases[0].find("failure") is None
    failure = cases[1].find("failure")
    assert failure is not None
    assert failure.text == failed.explanation
    assert failure.get("message") == failed.explanation
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["champion_version"] == "3"
    assert props["dry_run"] == "true"
    assert props["promoted"] == "false"


def test_junit_escapes_what_names_and_values_hold() -> None:
    hostile = "ch<ur>n&\"'\x1b]8;;\x07"
    odd = check("params.optimizer == '<script>&amp;'", {"params": {"optimizer": "]]>\x00"}})
    report = _report(hostile, (odd,), champion=None)
    text = junit_xml(report)
    assert "<script>" not in text
    root = ET.fromstring(text)  # parses: every character it holds is one XML allows
    suite = root.find("testsuite")
    assert suite is not None
    assert suite.get("name", "").startswith("shamal.promote.ch<ur>n&\"'")
    case = suite.find("testcase")
    assert case is not None
    assert case.get("name") == "params.optimizer == '<script>&amp;'"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["champion_version"] == "none"


def test_report_json_is_plain_data() -> None:
    report = _report("churn", (check("true"),), promoted=True)
    body = report.to_json()
    assert body["passed"] is True
    assert body["promoted"] is True
    assert body["results"][0]["rule"] == "true"


def test_a_report_reads_back_from_its_json() -> None:
    report = _report("churn", (check("true"), check("metrics.x > 1")), champion=None)
    assert GateReport.from_json(report.to_json()) == report
    with pytest.raises(InvalidParameter):
        GateReport.from_json({"model": "x"})
    with pytest.raises(InvalidParameter):
        GateReport.from_json({**report.to_json(), "candidate_version": "v1"})
