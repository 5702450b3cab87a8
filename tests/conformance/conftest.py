"""Shared helpers for the conformance kit's tests: the reference broker as a kit target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from felix_conformance.target import Target, target_from_fixture


@pytest.fixture(scope="session")
def fixture_file(felix_fixture: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference broker's fixture document as a file, the way `--fixture` reads it."""
    path = tmp_path_factory.mktemp("kit") / "fixture.json"
    path.write_text(json.dumps(felix_fixture))
    return path


@pytest.fixture(scope="session")
def reference_target(fixture_file: Path) -> Target:
    return target_from_fixture(fixture_file)
