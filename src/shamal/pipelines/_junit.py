"""A gate's report as JUnit XML, the format CI systems (GitHub Actions, GitLab, Jenkins) show
as test results: one test suite per gate, one test case per rule.

Built with :mod:`xml.etree.ElementTree`, which escapes text and attributes; characters XML 1.0
cannot carry at all (most control characters) are replaced first, so any rule, value or model
name gives a document every parser reads.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET  # nosec B405 - writes XML, never parses any

from shamal.pipelines._gate import GateReport

__all__ = ["junit_xml"]

logger = logging.getLogger(__name__)

# What XML 1.0 forbids outright (escaping does not help): C0 controls but tab, newline and
# carriage return, lone surrogates, U+FFFE and U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _clean(text: str) -> str:
    return _NOT_XML.sub("?", text)


def junit_xml(report: GateReport) -> str:
    """The report as a JUnit XML document (UTF-8 declared).

    One ``<testsuite name="shamal.promote.<model>">`` inside ``<testsuites>``; one
    ``<testcase>`` per rule, named by the rule's text, with a ``<failure>`` holding the
    explanation when the rule failed, and the explanation as ``<system-out>`` either way.
    The suite's properties say the aliases, versions and whether the alias moved.
    """
    failures = sum(1 for r in report.results if not r.passed)
    suite_name = _clean(f"shamal.promote.{report.model}")
    root = ET.Element("testsuites", name="shamal.promote")
    root.set("tests", str(len(report.results)))
    root.set("failures", str(failures))
    suite = ET.SubElement(root, "testsuite", name=suite_name)
    suite.set("tests", str(len(report.results)))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", "0")
    properties = ET.SubElement(suite, "properties")
    facts = {
        "model": report.model,
        "from_alias": report.from_alias,
        "to_alias": report.to_alias,
        "candidate_version": str(report.candidate_version),
        "champion_version": "none"
        if report.champion_version is None
        else str(report.champion_version),
        "dry_run": str(report.dry_run).lower(),
        "promoted": str(report.promoted).lower(),
    }
    for key, value in facts.items():
        ET.SubElement(properties, "property", name=key, value=_clean(value))
    for result in report.results:
        case = ET.SubElement(suite, "testcase", name=_clean(result.rule), classname=suite_name)
        if not result.passed:
            failure = ET.SubElement(case, "failure", message=_clean(result.explanation))
            failure.set("type", "PromotionRuleFailed")
            failure.text = _clean(result.explanation)
        out = ET.SubElement(case, "system-out")
        out.text = _clean(result.explanation)
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + body + "\n"
