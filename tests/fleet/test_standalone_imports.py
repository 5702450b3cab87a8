"""A standalone broker is today's broker: it imports nothing of the fleet and
advertises neither FEATURE_TOPOLOGY nor FEATURE_REDIRECT."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from felix_broker.app import SERVER_FEATURES
from felix_wire.features import Feature

from ..broker.harness import running_broker
from ..support.paths import REPO


def test_a_standalone_broker_imports_nothing_of_the_fleet() -> None:
    code = (
        "import sys, felix_broker.app, felix_broker.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith('felix_broker.fleet')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


async def test_a_standalone_broker_does_not_advertise_the_cluster_features(
    tmp_path: Path,
) -> None:
    cluster = Feature.FEATURE_TOPOLOGY | Feature.FEATURE_REDIRECT
    assert not SERVER_FEATURES & cluster
    async with running_broker(tmp_path) as broker:
        assert not broker.features & cluster
        assert broker.fleet is None and broker.peer_listener is None
