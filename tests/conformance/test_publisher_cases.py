"""The publisher-layout cases (events.publisher-*): they pass against a broker that
stores publishers (FELIX_RECORD_PUBLISHERS=true) once the profile names its
`publisher_stream`, are "setup" when it names none, and fail against a broker that
does not store them (what makes them cases that can fail)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from felix_conformance.cli import EXIT_FAILED, EXIT_OK, main
from felix_conformance.corpus import load_corpus, select

from ..conftest import start_fixture_broker, stop_fixture_broker

PUBLISHER = ["events.publisher-*"]


@pytest.fixture(scope="module")
def recording_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("kit-publishers")
    process, _document = start_fixture_broker(folder, ("FELIX_RECORD_PUBLISHERS", "true"))
    try:
        yield folder / "fixture.json"
    finally:
        stop_fixture_broker(process)


def _run(tmp_path: Path, *args: str) -> tuple[int, dict[str, str], list[dict[str, Any]]]:
    report = tmp_path / "report.json"
    code = main([*args, "-t", *PUBLISHER, "--json", str(report)])
    cases: list[dict[str, Any]] = json.loads(report.read_text())["cases"]
    return code, {c["id"]: c["verdict"] for c in cases}, cases


def test_there_are_three_publisher_cases() -> None:
    cases = select(load_corpus(), PUBLISHER, strict=True)
    flags = sorted(f for case in cases for f in case.flags)
    assert flags == [0x2022, 0x2024, 0x6002, 0x6004, 0x6022, 0x6024]


@pytest.mark.timeout(120)
def test_they_pass_against_a_broker_that_stores_publishers(
    recording_fixture: Path, tmp_path: Path
) -> None:
    code, verdicts, cases = _run(
        tmp_path, "--fixture", str(recording_fixture), "--set", "publisher_stream=durable"
    )
    assert set(verdicts.values()) == {"pass"}, cases
    assert len(verdicts) == 3 and code == EXIT_OK


@pytest.mark.timeout(120)
def test_they_are_setup_without_a_publisher_stream(fixture_file: Path, tmp_path: Path) -> None:
    code, verdicts, cases = _run(tmp_path, "--fixture", str(fixture_file))
    assert set(verdicts.values()) == {"setup"}, cases
    assert all("publisher_stream" in c["detail"] for c in cases)
    assert code == EXIT_OK


@pytest.mark.timeout(120)
def test_they_fail_against_a_broker_that_stores_no_publisher(
    fixture_file: Path, tmp_path: Path
) -> None:
    """The shared fixture broker does not store publishers: its durable stream's
    batches carry none, and each case says so."""
    code, verdicts, cases = _run(
        tmp_path, "--fixture", str(fixture_file), "--set", "publisher_stream=durable"
    )
    assert set(verdicts.values()) == {"fail"}, cases
    assert all("publisher" in c["detail"] for c in cases), [c["detail"] for c in cases]
    assert code == EXIT_FAILED
