"""/backup/offsets of a fleet member whose Quorum shard is not open yet: `settling`
(the seed's reason), never a committed offset the replica cannot vouch for. Three
in-process fleet members over real QUIC and real storage (tests/fleet/harness.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.fleet.routing import AssignmentState, Route, ShardId, ShardKind
from felix_common.catalog import Consistency

from ..support import waits
from ..support.wire import NS, TENANT
from .harness import NODES, Fleet, running_fleet

pytestmark = pytest.mark.timeout(90)

QUORUM = StreamSpec(
    TENANT, NS, "q", durable=True, replication_factor=3, consistency=Consistency.QUORUM
)
PLAIN = StreamSpec(TENANT, NS, "plain", durable=True)
CATALOG = StaticCatalog(streams=[QUORUM, PLAIN], caches=[])
Q = ShardId(ShardKind.STREAM, TENANT, NS, "q", 0)
P = ShardId(ShardKind.STREAM, TENANT, NS, "plain", 0)


def lead(fleet: Fleet, generation: int) -> None:
    fleet.routes[Q] = Route(generation, AssignmentState.ACTIVE, leader="node-a", replicas=NODES)
    fleet.routes[P] = Route(generation, AssignmentState.ACTIVE, leader="node-a")
    fleet.publish()


async def until(check: Callable[[], bool], seconds: float = 20.0) -> None:
    """tests/support/waits.py's wait, bounded at 20 s unless told."""
    await waits.until(check, seconds)


async def backup_offsets(fleet: Fleet) -> dict[str, Any]:
    port = fleet.brokers["node-a"].http_port
    url = f"http://127.0.0.1:{port}/backup/offsets"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        answer: dict[str, Any] = json.loads(await response.text())
        return answer


def by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in entries}


async def test_a_quorum_shard_not_open_yet_is_settling_then_listed(tmp_path: Path) -> None:
    async with running_fleet(tmp_path, with_catalog=CATALOG) as fleet:
        replication = fleet.brokers["node-a"].replication
        assert replication is not None
        fleet.down.update({"node-b", "node-c"})  # its fence reaches no majority
        lead(fleet, 1)
        await until(lambda: replication.driver(Q) is not None)
        answer = await backup_offsets(fleet)
        skipped = by_name(answer["skipped"])
        assert skipped["q"]["reason"] == "settling", answer
        assert skipped["q"]["detail"] == "not_ready"
        assert "q" not in by_name(answer["shards"])
        # A Leader shard led here is listed whatever its neighbours' replication does.
        assert by_name(answer["shards"])["plain"]["generation"] == 1
        # With a majority back, the promoted leader opens and its shard is listed.
        fleet.down.clear()
        lead(fleet, 2)

        def serving() -> bool:
            driver = replication.driver(Q)
            return driver is not None and driver.refusal() is None

        await until(serving)
        answer = await backup_offsets(fleet)
        assert "q" not in by_name(answer["skipped"]), answer
        assert by_name(answer["shards"])["q"]["generation"] == 2
