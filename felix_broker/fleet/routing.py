"""The broker's view of the fleet: who leads which shard, at which generation.

Sans-IO: the etcd watcher (fleet membership and assignments) feeds it changes;
placement at the dispatch seam and discovery read it. A `RoutingSnapshot` is
immutable; `RoutingTable.apply` returns a new one, so readers never see a
half-applied change and the swap is one assignment.

Rules kept here (docs/architecture.md, "The fleet"):

- A shard's generation is the etcd `mod_revision` of its assignment key: chosen
  by the store, strictly increasing, never reused.
- Assignment changes apply by generation: a change at or below the generation
  held for that shard is dropped (a late or duplicated watch event changes
  nothing).
- A broker serves a shard only when the snapshot names it leader and the
  assignment is `active`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

# Shared with the control plane's placer, which names shards the same way.
from felix_common.fleet import ShardId, ShardKind

__all__ = [
    "AssignmentState",
    "Member",
    "Route",
    "RoutingSnapshot",
    "ShardId",
    "ShardKind",
]


class AssignmentState(enum.Enum):
    """Where a shard's assignment stands (the `state` of an assignment record)."""

    ACTIVE = "active"  # the leader serves it
    UNAVAILABLE = "unavailable"  # nobody serves it; `reason` says why
    DRAINING = "draining"  # the leader is handing it over (a planned move)
    MOVING = "moving"  # fenced for a move: writes are held, nobody serves it


@dataclass(frozen=True, slots=True)
class Member:
    """A live broker: its registration record."""

    node_id: str
    client_addr: str  # host:port clients use; "" when the broker has none to give
    peer_addr: str  # host:port of its broker-to-broker listener
    features: frozenset[str] = frozenset()
    ops_addr: str = ""  # host:port of its ops HTTP listener; "" when it has none to give


@dataclass(frozen=True, slots=True)
class Route:
    """One shard's assignment as this broker holds it."""

    generation: int
    state: AssignmentState
    leader: str | None = None  # node id
    replicas: tuple[str, ...] = ()
    reason: str | None = None  # a shard_unavailable reason when not served
    successor: str | None = None  # during a move: the node taking over


@dataclass(frozen=True, slots=True)
class RoutingSnapshot:
    """An immutable view: members and routes, plus the node this broker is."""

    node_id: str
    members: Mapping[str, Member] = field(default_factory=lambda: MappingProxyType({}))
    routes: Mapping[ShardId, Route] = field(default_factory=lambda: MappingProxyType({}))
    # Fleet features the control plane finalized (P/features/...): one-way, so the set
    # only grows. A broker acts on the features it implements that are in here.
    finalized: frozenset[str] = frozenset()
    # Drain keys in etcd as (key, node id): the operator's P/drains/{node} and a broker's
    # own P/progress/{node}/drain. A draining broker is left out of `topology`.
    drains: frozenset[tuple[str, str]] = frozenset()

    def route(self, shard: ShardId) -> Route | None:
        return self.routes.get(shard)

    def leads(self, shard: ShardId) -> bool:
        """Whether this broker serves `shard` now."""
        route = self.routes.get(shard)
        return (
            route is not None
            and route.leader == self.node_id
            and route.state is AssignmentState.ACTIVE
        )

    def leader_of(self, shard: ShardId) -> Member | None:
        """The live member that leads `shard`, whatever the assignment's state."""
        route = self.routes.get(shard)
        if route is None or route.leader is None:
            return None
        return self.members.get(route.leader)

    @property
    def draining(self) -> frozenset[str]:
        """The brokers being drained (by an operator, or their own at shutdown)."""
        return frozenset(node for _, node in self.drains)

    def routable_members(self) -> list[Member]:
        """Live members with a client address that are not draining, in node-id order
        (what `topology` lists: a draining broker is no entry point, though redirects
        still name it while it leads a shard)."""
        draining = self.draining
        return [
            m
            for _, m in sorted(self.members.items())
            if m.client_addr and m.node_id not in draining
        ]

    def with_drains(self, drains: Iterable[tuple[str, str]]) -> RoutingSnapshot:
        found = frozenset(drains)
        return self if found == self.drains else replace(self, drains=found)

    def with_member(self, member: Member) -> RoutingSnapshot:
        members = dict(self.members)
        members[member.node_id] = member
        return replace(self, members=MappingProxyType(members))

    def without_member(self, node_id: str) -> RoutingSnapshot:
        if node_id not in self.members:
            return self
        members = {k: v for k, v in self.members.items() if k != node_id}
        return replace(self, members=MappingProxyType(members))

    def with_finalized(self, names: Iterable[str]) -> RoutingSnapshot:
        """Add finalized features (never removes one: finalizing is one-way)."""
        grown = self.finalized | frozenset(names)
        return self if grown == self.finalized else replace(self, finalized=grown)

    def with_routes(self, changes: Iterable[tuple[ShardId, Route]]) -> RoutingSnapshot:
        """Apply assignment changes by generation; a change at or below the generation
        held for its shard is dropped. Returns `self` when nothing changed."""
        routes: dict[ShardId, Route] | None = None
        for shard, route in changes:
            held = (routes if routes is not None else self.routes).get(shard)
            if held is not None and route.generation <= held.generation:
                continue
            if routes is None:
                routes = dict(self.routes)
            routes[shard] = route
        if routes is None:
            return self
        return replace(self, routes=MappingProxyType(routes))

    def fenced(self, reason: str = "fenced") -> RoutingSnapshot:
        """The same view with every shard this broker leads made unavailable (its lease
        is lost): generations unchanged, so nothing newer is mistaken for older."""
        changed = {
            shard: replace(route, state=AssignmentState.UNAVAILABLE, reason=reason)
            for shard, route in self.routes.items()
            if route.leader == self.node_id and route.state is AssignmentState.ACTIVE
        }
        if not changed:
            return self
        routes = dict(self.routes)
        routes.update(changed)
        return replace(self, routes=MappingProxyType(routes))

    def without_route(self, shard: ShardId, generation: int) -> RoutingSnapshot:
        """A deleted assignment key (its deletion's revision is `generation`): dropped
        only if it is newer than what is held."""
        held = self.routes.get(shard)
        if held is None or generation <= held.generation:
            return self
        routes = {k: v for k, v in self.routes.items() if k != shard}
        return replace(self, routes=MappingProxyType(routes))
