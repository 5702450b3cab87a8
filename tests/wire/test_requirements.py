"""Every requirement id and section number cited in code, tests, the spec and the kit's
transcripts resolves in spec/requirements.yaml (felix_wire.requirements)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from felix_wire.catalogue import DECISIONS
from felix_wire.requirements import CITATION, REQUIREMENTS, SECTION_CITATION, SECTIONS

from ..support.paths import REPO

# Hand-written Python whose comments and docstrings cite requirements.
PYTHON_ROOTS = (
    "felix_broker",
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
