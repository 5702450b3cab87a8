"""Three in-process fleet members over real QUIC (client and peer listeners, mutual
TLS), sharing one routing snapshot the test sets (no etcd: the assignment watcher
is what feeds real ones).

Every broker has its own data folder, TLS material and peer certificate (signed
by one fleet CA); they share the catalog and the token keys, as a fleet does.
`Fleet.assign` leads shards to nodes at a generation; `Fleet.entry(node)` is a
broker-under-test for tests/support/wire.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec

from felix_broker.app import Broker
from felix_broker.cache.service import CacheLimits
from felix_broker.catalog import StaticCatalog
from felix_broker.config import load_config
from felix_broker.fleet.features import ATOMIC_COMMIT, PUBLISHER_PRINCIPAL, REPLICATED_CONDITIONS
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import (
    AssignmentState,
    Member,
    Route,
    RoutingSnapshot,
    ShardId,
    ShardKind,
)
from felix_broker.fleet.view import FleetView
from felix_common.tokens import DevIssuer, TokenVerifier
from felix_transport import default_impl, generate_ca
from felix_wire.binary import PublishAckFrame

from ..broker.harness import catalog
from ..support.wire import NS, TENANT

NODES = ("node-a", "node-b", "node-c")


@dataclass(frozen=True)
class Entry:
    """One fleet member as a broker under test (tests/support/wire.py)."""

    broker: Broker
    issuer: DevIssuer
    leader: Entry | None = None
    """For a member that leads nothing, the one that leads the tests' shards."""

    @property
    def quic_port(self) -> int:
        return self.broker.quic_port

    @property
    def ca_path(self) -> Path | None:
        return self.broker.ca_path

    @property
    def node_id(self) -> str:
        assert self.broker.fleet is not None
        return self.broker.fleet.node_id

    def __getattr__(self, name: str) -> Any:  # everything else is the broker's
        return getattr(self.broker, name)


@dataclass
class Fleet:
    brokers: dict[str, Broker]
    issuer: DevIssuer
    views: dict[str, FleetView]
    catalog: StaticCatalog
    routes: dict[ShardId, Route] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    finalized: frozenset[str] = frozenset(
        {ATOMIC_COMMIT, PUBLISHER_PRINCIPAL, REPLICATED_CONDITIONS}
    )

    def entry(self, node_id: str) -> Entry:
        return Entry(self.brokers[node_id], self.issuer)

    def members(self) -> dict[str, Member]:
        return {
            node: Member(node, f"127.0.0.1:{b.quic_port}", b.peer_addr)
            for node, b in self.brokers.items()
            if node not in self.down
        }

    def publish(self) -> None:
        """Give every broker the same snapshot (its own node id in it), with the fleet
        features finalized as a running fleet's control plane would have (`finalized`)."""
        members = MappingProxyType(self.members())
        routes = MappingProxyType(dict(self.routes))
        for node, view in self.views.items():
            view.update(
                RoutingSnapshot(
                    node_id=node, members=members, routes=routes, finalized=self.finalized
                )
            )

    def assign(
        self,
        shards: Iterable[ShardId],
        leader: str | None,
        generation: int,
        state: AssignmentState = AssignmentState.ACTIVE,
        reason: str | None = None,
    ) -> None:
        for shard in shards:
            self.routes[shard] = Route(generation, state, leader=leader, reason=reason)
        self.publish()

    def assign_all(self, leader: str, generation: int = 1) -> None:
        """Every shard of every catalog stream and cache led by `leader`."""
        self.assign(all_shards(self.catalog), leader, generation)

    def set_view(self, node: str, **changes: Any) -> None:
        """Change one broker's snapshot only (to make it behind or ahead)."""
        view = self.views[node]
        view.update(dataclasses.replace(view.snapshot, **changes))


def stream_shards(name: str, count: int) -> list[ShardId]:
    return [ShardId(ShardKind.STREAM, TENANT, NS, name, i) for i in range(count)]


def all_shards(of: StaticCatalog | None = None) -> list[ShardId]:
    """Every shard of every stream and cache of a catalog (the broker tests' by default)."""
    of = of or catalog()
    shards = [
        ShardId(ShardKind.STREAM, s.tenant_id, s.namespace, s.name, i)
        for s in of.streams()
        for i in range(s.shards)
    ]
    shards += [
        ShardId(ShardKind.CACHE, c.tenant_id, c.namespace, c.name, i)
        for c in of.caches()
        for i in range(c.shards)
    ]
    return shards


