"""Discovery in a fleet: `topology` and `shard_owners` from the routing snapshot.

`stream_shards` and `cache_shards` count shards as the catalog does (every
broker of a fleet has the same catalog, and the placer assigns every shard of
it), so their counts agree with `shard_owners`. An owner entry names the
leader's node id, client address (when it has one) and generation; a shard with
no serving leader has no node id and carries its `shard_unavailable` reason.
`topology` lists the live members with a client address, in node-id order.
Everything is answered locally, from this broker's snapshot (which may be stale).
"""

from __future__ import annotations

from felix_broker.catalog import Catalog
from felix_broker.discovery.service import DISCOVERY_FEATURES, DiscoveryService
from felix_broker.fleet.placement import unavailable_reason
from felix_broker.fleet.routing import AssignmentState, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_broker.session.context import RequestContext
from felix_broker.session.dispatch import DispatchTable
from felix_wire.features import Feature
from felix_wire.messages import (
    BrokerEndpoint,
    ShardOwner,
    ShardOwners,
    ShardOwnersView,
    Topology,
    TopologyView,
)

__all__ = ["CLUSTER_DISCOVERY_FEATURES", "ClusterDiscovery"]

# A fleet member also advertises FEATURE_SHARD_MOVED: a planned move or a lapsed
# lease ends its readers with shard_moved (felix_broker/fleet/moves.py), which a
# standalone broker never sends.
CLUSTER_DISCOVERY_FEATURES = DISCOVERY_FEATURES | int(
    Feature.FEATURE_TOPOLOGY | Feature.FEATURE_REDIRECT | Feature.FEATURE_SHARD_MOVED
)


class ClusterDiscovery(DiscoveryService):
    """Shard counts from the catalog; owners and the fleet from the routing snapshot."""

    def __init__(self, catalog: Catalog, view: FleetView) -> None:
        super().__init__(catalog)
        self._view = view

    @property
    def features(self) -> int:
        return CLUSTER_DISCOVERY_FEATURES

    def register(self, table: DispatchTable) -> None:
        super().register(table)
        table.register(Topology, self.topology)

    async def topology(self, request: Topology, ctx: RequestContext) -> None:
        members = self._view.snapshot.routable_members()
        brokers = [BrokerEndpoint(node_id=m.node_id, addr=m.client_addr) for m in members]
        await ctx.write(ctx.proto.message(TopologyView(brokers=brokers)))

    async def shard_owners(self, request: ShardOwners, ctx: RequestContext) -> None:
        kind = ShardKind.STREAM if request.kind == "stream" else ShardKind.CACHE
        if kind is ShardKind.STREAM:
            stream = self._visible_stream(ctx, request.tenant_id, request.namespace, request.name)
            shards = stream.shards if stream else 0
        else:
            shards = self._visible_cache_shards(
                ctx, request.tenant_id, request.namespace, request.name
            )
        snapshot = self._view.snapshot
        owners = []
        for index in range(shards):
            shard = ShardId(kind, request.tenant_id, request.namespace, request.name, index)
            route = snapshot.route(shard)
            leader = snapshot.leader_of(shard)
            generation = route.generation if route is not None else 0
            if route is not None and route.state is AssignmentState.ACTIVE and leader is not None:
                owner = ShardOwner(
                    shard=index,
                    node_id=leader.node_id,
                    addr=leader.client_addr or None,
                    generation=generation,
                )
            else:
                owner = ShardOwner(
                    shard=index,
                    generation=generation,
                    unavailable=unavailable_reason(route, leader),
                )
            owners.append(owner)
        view = ShardOwnersView(owners=owners, request_id=request.request_id)
        await ctx.write(ctx.proto.message(view))
