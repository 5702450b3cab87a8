"""The kit reads the requirement ids its cases cite and reports them as coverage."""

from __future__ import annotations

import dataclasses

from felix_conformance.corpus import load_corpus
from felix_conformance.coverage import compute_coverage
from felix_conformance.requirements import (
    REQUIREMENT_IDS,
    cited_requirements,
    covered_requirements,
    unknown_citations,
)
from felix_wire.requirements import REQUIREMENTS


def test_every_shipped_case_cites_a_known_requirement() -> None:
    cases = load_corpus()
    assert cases
    for case in cases:
        if case.recorded is not None:
            continue  # a recorded session checks an answer, not one requirement
        assert unknown_citations(case) == (), case.id
        assert cited_requirements(case), f"{case.id} cites no requirement id"


def test_citations_ranges_and_sections() -> None:
    case = load_corpus()[0]
    cited = dataclasses.replace(
        case, requirement="A broker MUST do it (T5, Q1-Q3, §3.4, ZZ9, T99)."
    )
    assert cited_requirements(cited) == ("Q1", "Q2", "Q3", "T5")
    assert unknown_citations(cited) == ("T99",)
    assert covered_requirements([cited]) == {"Q1", "Q2", "Q3", "T5"}


def test_coverage_reports_requirements_without_the_open_items() -> None:
    coverage = compute_coverage(load_corpus()).get("requirements")
    assert "U7" in REQUIREMENTS and "U7" not in REQUIREMENT_IDS
    assert coverage.total == REQUIREMENT_IDS
    assert {"T5", "T7", "N1", "N8", "F3", "A8", "S4"} <= coverage.covered
    assert 0 < coverage.count < len(REQUIREMENT_IDS)
