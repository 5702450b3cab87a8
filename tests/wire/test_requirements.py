"""Every requirement id and section number cited in code, tests, the spec and the kit's
transcripts resolves in spec/requirements.yaml (felix_wire.requirements)."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from felix_wire.catalogue import DECISIONS
from felix_wire.requirements import CITATION, REQUIREMENTS, SECTION_CITATION, SECTIONS

from ..support.paths import REPO

# Hand-written Python whose comments and docstrings cite requirements.
PYTHON_ROOTS = (
    "felix_broker",
    "felix_common",
    "felix_client",
    "felix_controlplane",
    "felix_transport",
    "conformance/felix_conformance",
    "codegen/felix_codegen",
    "bench",
    "tests",
    "tools",
)
TRANSCRIPTS = REPO / "conformance" / "felix_conformance" / "transcripts"
# A citation of the protocol facts file outside the repository (tools/cite_requirements.py
# rewrites them into requirement ids and section numbers).
EXTERNAL_CITATION = re.compile(r"\bfacts (?:§|section \d|\d|[A-Z]{1,2}[0-9])")


def _python_prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                value = body[0].value.value
                if isinstance(value, str):
                    yield body[0].lineno, value


def _yaml_prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of a YAML file's comments, notes and requirement sentences."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if "#" in line or "note:" in line or line.startswith("requirement:"):
            yield number, line


def _prose() -> Iterator[tuple[str, int, str]]:
    for root in PYTHON_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            for line, text in _python_prose(path):
                yield str(path.relative_to(REPO)), line, text
    yaml_files = [*sorted((REPO / "spec").glob("*.yaml")), *sorted(TRANSCRIPTS.rglob("*.yaml"))]
    for path in yaml_files:
        if path.name == "requirements.yaml":
            continue
        for line, text in _yaml_prose(path):
            yield str(path.relative_to(REPO)), line, text


def unresolved(text: str) -> list[str]:
    """The citations in `text` that spec/requirements.yaml does not define."""
    ids = [m.group(0) for m in CITATION.finditer(text) if m.group(0) not in REQUIREMENTS]
    sections = [f"§{m.group(1)}" for m in SECTION_CITATION.finditer(text)]
    return ids + [s for s in sections if s[1:] not in SECTIONS]


def test_the_scanner_finds_a_citation_that_does_not_resolve() -> None:
    assert unresolved("ended by the broker (T7, Q8-Q9, §5.8)") == []
    assert unresolved("see (T99) and (ZZ1) and §15.2") == ["T99", "§15.2"]
    assert CITATION.findall("E402 RS256 QH3 b'A2x'") == []


def test_every_cited_requirement_resolves() -> None:
    problems = [
        f"{where}:{line}: {', '.join(missing)}"
        for where, line, text in _prose()
        if (missing := unresolved(text))
    ]
    assert problems == [], "\n".join(problems)
    # The scan saw the citations it exists for.
    cited = {m.group(0) for _, _, text in _prose() for m in CITATION.finditer(text)}
    assert {"T5", "T7", "N8", "Q16", "K4", "PL3", "A8"} <= cited


def test_nothing_cites_the_facts_file_outside_the_repository() -> None:
    found = [
        f"{where}:{line}: {text.strip()}"
        for where, line, text in _prose()
        if EXTERNAL_CITATION.search(text) and where != "tools/cite_requirements.py"
    ]
    assert found == [], "run tools/cite_requirements.py:\n" + "\n".join(found)


@pytest.mark.parametrize("path", sorted(TRANSCRIPTS.rglob("*.yaml")), ids=lambda p: p.stem)
def test_a_transcript_section_is_a_requirements_section(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    number = str(document["section"]).split()[0]
    assert number in SECTIONS, f"{path.name}: section {document['section']!r}"


def test_decisions_named_by_requirements_exist() -> None:
    named = {r.decision for r in REQUIREMENTS.values() if r.decision is not None}
    assert named and named <= set(DECISIONS)
    assert {r.section for r in REQUIREMENTS.values()} <= set(SECTIONS)


def _rewriter() -> Any:
    spec = importlib.util.spec_from_file_location(
        "cite_requirements", REPO / "tools" / "cite_requirements.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("# shard is ignored (facts K7).", "# shard is ignored (K7)."),
        ("needs durable storage (facts N4, Q1)", "needs durable storage (N4, Q1)"),
        ('"""Queues (facts §5.8, Q1-Q17)."""', '"""Queues (§5.8, Q1-Q17)."""'),
        ("the defaults of facts §12.", "the defaults of §12."),
        ("at the broker (facts 14.7): refused", "at the broker (U7): refused"),
        ("unspecified there (facts §14 item 15), so", "unspecified there (U15), so"),
        ("# Where sources disagree (facts section 14)", "# Where sources disagree (§14)"),
        ("mean not given (facts 3.3).", "mean not given (§3.3)."),
        (
            "The protocol facts name only stream.subscribe",
            "The protocol facts name only stream.subscribe",
        ),
    ],
)
def test_the_rewrite_script_maps_each_citation_form(before: str, after: str) -> None:
    rewrite = _rewriter().rewrite
    assert rewrite(before, transcript=False) == after
    assert rewrite(after, transcript=False) == after  # idempotent


def test_the_rewrite_script_gives_transcript_sections_their_sign() -> None:
    rewrite = _rewriter().rewrite
    before = "requirement: A broker MUST do it (A3, 3.3, 5.1 unsupported fields).\n"
    after = "requirement: A broker MUST do it (A3, §3.3, §5.1 unsupported fields).\n"
    assert rewrite(before, transcript=True) == after
    assert rewrite(after, transcript=True) == after
    assert rewrite(before, transcript=False) == before  # only transcripts


def test_the_repository_needs_no_rewrite() -> None:
    assert _rewriter().main(["--check", "--repo", str(REPO)]) == 0
