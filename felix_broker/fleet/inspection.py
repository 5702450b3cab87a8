"""`shard_inspect` and `subscriptions_list` at a fleet member: answered locally, from
this broker's own view (never forwarded), naming this node.

A shard's role, phase and generation come from the routing snapshot: `leader` and
`active` only for a shard this broker serves now; a shard another broker leads is
role `none`, not serving, with its assignment (leader, generation) as held here; a
shard nobody serves carries its shard_unavailable reason. A replicated shard with a
replica here adds the replica's own fields (felix_broker/replication/inspect.py):
its core's state, ballot, log length, durable length, mark and, at its leader,
each follower's matched and durable offsets and lag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from felix_broker.catalog import Catalog
from felix_broker.fleet.placement import unavailable_reason
from felix_broker.fleet.routing import AssignmentState, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_broker.inspection.service import InspectionService
from felix_broker.session.context import ConnectionState
from felix_broker.storage import LogStore
from felix_wire.messages import ShardAssignment, ShardInspect, ShardInspection

__all__ = ["ClusterInspection"]

_PHASES = {
    AssignmentState.ACTIVE: "active",
    AssignmentState.DRAINING: "draining",
    AssignmentState.MOVING: "draining",
    AssignmentState.UNAVAILABLE: "closed",
}


class ClusterInspection(InspectionService):
    """Inspection with this node's id and the snapshot's roles and generations."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        store: LogStore | None,
        connections: Callable[[], Iterable[ConnectionState]],
        view: FleetView,
        replica: Callable[[ShardId], dict[str, Any] | None] = lambda _shard: None,
    ) -> None:
        super().__init__(catalog=catalog, store=store, connections=connections)
        self._fleet = view
        self._replica = replica  # a replicated shard's replica fields here, or None
        self.node_id = view.snapshot.node_id

    def _view(self, request: ShardInspect) -> ShardInspection:
        local = super()._view(request)
        if local.shards == 0 or request.shard >= local.shards:
            return msgspec.structs.replace(local, node_id=self.node_id)
        kind = ShardKind.CACHE if request.kind == "cache" else ShardKind.STREAM
        shard = ShardId(kind, request.tenant_id, request.namespace, request.name, request.shard)
        snapshot = self._fleet.snapshot
        route = snapshot.route(shard)
        if route is None:
            return msgspec.structs.replace(
                local,
                node_id=self.node_id,
                role="none",
                phase="unassigned",
                serving=False,
                reason="not_assigned",
                generation=None,
                tail=None,
            )
        assignment = ShardAssignment(
            generation=route.generation,
            leader=route.leader or "",
            replicas=list(route.replicas),
            draining=route.state is AssignmentState.DRAINING,
            successor=route.successor,
        )
        leads = snapshot.leads(shard)
        mine = route.leader == snapshot.node_id
        replica = self._replica(shard)
        view = msgspec.structs.replace(
            local,
            node_id=self.node_id,
            role="leader" if mine else "none",
            phase=_PHASES[route.state] if mine else "unassigned",
            serving=leads,
            reason=None if leads else unavailable_reason(route, snapshot.leader_of(shard)),
            generation=route.generation,
            assignment=assignment,
            tail=local.tail if mine else None,
        )
        if replica is not None:  # a replica here: the replication log's view of it
            role = view.role if mine else "follower"
            view = msgspec.structs.replace(view, role=role, **replica)
        return view
