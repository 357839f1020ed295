"""A JUnit XML report of ``perfscope check``, the format CI systems (GitLab, Jenkins, GitHub
actions' test reporters) show as test results: one ``testsuite`` with a ``testcase`` per check
(``step time``, ``verdict``), a ``failure`` element on each that failed."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from perfscope.atomic import write_bytes_atomic
from perfscope.check.decide import CheckResult, report_lines
from perfscope.text import safe

SUITE = "perfscope check"
# Characters XML 1.0 cannot hold at all (not even as references): C0 controls but tab, newline and
# carriage return; lone surrogates (a file name's undecodable bytes); U+FFFE and U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
MAX_TEXT = 2000


def xml_text(text, limit: int = MAX_TEXT) -> str:
    """``text`` made safe for a terminal (:func:`perfscope.text.safe`) and storable in XML, cut to
    ``limit`` characters."""
    out = _NOT_XML.sub("?", safe(text))
    return out if len(out) <= limit else out[:limit] + "..."


def junit_xml(result: CheckResult, name: str = "run") -> bytes:
    """The JUnit XML document of ``result`` (UTF-8 bytes); ``name`` labels the run compared."""
    lines = [xml_text(line) for line in report_lines(result)]
    cases = [("step time", result.step_regression, lines[0]), ("verdict", result.verdict_regression, lines[1])]
    suite = ET.Element("testsuite", name=SUITE, tests=str(len(cases)),
                       failures=str(sum(1 for _, failed, _ in cases if failed)), errors="0", skipped="0")
    detail = "\n".join(lines)
    for case, failed, line in cases:
        tc = ET.SubElement(suite, "testcase", classname=f"{SUITE}.{xml_text(name, 300)}", name=case)
        if failed:
            f = ET.SubElement(tc, "failure", message=line, type="regression")
            f.text = detail
        out = ET.SubElement(tc, "system-out")
        out.text = line
    root = ET.Element("testsuites", name=SUITE)
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(result: CheckResult, path: str | Path, name: str = "run") -> Path:
    """Write :func:`junit_xml` to ``path`` atomically."""
    return write_bytes_atomic(path, junit_xml(result, name))
