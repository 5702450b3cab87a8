"""Reports of a run: the terminal summary, JSON, JUnit XML and per-case wire logs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .verdicts import CaseResult, RunReport, Verdict

__all__ = ["print_summary", "to_json", "write_json", "write_junit", "write_logs"]

_STYLE = {
    Verdict.PASS: "green",
    Verdict.FAIL: "bold red",
    Verdict.UNSUPPORTED: "yellow",
    Verdict.INFORMATIONAL: "cyan",
}


def _by_section(report: RunReport) -> dict[str, list[CaseResult]]:
    sections: dict[str, list[CaseResult]] = defaultdict(list)
    for result in report.results:
        sections[result.case.section].append(result)
    return dict(sorted(sections.items()))


def print_summary(report: RunReport, console: Console) -> None:
    """One table per catalogue section, then the failures in detail, then totals."""
    console.print(
        f"target {report.target}: flags {report.advertised_flags:#06x}, "
        f"features {report.advertised_features:#x}"
    )
    for section, results in _by_section(report).items():
        table = Table(title=section, title_justify="left", expand=False)
        table.add_column("case")
        table.add_column("verdict")
        table.add_column("detail", overflow="fold")
        for r in results:
            style = _STYLE[r.verdict]
            table.add_row(r.case.id, f"[{style}]{r.verdict.value}[/]", r.detail)
        console.print(table)
    for r in report.results:
        if r.verdict is not Verdict.FAIL:
            continue
        console.print(f"[bold red]FAIL[/] {r.case.id}: {r.case.requirement}")
        console.print(f"  {r.step or ''}: {r.detail}", markup=False)
        if r.expected is not None:
            console.print(f"  expected: {r.expected}", markup=False)
        if r.actual is not None:
            console.print(f"  actual:   {r.actual}", markup=False)
        if r.wire_log:
            console.print("  wire log:", markup=False)
            console.print("    " + r.wire_log.rstrip().replace("\n", "\n    "), markup=False)
    totals = ", ".join(f"{v.value} {report.count(v)}" for v in Verdict)
    console.print(f"{len(report.results)} cases: {totals}")


def _result_json(r: CaseResult) -> dict[str, Any]:
    return {
        "id": r.case.id,
        "title": r.case.title,
        "section": r.case.section,
        "requirement": r.case.requirement,
        "level": r.case.level.value,
        "messages": list(r.case.messages),
        "verdict": r.verdict.value,
        "detail": r.detail,
        "step": r.step,
        "expected": r.expected,
        "actual": r.actual,
        "duration": round(r.duration, 4),
        "wire_log": r.wire_log.splitlines() if r.verdict is Verdict.FAIL else [],
    }


def to_json(report: RunReport) -> dict[str, Any]:
    return {
        "target": report.target,
        "advertised": {
            "flags": report.advertised_flags,
            "features": report.advertised_features,
        },
        "totals": {v.value: report.count(v) for v in Verdict},
        "cases": [_result_json(r) for r in report.results],
    }


def write_json(report: RunReport, path: Path) -> None:
    path.write_text(json.dumps(to_json(report), indent=2) + "\n")


def write_junit(report: RunReport, path: Path) -> None:
    """JUnit XML: a testsuite per catalogue section; unsupported cases are skipped."""
    root = ET.Element("testsuites", name="felix-conformance")
    for section, results in _by_section(report).items():
        suite = ET.SubElement(
            root,
            "testsuite",
            name=section,
            tests=str(len(results)),
            failures=str(sum(r.verdict is Verdict.FAIL for r in results)),
            skipped=str(sum(r.verdict is Verdict.UNSUPPORTED for r in results)),
        )
        for r in results:
            case = ET.SubElement(
                suite, "testcase", classname=section, name=r.case.id, time=f"{r.duration:.3f}"
            )
            if r.verdict is Verdict.FAIL:
                failure = ET.SubElement(case, "failure", message=r.detail)
                failure.text = (
                    f"{r.step}\nexpected: {r.expected}\nactual: {r.actual}\n\n{r.wire_log}"
                )
            elif r.verdict is Verdict.UNSUPPORTED:
                ET.SubElement(case, "skipped", message=r.detail)
            elif r.verdict is Verdict.INFORMATIONAL:
                ET.SubElement(case, "system-out").text = r.detail
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def write_logs(report: RunReport, directory: Path) -> None:
    """One wire log per case that ran, named after the case id."""
    directory.mkdir(parents=True, exist_ok=True)
    for r in report.results:
        head = (
            f"case: {r.case.id}\nrequirement: {r.case.requirement}\n"
            f"verdict: {r.verdict.value}\ndetail: {r.detail}\n"
        )
        if r.expected is not None or r.actual is not None:
            head += f"step: {r.step}\nexpected: {r.expected}\nactual: {r.actual}\n"
        (directory / f"{r.case.id}.log").write_text(head + "\n" + r.wire_log)
