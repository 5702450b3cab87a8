"""Helpers for the Quorum cache tests over a real etcd: the cache's shard and spec,
its requests, the fleet of brokers that joined through etcd, and what a replica holds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from felix_broker.app import Broker
from felix_broker.catalog import CacheSpec, StreamSpec
from felix_broker.fleet.routing import ShardId, ShardKind
from felix_common.catalog import Consistency
from felix_common.tokens import DevIssuer
from felix_transport import generate_ca
from felix_wire.messages import (
    CacheGet,
    CachePut,
    CounterAdd,
    CounterGet,
)

from ..fleet.harness import Entry
from ..support.wire import NS, TENANT, WireClient, WireStream

CACHE = "qcache"
SHARD = ShardId(ShardKind.CACHE, TENANT, NS, CACHE, 0)
SPEC = CacheSpec(TENANT, NS, CACHE, replication_factor=3, consistency=Consistency.QUORUM)
PLAIN = StreamSpec(TENANT, NS, "plain")
QUORUM_TIMEOUT_MS = 1000


def serving(broker: Broker) -> bool:
    replication = broker.cache_replication
    held = replication.driver(SHARD) if replication is not None else None
    return held is not None and held.refusal() is None


def put(key: str, value: bytes, rid: int) -> CachePut:
    return CachePut(
        tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, value=value, request_id=rid
    )


def get(key: str, rid: int) -> CacheGet:
    return CacheGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, request_id=rid)


def add(key: str, delta: int, rid: int) -> CounterAdd:
    return CounterAdd(
        tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, delta=delta, request_id=rid
    )


def counter(key: str, rid: int) -> CounterGet:
    return CounterGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, request_id=rid)


async def ask(stream: WireStream, message: Any) -> Any:
    await stream.send(message)
    async with asyncio.timeout(20):
        return await stream.recv()


class Fleet:
    def __init__(self, tmp: Path, endpoint: str) -> None:
        self.tmp = tmp
        self.endpoint = endpoint
        self.fleet_ca = generate_ca("test fleet")
        self.issuer = DevIssuer.load_or_create(tmp / "issuer")
        self.brokers: dict[str, Broker] = {}

    def route(self, node: str) -> Any:
        fleet = self.brokers[node].fleet
        return fleet.view.snapshot.routes.get(SHARD) if fleet is not None else None

    async def session(self, node: str) -> tuple[WireClient, WireStream]:
        client = await WireClient.connect(Entry(self.brokers[node], self.issuer))
        return client, await client.session()
