"""The moving fleet of the shard-move tests (tests/fleet/test_moves.py describes the
scenarios): real etcd, the placer and three brokers over real QUIC, and the publish and
read helpers those tests share."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from felix_broker.app import Broker
from felix_broker.catalog import CacheSpec, StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import AssignmentState, RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_common.etcd_process import EtcdProcess
from felix_common.tokens import DevIssuer, TokenVerifier
from felix_controlplane.placement import Placer, ShardSpec
from felix_transport import default_impl, generate_ca
from felix_wire.binary import EventBatchSharedFrame
from felix_wire.messages import (
    AckMode,
    EventBatch,
    Publish,
    StartOffset,
    Subscribe,
    Subscribed,
)

from ..support.wire import NS, TENANT, WireClient
from .harness import NODES, Entry
from .support import PREFIX, eventually, placer

STREAM = "moving"
SHARD = ShardId(ShardKind.STREAM, TENANT, NS, STREAM, 0)
MEMORY = ShardId(ShardKind.STREAM, TENANT, NS, "in-memory", 0)
CACHE = ShardId(ShardKind.CACHE, TENANT, NS, "kv", 0)
BATCHES = (EventBatch, EventBatchSharedFrame)


@dataclass
class MovingFleet:
    brokers: dict[str, Broker]
    issuer: DevIssuer
    placer: Placer
    start: Callable[[str], Awaitable[Broker]]  # a member on its node's data and config

    async def restart(self, node: str) -> None:
        """Stop the member and start it again on its data, as a new incarnation."""
        await self.brokers[node].stop()
        self.brokers[node] = await self.start(node)

    def entry(self, node: str) -> Entry:
        return Entry(self.brokers[node], self.issuer)

    def route(self, node: str, shard: ShardId = SHARD) -> Any:
        fleet = self.brokers[node].fleet
        assert fleet is not None
        return fleet.view.snapshot.route(shard)

    def leader(self, shard: ShardId = SHARD) -> str:
        route = self.route(NODES[0], shard)
        assert route is not None and route.leader is not None
        return str(route.leader)

    def settled_on(self, node: str, shard: ShardId = SHARD) -> bool:
        """Every broker sees `node` leading the shard, active."""
        for name in self.brokers:
            route = self.route(name, shard)
            if route is None or route.leader != node or route.state is not AssignmentState.ACTIVE:
                return False
        return True


@asynccontextmanager
async def moving_fleet(
    tmp: Path, etcd: EtcdProcess, *, stream_shards: int = 1, **overrides: Any
) -> AsyncIterator[MovingFleet]:
    endpoint = etcd.endpoint
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp / "issuer")
    catalog = StaticCatalog(
        streams=[
            StreamSpec(TENANT, NS, STREAM, shards=stream_shards, durable=True),
            StreamSpec(TENANT, NS, MEMORY.name, shards=1, durable=False),
        ],
        caches=[CacheSpec(TENANT, NS, CACHE.name, shards=1)],
    )
    specs = [
        *(
            ShardSpec(ShardId(ShardKind.STREAM, TENANT, NS, STREAM, i), durable=True)
            for i in range(stream_shards)
        ),
        ShardSpec(MEMORY, durable=False),
        ShardSpec(CACHE, durable=True),
    ]
    place = placer(("127.0.0.1", etcd.client_port), "cp-test", specs)
    async with AsyncExitStack() as stack:
        task = asyncio.get_running_loop().create_task(place.run())

        async def stop_placer() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        stack.push_async_callback(stop_placer)
        brokers: dict[str, Broker] = {}
        stopped: set[int] = set()

        async def start(node: str) -> Broker:
            settings: dict[str, Any] = {
                "quic_bind": "127.0.0.1:0",
                "metrics_bind": "127.0.0.1:0",
                "peer_bind": "127.0.0.1:0",
                "data_dir": str(tmp / node),
                "durable_storage_dir": str(tmp / node / "durable"),
                "quic_impl": default_impl(),
                "node_id": node,
                "etcd_endpoints": endpoint,
                "node_lease_ttl_ms": 3000,
                "etcd_prefix": PREFIX,
                **overrides,
            }
            config = dataclasses.replace(
                load_config(environ={}, overrides=settings), catalog=catalog
            )
            view = FleetView(RoutingSnapshot(node_id=node))
            fleet = FleetNode(tls=PeerTls.issue(fleet_ca, node), view=view)
            broker = Broker(config, verifier=TokenVerifier(issuer.jwks()), fleet=fleet)
            await broker.start()
            real_stop = broker.stop

            async def stop() -> None:
                if id(broker) not in stopped:  # a restarted member was stopped already
                    stopped.add(id(broker))
                    await real_stop()

            broker.stop = stop  # type: ignore[method-assign]
            stack.push_async_callback(stop)
            return broker

        for node in NODES:
            brokers[node] = await start(node)
        moving = MovingFleet(brokers, issuer, place, start)

        def placed() -> bool:
            routes = [moving.route(NODES[0], s.shard) for s in specs]
            return (
                place.holding
                and all(r is not None and r.leader is not None for r in routes)
                and all(
                    moving.settled_on(r.leader, s.shard) for r, s in zip(routes, specs, strict=True)
                )
                and all(
                    len(b.fleet.view.snapshot.members) == 3 for b in brokers.values() if b.fleet
                )
            )

        await eventually(placed, within=30, what="three members and a placed shard")
        yield moving


def publish(payload: bytes, request_id: int) -> Publish:
    return Publish(
        tenant_id=TENANT,
        namespace=NS,
        stream=STREAM,
        payload=payload,
        request_id=request_id,
        ack=AckMode.PER_MESSAGE,
    )


async def read_all(entry: Entry, start: int, until: int) -> list[tuple[int, bytes]]:
    """The shard's records [start, until) through a subscription at `entry`."""
    client = await WireClient.connect(entry)
    try:
        control = await client.session()
        await control.send(
            Subscribe(
                tenant_id=TENANT,
                namespace=NS,
                stream=STREAM,
                shard=0,
                start=StartOffset(offset=start),
            )
        )
        subscribed = await control.recv()
        assert isinstance(subscribed, Subscribed), subscribed
        events = await client.event_stream(subscribed.subscription_id)
        out: list[tuple[int, bytes]] = []
        while start + len(out) < until:
            batch = await events.recv(timeout=10)
            assert isinstance(batch, BATCHES), batch
            assert batch.base_offset == start + len(out), (batch.base_offset, len(out))
            out.extend((batch.base_offset + i, p) for i, p in enumerate(batch.payloads))
        return out
    finally:
        client.close()
