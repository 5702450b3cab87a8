"""Reports of a run: the terminal summary, a progress line, JSON, JUnit XML, a
self-contained HTML page and per-case wire logs.

Every report renders a `RunReport`, whatever was tested: a broker run and a
client tester's run share them.
"""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from .verdicts import CaseResult, RunReport, Verdict

__all__ = [
    "Progress",
    "print_summary",
    "to_html",
    "to_json",
    "write_html",
    "write_json",
    "write_junit",
    "write_logs",
]

_STYLE = {
    Verdict.PASS: "green",
    Verdict.FAIL: "bold red",
    Verdict.UNSUPPORTED: "yellow",
    Verdict.SETUP: "magenta",
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
        f"{report.subject} {report.target}: flags {report.advertised_flags:#06x}, "
        f"features {report.advertised_features:#x}",
        markup=False,
    )
    for note in report.notes:
        console.print(f"  {note}", markup=False)
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
        "wire_log": r.wire_log.splitlines(),
    }


def to_json(report: RunReport) -> dict[str, Any]:
    return {
        "subject": report.subject,
        "target": report.target,
        "notes": list(report.notes),
        "advertised": {
            "flags": report.advertised_flags,
            "features": report.advertised_features,
        },
        "totals": {v.value: report.count(v) for v in Verdict},
        "cases": [_result_json(r) for r in report.results],
    }


def write_json(report: RunReport, path: Path) -> None:
    path.write_text(json.dumps(to_json(report), indent=2) + "\n")


_SKIPPED = (Verdict.UNSUPPORTED, Verdict.SETUP)


def write_junit(report: RunReport, path: Path) -> None:
    """JUnit XML: a testsuite per catalogue section; unsupported and setup cases are skipped."""
    root = ET.Element("testsuites", name="felix-conformance")
    for section, results in _by_section(report).items():
        suite = ET.SubElement(
            root,
            "testsuite",
            name=section,
            tests=str(len(results)),
            failures=str(sum(r.verdict is Verdict.FAIL for r in results)),
            skipped=str(sum(r.verdict in _SKIPPED for r in results)),
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
            elif r.verdict in _SKIPPED:
                ET.SubElement(case, "skipped", message=f"{r.verdict.value}: {r.detail}")
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


class Progress:
    """A progress line on a text stream while cases run: rewritten in place on a
    terminal, one line per case otherwise."""

    def __init__(self, stream: TextIO, total: int, *, tty: bool) -> None:
        self._stream = stream
        self._total = total
        self._tty = tty
        self._done = 0
        self._counts: Counter[Verdict] = Counter()

    def update(self, result: CaseResult) -> None:
        self._done += 1
        self._counts[result.verdict] += 1
        counts = " ".join(f"{v.value} {self._counts[v]}" for v in Verdict if self._counts[v])
        line = f"[{self._done}/{self._total}] {counts} | {result.verdict.value} {result.case.id}"
        if self._tty:
            self._stream.write("\r\x1b[K" + line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def done(self) -> None:
        if self._tty and self._done:
            self._stream.write("\n")
            self._stream.flush()


_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; } td, th { padding: .2em .7em; border-bottom: 1px solid #ddd; }
th { text-align: left; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.v { display: inline-block; min-width: 7.5em; padding: 0 .4em; border-radius: 3px;
     font-weight: 600; font-size: .85em; text-align: center; }
.pass { background: #d8f3dc; color: #1b4332; } .fail { background: #ffccd5; color: #800f2f; }
.unsupported { background: #fff3b0; color: #6b5900; }
.setup { background: #e9d8fd; color: #44337a; }
.informational { background: #d0ebff; color: #1c3d5a; }
details.case { border: 1px solid #ddd; border-radius: 4px; margin: .3em 0; padding: .3em .6em; }
details.case > summary { cursor: pointer; } code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f6f8fa; padding: .6em; overflow-x: auto; white-space: pre-wrap; }
dl { display: grid; grid-template-columns: max-content auto; gap: .15em 1em; margin: .5em 0; }
dt { color: #555; } dd { margin: 0; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _badge(verdict: Verdict) -> str:
    return f'<span class="v {verdict.value}">{verdict.value}</span>'


def _case_html(r: CaseResult) -> str:
    rows = [
        ("requirement", _e(r.case.requirement)),
        ("level", _e(r.case.level.value)),
        ("reason", _e(r.detail or "-")),
    ]
    if r.step:
        rows.append(("step", _e(r.step)))
    if r.expected is not None:
        rows.append(("expected", f"<code>{_e(r.expected)}</code>"))
    if r.actual is not None:
        rows.append(("actual", f"<code>{_e(r.actual)}</code>"))
    if r.case.messages:
        rows.append(("messages", _e(", ".join(r.case.messages))))
    rows.append(("duration", f"{r.duration:.3f} s"))
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    log = (
        f"<details><summary>wire log ({len(r.wire_log.splitlines())} lines)</summary>"
        f"<pre>{_e(r.wire_log)}</pre></details>"
        if r.wire_log
        else "<p><em>no wire log: the case did not run</em></p>"
    )
    opened = " open" if r.verdict is Verdict.FAIL else ""
    return (
        f'<details class="case" id="{_e(r.case.id)}"{opened}><summary>{_badge(r.verdict)} '
        f"<code>{_e(r.case.id)}</code> {_e(r.case.title)}</summary>"
        f"<dl>{body}</dl>{log}</details>"
    )


def to_html(report: RunReport) -> str:
    """One self-contained page: the summary by section, then every case with its
    requirement, verdict and reason, and its wire log folded away."""
    sections = _by_section(report)
    head_cells = "".join(f"<th>{_badge(v)}</th>" for v in Verdict)
    summary_rows = []
    for section, results in sections.items():
        cells = "".join(
            f'<td class="n">{sum(r.verdict is v for r in results) or ""}</td>' for v in Verdict
        )
        summary_rows.append(
            f'<tr><td><a href="#s-{_e(section)}">{_e(section)}</a></td>'
            f'<td class="n">{len(results)}</td>{cells}</tr>'
        )
    totals = "".join(f'<td class="n">{report.count(v)}</td>' for v in Verdict)
    summary_rows.append(f'<tr><th>all</th><td class="n">{len(report.results)}</td>{totals}</tr>')
    notes = "".join(f"<li>{_e(n)}</li>" for n in report.notes)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>felix-conformance: {_e(report.subject)} {_e(report.target)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>felix-conformance: {_e(report.subject)} <code>{_e(report.target)}</code></h1>",
        f"<p>advertised flags <code>{report.advertised_flags:#06x}</code>, features "
        f"<code>{report.advertised_features:#x}</code>; "
        f"{'<strong>failed</strong>' if report.failed else 'no case failed'}.</p>",
        f"<ul>{notes}</ul>" if notes else "",
        "<h2>Summary by section</h2>",
        f"<table><tr><th>section</th><th>cases</th>{head_cells}</tr>{''.join(summary_rows)}</table>",
    ]
    for section, results in sections.items():
        parts.append(f'<h2 id="s-{_e(section)}">{_e(section)}</h2>')
        parts.extend(_case_html(r) for r in results)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_html(report: RunReport, path: Path) -> None:
    path.write_text(to_html(report), encoding="utf-8")
