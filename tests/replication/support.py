"""Helpers for the replication fleet tests over a real etcd: the control plane with a
Quorum stream (RF 3) defined through its API, brokers that join through etcd (with or
without the test-mode fault file), acked publishes, and what a replica's log holds."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from felix_broker.app import Broker
from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.fleet.features import ATOMIC_COMMIT, REPLICATED_CONDITIONS
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_common.catalog import Consistency
from felix_common.tokens import DevIssuer, TokenVerifier
from felix_transport import default_impl, generate_ca
from felix_wire.features import Feature
from felix_wire.messages import (
    AckMode,
    ProducerInit,
    ProducerInitOk,
    Publish,
    PublishIdempotent,
    PublishOk,
)
from tests.controlplane.support import call

from ..fleet.harness import NODES, Entry
from ..fleet.support import etcd_control_plane, eventually, replica_set_placed
from ..support.wire import NS, OFFICIAL_FEATURES, TENANT, WireClient, WireStream

STREAM = "quorum"
SHARD = ShardId(ShardKind.STREAM, TENANT, NS, STREAM, 0)
SPEC = StreamSpec(
    TENANT, NS, STREAM, durable=True, replication_factor=3, consistency=Consistency.QUORUM
)


@asynccontextmanager
async def control_plane(tmp: Path, endpoint: str) -> AsyncIterator[None]:
    """The control plane on etcd with the Quorum stream (RF 3) created through its API."""
    body = {
        "name": STREAM,
        "durability": "durable",
        "consistency": "Quorum",
        "replication_factor": 3,
    }
    async with etcd_control_plane(tmp, endpoint, body):
        yield


async def start_broker(
    tmp: Path, node_id: str, endpoint: str, fleet_ca: Any, issuer: DevIssuer, **extra: Any
) -> Broker:
    """A broker joining through etcd with the Quorum stream in its catalog; `extra`
    settings are added to its configuration."""
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "peer_bind": "127.0.0.1:0",
        "data_dir": str(tmp / node_id),
        "quic_impl": default_impl(),
        "node_id": node_id,
        "etcd_endpoints": endpoint,
        "node_lease_ttl_ms": 3000,
        **extra,
    }
    config = dataclasses.replace(
        load_config(environ={}, overrides=settings),
        catalog=StaticCatalog(streams=[SPEC], caches=[]),
    )
    fleet = FleetNode(
        tls=PeerTls.issue(fleet_ca, node_id), view=FleetView(RoutingSnapshot(node_id=node_id))
    )
    broker = Broker(config, verifier=TokenVerifier(issuer.jwks()), fleet=fleet)
    await broker.start()
    return broker


def records(broker: Broker) -> list[tuple[int, int, bytes]]:
    assert broker.engine is not None
    log = broker.engine.shard(SPEC, 0).log
    assert log is not None
    found = log.read(0, max_records=1000, max_bytes=1 << 24)
    return [(r.offset, r.timestamp_us, r.payload) for r in found]


def serving(broker: Broker) -> bool:
    held = broker.replication.driver(SHARD) if broker.replication is not None else None
    return held is not None and held.refusal() is None


async def publish_all(
    broker: Broker, issuer: DevIssuer, payloads: list[bytes], first: int = 0
) -> None:
    """Acked publishes; each ack is after the quorum mark, with its stream offset."""
    client = await WireClient.connect(Entry(broker, issuer))
    try:
        for i, payload in enumerate(payloads, start=1):
            message = Publish(
                tenant_id=TENANT,
                namespace=NS,
                stream=STREAM,
                payload=payload,
                request_id=i,
                ack=AckMode.PER_MESSAGE,
            )
            answer = await client.request(message)
            assert answer == PublishOk(request_id=i, offset=first + i - 1)
    finally:
        client.close()


QUORUM_TIMEOUT_MS = 1000


async def start_broker_with_faults(
    tmp: Path, node_id: str, endpoint: str, fleet_ca: Any, issuer: DevIssuer
) -> Broker:
    """`start_broker` with the test-mode fault file (`faults_file`) and a quorum
    timeout of QUORUM_TIMEOUT_MS."""
    return await start_broker(
        tmp,
        node_id,
        endpoint,
        fleet_ca,
        issuer,
        publish_quorum_timeout_ms=QUORUM_TIMEOUT_MS,
        test_faults_file=str(faults_file(tmp, node_id)),
    )


def faults_file(tmp: Path, node_id: str) -> Path:
    return tmp / f"{node_id}-faults.json"


async def ask(stream: WireStream, message: Any) -> Any:
    await stream.send(message)
    return await stream.recv(timeout=20)


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.fleet_ca = generate_ca("test fleet")
        self.issuer = DevIssuer.load_or_create(tmp / "issuer")
        self.brokers: dict[str, Broker] = {}

    def route(self, node: str) -> Any:
        fleet = self.brokers[node].fleet
        return fleet.view.snapshot.routes.get(SHARD) if fleet is not None else None

    async def session(self, node: str) -> tuple[WireClient, WireStream]:
        client = await WireClient.connect(Entry(self.brokers[node], self.issuer))
        return client, await client.session()


BASE: dict[str, Any] = {"tenant_id": TENANT, "namespace": NS, "stream": STREAM}


def payloads(broker: Broker) -> list[bytes]:
    return [payload for _offset, _time, payload in records(broker)]


@asynccontextmanager
async def running_quorum_fleet(
    tmp: Path,
    endpoint: str,
    *,
    finalize: tuple[str, ...] = (ATOMIC_COMMIT, REPLICATED_CONDITIONS),
    admin: list[tuple[str, str]] | None = None,
) -> AsyncIterator[tuple[Fleet, str, int]]:
    """The control plane (the `finalize` features finalized) and three brokers; yields
    the fleet, the stream shard's leader (open) and its generation. `admin` receives
    the control plane's admin URL and bootstrap secret."""
    fleet = Fleet(tmp)
    body = {"name": STREAM, "durability": "durable", "consistency": "Quorum"}
    body["replication_factor"] = 3
    async with AsyncExitStack() as stack:
        admin_url, secret = await stack.enter_async_context(etcd_control_plane(tmp, endpoint, body))
        for node in NODES:
            fleet.brokers[node] = await start_broker_with_faults(
                tmp, node, endpoint, fleet.fleet_ca, fleet.issuer
            )
            stack.push_async_callback(fleet.brokers[node].stop)

        route = await replica_set_placed(
            fleet.route, lambda leader: serving(fleet.brokers[leader]), NODES
        )
        assert sorted(route.replicas) == sorted(NODES)
        for feature in finalize:
            await finalize_feature(fleet, admin_url, secret, feature)
        if admin is not None:
            admin.append((admin_url, secret))
        yield fleet, route.leader, route.generation


