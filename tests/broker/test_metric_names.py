"""Every series a broker exports follows the one naming scheme of felix_broker/metrics.py:
``felix_<area>_<what>``, with the names the protocol documents kept as they are."""

from __future__ import annotations

import re
from pathlib import Path

from .harness import running_broker

AREAS = (
    "connections",
    "auth",
    "request",
    "stream",
    "storage",
    "group",
    "cache",
    "fleet",
    "task",
    "tenant",
    "build",
)
SCHEME = re.compile(rf"^felix_({'|'.join(AREAS)})_[a-z0-9_]+$")
# The names the seed (the protocol's reference) mentions, exported as they are.
SEED_NAMES = ("felix_tenant_publish_queue_full_total",)


# The suffix the exposition adds to a family's name, by type.
SUFFIX = {"counter": "_total", "info": "_info"}


async def test_every_exported_series_follows_the_scheme(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        exported = {
            family.name + SUFFIX.get(family.type, "")
            for family in broker.metrics.registry.collect()
        }
    assert sorted(name for name in exported if not SCHEME.match(name)) == []
    for name in SEED_NAMES:
        assert name in exported, sorted(exported)
    assert "felix_build_info" in exported
