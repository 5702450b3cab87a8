"""Helpers for the fleet tests: fleet nodes (the broker's real fleet part, without QUIC),
a placer over a fixed catalog, and bounded waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from felix_broker.fleet.etcd_node import EtcdNode
from felix_broker.fleet.routing import RoutingSnapshot, ShardId
from felix_broker.fleet.view import FleetView
from felix_common.etcd import EtcdClient
from felix_common.fleet import Keyspace
from felix_controlplane.placement import Placer, ShardSpec

PREFIX = "/felix-test"


def node(endpoint: tuple[str, int], node_id: str, *, ttl_ms: int = 1500) -> EtcdNode:
    return EtcdNode(
        view=FleetView(RoutingSnapshot(node_id)),
        endpoints=[endpoint],
        prefix=PREFIX,
        lease_ttl_ms=ttl_ms,
        client_addr=f"127.0.0.1:{5000 + len(node_id)}",
        peer_addr="",
        features=[],
    )


# The etcd clients placers were given: a Placer does not own its client, so the tests
# close them, on the loop that made them, before it closes.
PLACER_CLIENTS: list[EtcdClient] = []


def placer(
    endpoint: tuple[str, int], holder: str, specs: list[ShardSpec], *, ttl_s: int = 2
) -> Placer:
    async def catalog() -> list[ShardSpec]:
        return specs

    client = EtcdClient([endpoint], timeout_s=1.0)
    PLACER_CLIENTS.append(client)  # closed after each test (conftest.py)
    return Placer(client, Keyspace(PREFIX), holder, catalog, lease_ttl_s=ttl_s, interval_s=0.2)


async def eventually(check: Callable[[], bool], *, within: float = 10.0, what: str = "") -> None:
    """Wait (bounded) until `check()` holds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what or check}")
        await asyncio.sleep(0.02)


@dataclass
class Applied:
    """Every route change one node's view accepted: (shard, generation) in order."""

    node_id: str
    seen: list[tuple[ShardId, int]] = field(default_factory=list)

    def __call__(self, previous: RoutingSnapshot, current: RoutingSnapshot) -> None:
        for shard, route in current.routes.items():
            held = previous.routes.get(shard)
            if held is None or held.generation != route.generation:
                self.seen.append((shard, route.generation))

    def check_never_twice_nor_backwards(self) -> None:
        last: dict[ShardId, int] = {}
        for shard, generation in self.seen:
            assert generation > last.get(shard, 0), (self.node_id, shard, generation, last)
            last[shard] = generation
