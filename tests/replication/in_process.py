"""Helpers for Quorum shards on three in-process fleet members (tests/fleet/harness.py:
real brokers, real QUIC, real storage, the routing snapshot set by the test): set a
shard's route, find its replica driver, wait until the leader serves; and the Quorum
stream those tests share."""

from __future__ import annotations

from felix_broker.app import Broker
from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.fleet.routing import AssignmentState, Route, ShardId, ShardKind
from felix_broker.replication.driver import ReplicaDriver
from felix_common.catalog import Consistency
from felix_wire.messages import AckMode, Publish

from ..fleet.harness import NODES, Fleet
from ..support.waits import until
from ..support.wire import NS, TENANT


class InProcessShard:
    """One Quorum shard of an in-process fleet; `cache` says which replication manager
    (the streams' or the caches') holds its replicas."""

    def __init__(self, shard: ShardId, *, cache: bool) -> None:
        self.shard = shard
        self.cache = cache

    def lead(self, fleet: Fleet, leader: str, generation: int) -> None:
        fleet.routes[self.shard] = Route(
            generation, AssignmentState.ACTIVE, leader=leader, replicas=NODES
        )
        fleet.publish()

    def driver(self, fleet: Fleet, node: str) -> ReplicaDriver | None:
        broker: Broker = fleet.brokers[node]
        replication = broker.cache_replication if self.cache else broker.replication
        return replication.driver(self.shard) if replication is not None else None

    def serving(self, fleet: Fleet, node: str) -> bool:
        held = self.driver(fleet, node)
        return held is not None and held.refusal() is None

    async def opened(self, fleet: Fleet, leader: str, generation: int) -> ReplicaDriver:
        """Lead the shard from `leader` at `generation`; its driver once it serves."""
        self.lead(fleet, leader, generation)
        await until(lambda: self.serving(fleet, leader))
        found = self.driver(fleet, leader)
        assert found is not None
        return found


QUORUM = StreamSpec(
    TENANT, NS, "q", durable=True, replication_factor=3, consistency=Consistency.QUORUM
)
CATALOG = StaticCatalog(streams=[QUORUM], caches=[])
SHARD = ShardId(ShardKind.STREAM, TENANT, NS, "q", 0)
QUORUM_STREAM = InProcessShard(SHARD, cache=False)
lead = QUORUM_STREAM.lead
serving = QUORUM_STREAM.serving
opened = QUORUM_STREAM.opened


def driver(fleet: Fleet, node: str) -> ReplicaDriver:
    found = QUORUM_STREAM.driver(fleet, node)
    assert found is not None
    return found


def publish(payload: bytes, request_id: int) -> Publish:
    return Publish(
        tenant_id=TENANT,
        namespace=NS,
        stream="q",
        payload=payload,
        request_id=request_id,
        ack=AckMode.PER_MESSAGE,
    )