@asynccontextmanager
async def running_fleet(
    tmp: Path,
    *,
    with_catalog: StaticCatalog | None = None,
    cache_limits: CacheLimits | None = None,
    **overrides: Any,
) -> AsyncIterator[Fleet]:
    shared = with_catalog or catalog()
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp / "issuer")
    brokers: dict[str, Broker] = {}
    views: dict[str, FleetView] = {}
    try:
        for node in NODES:
            data = tmp / node
            settings: dict[str, Any] = {
                "quic_bind": "127.0.0.1:0",
                "metrics_bind": "127.0.0.1:0",
                "data_dir": str(data),
                "durable_storage_dir": str(data / "durable"),
                "quic_impl": default_impl(),
            }
            settings.update(overrides)
            config = dataclasses.replace(
                load_config(environ={}, overrides=settings), catalog=shared
            )
            views[node] = FleetView(RoutingSnapshot(node_id=node))
            fleet_node = FleetNode(tls=PeerTls.issue(fleet_ca, node), view=views[node])
            broker = Broker(
                config,
                verifier=TokenVerifier(issuer.jwks()),
                fleet=fleet_node,
                cache_limits=cache_limits,
            )
            await broker.start()
            brokers[node] = broker
        fleet = Fleet(brokers, issuer, views, shared)
        fleet.publish()
        yield fleet
    finally:
        for broker in brokers.values():
            await broker.stop()


NON_OWNER = "three-non-owner"
OWNER = "three-owner"
TOPOLOGIES = ("one", OWNER, NON_OWNER)
"""How a client-visible test runs: against one broker, and against a fleet of three
(every shard led by node-a) through the owner (the client on node-a) and through a
non-owner (the client on node-b, so publishes and cache ops are forwarded)."""

THROUGH_LEADER = ("one", OWNER)
"""For requests a non-owner answers `not_leader` (subscribe, cache watch, groups,
guarded writes; docs/architecture.md): one broker, and the owner of a fleet of three.
What a non-owner answers them is tested in tests/fleet/test_cluster.py."""


@asynccontextmanager
async def reached_in_fleet(
    tmp: Path, topology: str, with_catalog: StaticCatalog, **overrides: Any
) -> AsyncIterator[Entry]:
    """The broker a client talks to in a three-member fleet whose every shard node-a
    leads: node-a itself (`OWNER`) or node-b, which leads nothing (`NON_OWNER`)."""
    if topology not in (OWNER, NON_OWNER):
        raise ValueError(f"not a fleet topology: {topology!r}")
    async with running_fleet(tmp, with_catalog=with_catalog, **overrides) as fleet:
        fleet.assign_all("node-a")
        if topology == OWNER:
            yield fleet.entry("node-a")
        else:
            yield dataclasses.replace(fleet.entry("node-b"), leader=fleet.entry("node-a"))


def unhinted(ack: PublishAckFrame, through: Any) -> PublishAckFrame:
    """A binary ack without its owner hint (flag 0x0080), which only a forwarding
    broker adds, and it only for a client that offered the flag; the hint, when there
    is one, must name the leader."""
    leader = through.leader if isinstance(through, Entry) else None
    if leader is None:
        assert ack.node_id is None and ack.addr is None and ack.generation is None, ack
        return ack
    assert ack.node_id == leader.node_id and ack.addr == f"127.0.0.1:{leader.quic_port}", ack
    return msgspec.structs.replace(ack, node_id=None, addr=None, generation=None)


def leader_of(broker: Any) -> Any:
    """Where a test subscribes to see what it published through `broker`: the leader
    of every shard (a subscribe at a non-owner is redirected), else `broker` itself."""
    leader = broker.leader if isinstance(broker, Entry) else None
    return leader if leader is not None else broker


__all__ = [
    "NODES",
    "NON_OWNER",
    "OWNER",
    "THROUGH_LEADER",
    "TOPOLOGIES",
    "Entry",
    "Fleet",
    "all_shards",
    "leader_of",
    "reached_in_fleet",
    "running_fleet",
    "stream_shards",
    "unhinted",
]
