"""The fleet end to end: a real etcd, a control plane that keeps its store there and
runs the placer, and three brokers that joined through etcd (FELIX_NODE_ID and
FELIX_ETCD_ENDPOINTS, peer certificates from one fleet CA). Nothing sets a route by
hand: what the brokers do follows from the placer's writes alone.

- a publish sent to a broker the placer did not choose lands once, on the one it chose;
- a subscribe at a non-owner is answered `not_leader` naming the placer's choice and
  the assignment's generation, which is the assignment key's etcd mod_revision.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from felix_broker.app import Broker
from felix_common.etcd import EtcdClient
from felix_common.etcd_process import EtcdProcess
from felix_common.fleet import Keyspace, decode_assignment
from felix_common.tokens import DevIssuer
from felix_transport import generate_ca
from felix_wire.messages import (
    AckMode,
    EventStreamHello,
    NotLeader,
    Publish,
    PublishOk,
    Subscribe,
    Subscribed,
)

from ..support.wire import NS, TENANT, WireClient
from .harness import NODES, Entry
from .support import SHARD, STREAM, etcd_control_plane, eventually, start_broker

pytestmark = pytest.mark.timeout(120)

KEYS = Keyspace("/felix")


@asynccontextmanager
async def control_plane(tmp: Path, endpoint: str) -> AsyncIterator[None]:
    """`felix-controlplane --store etcd` with the placer, the stream created through its
    API (tenant, namespace and stream the brokers' catalog names too)."""
    async with etcd_control_plane(tmp, endpoint, {"name": STREAM, "shards": 1}):
        yield


async def test_three_brokers_joined_through_etcd_follow_the_placer(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    endpoint = etcd_server.endpoint
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp_path / "issuer")
    probe = EtcdClient([("127.0.0.1", etcd_server.client_port)])
    async with AsyncExitStack() as stack:
        stack.push_async_callback(probe.close)
        await stack.enter_async_context(control_plane(tmp_path, endpoint))
        brokers: dict[str, Broker] = {}
        for node in NODES:
            brokers[node] = await start_broker(tmp_path, node, endpoint, fleet_ca, issuer)
            stack.push_async_callback(brokers[node].stop)

        # Every broker sees all three members and the placer's route for the shard.
        def settled() -> bool:
            for broker in brokers.values():
                assert broker.fleet is not None
                snapshot = broker.fleet.view.snapshot
                route = snapshot.routes.get(SHARD)
                if len(snapshot.members) != 3 or route is None or route.leader is None:
                    return False
            return True

        await eventually(settled, within=30, what="three members and a placed shard")
        stored = await probe.get(KEYS.assignment(SHARD))
        assert stored is not None
        owner = decode_assignment(stored.value).leader
        assert owner in NODES
        generation = stored.mod_revision
        # Every broker holds the placer's choice at the key's mod_revision (not a stored
        # field): a later re-placement would show here as a different pair.
        for broker in brokers.values():
            assert broker.fleet is not None
            route = broker.fleet.view.snapshot.routes[SHARD]
            assert (route.leader, route.generation) == (owner, generation)
        others = [node for node in NODES if node != owner]
        owner_addr = f"127.0.0.1:{brokers[owner].quic_port}"

        # A subscriber on the owner sees what a publish through a non-owner wrote, once.
        sub = await WireClient.connect(Entry(brokers[owner], issuer))
        stack.callback(sub.close)
        control = await sub.session()
        await control.send(Subscribe(tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0))
        subscribed = await control.recv()
        assert isinstance(subscribed, Subscribed), subscribed
        events = await sub.event_stream()
        assert await events.recv() == EventStreamHello(subscription_id=subscribed.subscription_id)

        pub = await WireClient.connect(Entry(brokers[others[0]], issuer))
        stack.callback(pub.close)
        publish = Publish(
            tenant_id=TENANT,
            namespace=NS,
            stream=STREAM,
            payload=b"through a non-owner",
            request_id=1,
            ack=AckMode.PER_MESSAGE,
        )
        assert await pub.request(publish) == PublishOk(request_id=1)
        batch = await events.recv()
        assert batch.payloads == [b"through a non-owner"]
        await events.nothing()

        # A subscribe at the other non-owner: not_leader, the placer's choice and the
        # assignment key's mod_revision as the generation.
        other = await WireClient.connect(Entry(brokers[others[1]], issuer))
        stack.callback(other.close)
        answer = await other.request(
            Subscribe(tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0)
        )
        assert answer == NotLeader(node_id=owner, addr=owner_addr, generation=generation)
