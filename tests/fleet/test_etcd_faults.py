"""etcd faults under load, with real brokers: a real etcd, the placer, and three
brokers that joined through etcd, each taking acknowledged publishes through real QUIC
from its own client for the whole test.

Every write a broker's stream engine accepts is recorded with the shard, the broker
and the generation its served snapshot held for that shard (the engine is where a
publish that passed placement, here or forwarded from a peer, is admitted), and the
record is checked: no (shard, generation) accepted by two brokers, and the periods in
which two brokers accepted writes for one shard never overlap in time.

- etcd stopped by PID and started again, for less than the leases' margin: every
  broker keeps serving what it leads (no publish refused), nothing is re-placed, and
  no broker applies an assignment twice;
- one broker (the leader of an in-memory shard) cut off from etcd until its lease
  expires: it stops serving, its in-memory shards are re-placed on the others, its
  durable shards wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.catalog import Routing, StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import AssignmentState, RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_broker.streams.engine import PublishRequest
from felix_common.etcd_process import EtcdProcess
from felix_common.tokens import DevIssuer, TokenVerifier
from felix_controlplane.placement import shard_specs
from felix_transport import default_impl, generate_ca
from felix_wire.messages import AckMode, Publish, PublishOk

from ..support.tcp_proxy import TcpProxy
from ..support.wire import NS, TENANT, WireClient
from .harness import NODES, Entry
from .support import PREFIX, Accepted, Applied, check_no_two_leaders, eventually, placer

pytestmark = pytest.mark.timeout(150)

SHARDS = 3
SPECS = shard_specs([(TENANT, NS, "mem", SHARDS, False), (TENANT, NS, "dur", SHARDS, True)], [])
MEMORY = [s.shard for s in SPECS if not s.durable]
DURABLE = [s.shard for s in SPECS if s.durable]
CATALOG = StaticCatalog(
    streams=[
        StreamSpec(TENANT, NS, "mem", shards=SHARDS, routing=Routing.MODULO),
        StreamSpec(TENANT, NS, "dur", durable=True, shards=SHARDS, routing=Routing.MODULO),
    ],
    caches=[],
)


def record_accepted(broker: Broker, log: list[Accepted]) -> None:
    """Wrap this broker's engine so every batch it admits is logged with the
    generation its snapshot held (None: it did not lead the shard)."""
    assert broker.engine is not None and broker.fleet is not None
    engine, view, node_id = broker.engine, broker.fleet.view, broker.fleet.node_id
    admit = engine.publish

    async def publish(request: PublishRequest, *, acked: bool) -> asyncio.Future[int]:
        spec = request.shard.spec
        shard = ShardId(
            ShardKind.STREAM, spec.tenant_id, spec.namespace, spec.name, request.shard.index
        )
        snapshot = view.snapshot
        route = snapshot.route(shard)
        generation = route.generation if route is not None and snapshot.leads(shard) else None
        log.append(Accepted(shard, node_id, generation, time.monotonic()))  # type: ignore[arg-type]
        return await admit(request, acked=acked)

    engine.publish = publish  # type: ignore[method-assign]


@dataclass
class Load:
    """One client per broker publishing acknowledged keyed records round the shards."""

    ok: list[tuple[str, float]] = field(default_factory=list)
    refused: list[tuple[str, float, Any]] = field(default_factory=list)

    async def run(self, node: str, entry: Entry) -> None:
        client = await WireClient.connect(entry)
        try:
            stream = await client.session()
            for rid in range(1, 1_000_000):
                name = "mem" if rid % 2 else "dur"
                key = f"{node}-{rid % SHARDS}".encode()
                await stream.send(
                    Publish(
                        tenant_id=TENANT,
                        namespace=NS,
                        stream=name,
                        payload=f"{node}/{rid}".encode(),
                        key=key,
                        request_id=rid,
                        ack=AckMode.PER_MESSAGE,
                    )
                )
                answer = await stream.recv(timeout=10)
                if answer == PublishOk(request_id=rid):
                    self.ok.append((node, time.monotonic()))
                else:
                    self.refused.append((node, time.monotonic(), answer))
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.005)
        finally:
            client.close()


async def start_broker(
    tmp: Path, node_id: str, endpoint: str, fleet_ca: Any, issuer: DevIssuer, ttl_ms: int
) -> Broker:
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "peer_bind": "127.0.0.1:0",
        "data_dir": str(tmp / node_id),
        "durable_storage_dir": str(tmp / node_id / "durable"),
        "quic_impl": default_impl(),
        "node_id": node_id,
        "etcd_endpoints": endpoint,
        "etcd_prefix": PREFIX,
        "node_lease_ttl_ms": ttl_ms,
    }
    config = dataclasses.replace(load_config(environ={}, overrides=settings), catalog=CATALOG)
    fleet = FleetNode(
        tls=PeerTls.issue(fleet_ca, node_id), view=FleetView(RoutingSnapshot(node_id=node_id))
    )
    broker = Broker(config, verifier=TokenVerifier(issuer.jwks()), fleet=fleet)
    await broker.start()
    return broker


@dataclass
class Running:
    brokers: dict[str, Broker]
    issuer: DevIssuer
    accepted: list[Accepted]
    applied: dict[str, Applied]
    load: Load
    proxies: dict[str, TcpProxy]

    def view(self, node: str) -> FleetView:
        fleet = self.brokers[node].fleet
        assert fleet is not None
        return fleet.view

    def membership(self, node: str) -> Any:
        etcd = self.brokers[node].etcd
        assert etcd is not None
        return etcd.membership

    def routes(self) -> dict[str, dict[ShardId, tuple[str | None, int]]]:
        return {
            node: {s: (r.leader, r.generation) for s, r in self.view(node).snapshot.routes.items()}
            for node in self.brokers
        }


@asynccontextmanager
async def fleet_under_load(tmp: Path, etcd: EtcdProcess, *, ttl_ms: int) -> AsyncIterator[Running]:
    """Three brokers placed by a placer, every one under load; each broker reaches
    etcd through its own proxy, which the test can cut."""
    ep = ("127.0.0.1", etcd.client_port)
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp / "issuer")
    accepted: list[Accepted] = []
    load = Load()
    tasks: list[asyncio.Task[None]] = []
    async with AsyncExitStack() as stack:
        brokers: dict[str, Broker] = {}
        applied: dict[str, Applied] = {}
        proxies: dict[str, TcpProxy] = {}
        for node in NODES:
            proxies[node] = TcpProxy(*ep)
            await proxies[node].start()
            stack.push_async_callback(proxies[node].close)
            endpoint = f"127.0.0.1:{proxies[node].port}"
            brokers[node] = await start_broker(tmp, node, endpoint, fleet_ca, issuer, ttl_ms)
            stack.push_async_callback(brokers[node].stop)
            record_accepted(brokers[node], accepted)
            applied[node] = Applied(node)
            fleet = brokers[node].fleet
            assert fleet is not None
            fleet.view.add_listener(applied[node])
        p = placer(ep, "p1", SPECS)
        tasks.append(asyncio.create_task(p.run()))
        running = Running(brokers, issuer, accepted, applied, load, proxies)

        def placed() -> bool:
            for node in NODES:
                snap = running.view(node).snapshot
                if len(snap.members) != 3:
                    return False
                for spec in SPECS:
                    route = snap.route(spec.shard)
                    if route is None or route.leader is None:
                        return False
                    if route.state is not AssignmentState.ACTIVE:
                        return False
            return True

        await eventually(placed, within=30, what="every shard placed, seen by all three")
        leaders = {running.view("node-a").snapshot.route(s.shard).leader for s in SPECS}  # type: ignore[union-attr]
        assert leaders == set(NODES), leaders  # each broker leads something
        for node in NODES:
            tasks.append(asyncio.create_task(load.run(node, Entry(brokers[node], issuer))))
        try:
            yield running
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if not isinstance(result, asyncio.CancelledError):
                    assert result is None, result
            with contextlib.suppress(Exception):
                await p._client.close()


async def test_etcd_stopped_and_restarted_under_load(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    # A 15 s lease (fenced at 11.25 s): on a loaded machine etcd's stop and start
    # take seconds, and the outage must stay inside the lease's margin.
    async with fleet_under_load(tmp_path, etcd_server, ttl_ms=15000) as fleet:
        await asyncio.sleep(0.5)
        before = fleet.routes()
        incarnations = {n: fleet.membership(n).incarnation for n in NODES}
        served_before = len(fleet.load.ok)
        pid = etcd_server.pid
        assert pid is not None
        await asyncio.to_thread(etcd_server.stop)  # SIGTERM to etcd's PID
        stopped_at = time.monotonic()
        await asyncio.sleep(1.5)  # well inside the lease's margin
        assert not etcd_server.running
        during = [t for _, t in fleet.load.ok if t > stopped_at]
        await asyncio.to_thread(etcd_server.start)
        restarted_at = time.monotonic()
        assert etcd_server.pid != pid
        await asyncio.sleep(2.0)
        for node in NODES:
            assert not fleet.view(node).fenced
            assert fleet.membership(node).losses == 0
            assert fleet.membership(node).incarnation == incarnations[node]
        assert fleet.routes() == before  # nothing re-placed, no generation moved
        refused = [r for r in fleet.load.refused if r[1] >= stopped_at - 0.1]
    # Every broker went on serving while etcd was away, and nothing was refused.
    assert refused == [] and fleet.load.refused == []
    assert {n for n, t in fleet.load.ok if stopped_at < t < restarted_at} == set(NODES)
    assert len(during) > 30 and len(fleet.load.ok) > served_before + len(during)
    for applied in fleet.applied.values():
        applied.check_never_twice_nor_backwards()
        assert len(applied.seen) == len(set(applied.seen)) == len(SPECS)  # applied once
    assert all(a.generation is not None for a in fleet.accepted), "a write a broker did not lead"
    check_no_two_leaders(fleet.accepted)


async def test_a_lease_expiring_under_load_moves_the_shards_and_the_broker_stops(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with fleet_under_load(tmp_path, etcd_server, ttl_ms=1500) as fleet:
        await asyncio.sleep(0.5)
        # The victim leads an in-memory shard (to be re-placed) and maybe durable ones.
        victim = fleet.view("node-a").snapshot.route(MEMORY[0]).leader  # type: ignore[union-attr]
        assert victim in NODES
        view_a = fleet.view(victim)
        led_by_a = [s.shard for s in SPECS if view_a.snapshot.leads(s.shard)]
        assert led_by_a
        first = fleet.membership(victim).incarnation
        fleet.proxies[victim].cut()  # the victim can no longer reach etcd: its lease runs out
        await eventually(lambda: view_a.fenced, within=5, what="the victim fences itself")
        fenced_at = time.monotonic()
        assert not any(view_a.snapshot.leads(s.shard) for s in SPECS)
        others = [n for n in NODES if n != victim]
        for shard in MEMORY:  # re-placed on the brokers that kept their leases
            await eventually(
                lambda shard=shard: all(
                    (r := fleet.view(n).snapshot.route(shard)) is not None
                    and r.leader in others
                    and r.state is AssignmentState.ACTIVE
                    for n in others
                ),
                within=15,
                what=f"{shard} re-placed",
            )
        for shard in DURABLE:  # a's durable shards wait for it, never served empty
            if shard in led_by_a:
                await eventually(
                    lambda shard=shard: (
                        (r := fleet.view(others[0]).snapshot.route(shard)) is not None
                        and r.state is AssignmentState.UNAVAILABLE
                        and r.leader == victim
                    ),
                    within=15,
                    what=f"{shard} unavailable",
                )
        await asyncio.sleep(0.5)
        # the victim accepted nothing after fencing itself, and its clients are refused.
        assert not [a for a in fleet.accepted if a.node_id == victim and a.at > fenced_at]
        refused_a = [r for r in fleet.load.refused if r[0] == victim and r[1] > fenced_at]
        assert refused_a
        fleet.proxies[
            victim
        ].heal()  # the victim comes back as a new incarnation, its durable shards too
        await eventually(
            lambda: fleet.membership(victim).held,
            within=15,
            what="the victim re-registers",
        )
        assert fleet.membership(victim).incarnation > first
        await eventually(
            lambda: all(view_a.snapshot.leads(s) for s in DURABLE if s in led_by_a),
            within=15,
            what="the victim serves its durable shards again",
        )
        await asyncio.sleep(0.5)
    assert all(a.generation is not None for a in fleet.accepted), "a write a broker did not lead"
    check_no_two_leaders(fleet.accepted)
    moved = [s for s in MEMORY if s in led_by_a]
    assert MEMORY[0] in moved
    for shard in moved:  # the re-placed memory shards were written by a and then another
        assert {a.node_id for a in fleet.accepted if a.shard == shard} - {victim}
    for applied in fleet.applied.values():
        applied.check_never_twice_nor_backwards()