async def finalize_feature(fleet: Fleet, admin_url: str, secret: str, feature: str) -> None:
    """Finalize `feature` through the admin API and wait until every broker acts on it."""
    url = f"{admin_url}/v1/fleet/features/{feature}/finalize"
    status, answer = await call("POST", url, token=secret)
    assert status == 200 and answer["enabled"] is True, answer

    def enabled() -> bool:
        return all(
            b.fleet_features is not None and feature in b.fleet_features.enabled
            for b in fleet.brokers.values()
        )

    await eventually(enabled, within=15, what=f"{feature} enabled on every broker")


async def same_everywhere(fleet: Fleet, want: list[bytes]) -> None:
    await eventually(
        lambda: all(payloads(b) == want for b in fleet.brokers.values()),
        within=15,
        what=f"every replica's stream log is {want}",
    )


# Idempotent producers on the Quorum stream.
IDEMPOTENT_FEATURES = (
    OFFICIAL_FEATURES
    | int(Feature.FEATURE_IDEMPOTENT_PRODUCER)
    | int(Feature.FEATURE_SEQUENCE_REUSED)
)


def batch(producer: int, sequence: int, records: list[bytes], rid: int) -> PublishIdempotent:
    return PublishIdempotent(
        **BASE, payloads=records, producer_id=producer, sequence=sequence, request_id=rid
    )


async def session(fleet: Fleet, node: str) -> tuple[WireClient, WireStream]:
    """A client of `node` on a stream that offered the idempotent producer features."""
    client = await WireClient.connect(Entry(fleet.brokers[node], fleet.issuer))
    return client, await client.session(features=IDEMPOTENT_FEATURES)


async def producer(s: WireStream, rid: int) -> int:
    """A new producer id, from `producer_init` on `s`."""
    answer = await ask(s, ProducerInit(request_id=rid))
    assert isinstance(answer, ProducerInitOk), answer
    return answer.producer_id
