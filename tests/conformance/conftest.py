"""Shared helpers for the conformance kit's tests: the reference broker as a kit target."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from felix_conformance.target import Target, target_from_fixture

from ..conftest import start_fixture_broker, stop_fixture_broker


@pytest.fixture(scope="session")
def fixture_file(felix_fixture: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference broker's fixture document as a file, the way `--fixture` reads it."""
    path = tmp_path_factory.mktemp("kit") / "fixture.json"
    path.write_text(json.dumps(felix_fixture))
    return path


@pytest.fixture(scope="session")
def reference_target(fixture_file: Path) -> Target:
    return target_from_fixture(fixture_file)


@pytest.fixture(scope="package")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A three-broker fixture (etcd, a control plane, three broker processes), one for
    every kit test that needs a fleet (starting one costs tens of seconds), stopped
    once the last test of tests/conformance has run."""
    folder = tmp_path_factory.mktemp("kit-fleet")
    process, _document = start_fixture_broker(folder, args=("--brokers", "3"), timeout=90)
    try:
        yield folder / "fixture.json"
    finally:
        if process.poll() is None:
            stop_fixture_broker(process)
        else:
            process.wait(timeout=10)
