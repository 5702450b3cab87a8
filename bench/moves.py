"""Planned moves: how long writes are held, and how long a move takes, by shard size.

Run: ``.venv/bin/python bench/moves.py [--sizes 16,36] [--rounds 3]``.

One round starts, on 127.0.0.1 with ephemeral ports and a temporary folder, a real
etcd, the control plane's placer and three brokers that joined through etcd (in this
process, as tests/fleet/test_moves.py runs them; fsync mode ``none``), seeds the
durable shard with N MiB (256 KiB records), starts two publishers (one on the owner,
one forwarded by a non-owner; 200 B records, per-message acks, one in flight each)
and moves the shard to the third broker:

- **hold window**: from the old leader seeing the fence (``moving``) to it seeing
  the cut-over; writes to the shard are held (or refused past
  ``FELIX_SHARD_MOVE_HOLD_MS``, 2 s) only inside it;
- **move time**: from the move request to every broker seeing the cut-over;
- the longest publish round trip, publishes refused, and the bytes the old leader
  sent before and under the fence (``MoveService.stats``).

Two modes: ``fence-first`` (``FELIX_SHARD_MOVE_CATCHUP_PASSES=0``: the fence comes
at once and the whole shard is copied under it, as every move did before the
catch-up existed) and ``catch-up`` (the defaults: passes while writes are still
taken, the fence once a pass sent at most ``FELIX_SHARD_MOVE_CATCHUP_BYTES``).
Each figure is the median of ``--rounds`` rounds. Everything shares this machine's
cores (the brokers too): compare the modes of one run, not absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from felix_broker.app import Broker  # noqa: E402
from felix_broker.catalog import StaticCatalog, StreamSpec  # noqa: E402
from felix_broker.config import load_config  # noqa: E402
from felix_broker.fixture.run import full_rights  # noqa: E402
from felix_broker.fleet.node import FleetNode  # noqa: E402
from felix_broker.fleet.peer import PeerTls  # noqa: E402
from felix_broker.fleet.routing import (  # noqa: E402
    AssignmentState,
    RoutingSnapshot,
    ShardId,
    ShardKind,
)
from felix_broker.fleet.view import FleetView  # noqa: E402
from felix_common.etcd import EtcdClient  # noqa: E402
from felix_common.etcd_process import EtcdProcess  # noqa: E402
from felix_common.fleet import Keyspace  # noqa: E402
from felix_common.tokens import DevIssuer, TokenVerifier  # noqa: E402
from felix_controlplane.placement import Placer, ShardSpec  # noqa: E402
from felix_transport import TransportConfig, connect, default_impl, generate_ca  # noqa: E402
from felix_wire.codec import decode_frame, encode_frame  # noqa: E402
from felix_wire.frame import FrameReader  # noqa: E402
from felix_wire.gating import client_auth  # noqa: E402
from felix_wire.messages import AckMode, Publish, PublishOk  # noqa: E402

TENANT, NS, STREAM = "bench", "default", "moving"
SHARD = ShardId(ShardKind.STREAM, TENANT, NS, STREAM, 0)
NODES = ("node-a", "node-b", "node-c")
PREFIX = "/felix-bench-moves"
SEED_RECORD = 256 * 1024
MODES = {"fence-first": {"shard_move_catchup_passes": 0}, "catch-up": {}}


class Wire:
    """One authenticated JSON stream to a broker: send a publish, read its answer."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.reader = FrameReader()
        self.pending: list[Any] = []

    @classmethod
    async def open(cls, broker: Broker, token: str) -> tuple[Any, Wire]:
        assert broker.ca_path is not None
        config = TransportConfig.client(broker.ca_path.read_bytes())
        conn = await connect(config, "127.0.0.1", broker.quic_port)
        wire = cls(await conn.open_bidi_stream())
        await wire.stream.write(
            encode_frame(client_auth(TENANT, token, client_flags=0x1FFF, client_features=0))
        )
        await wire.recv()  # auth_ok
        return conn, wire

    async def recv(self) -> Any:
        while not self.pending:
            async with asyncio.timeout(30):
                data = await self.stream.read()
            if not data:
                raise EOFError("stream ended")
            self.pending.extend(decode_frame(f) for f in self.reader.feed(data))
        return self.pending.pop(0)

    async def publish(self, payload: bytes, request_id: int) -> Any:
        message = Publish(
            tenant_id=TENANT,
            namespace=NS,
            stream=STREAM,
            payload=payload,
            request_id=request_id,
            ack=AckMode.PER_MESSAGE,
        )
        await self.stream.write(encode_frame(message))
        return await self.recv()


@dataclasses.dataclass
class Fleet:
    brokers: dict[str, Broker]
    placer: Placer
    token: str

    def route(self, node: str) -> Any:
        fleet = self.brokers[node].fleet
        assert fleet is not None
        return fleet.view.snapshot.route(SHARD)

    def settled_on(self, node: str) -> bool:
        return all(
            (r := self.route(n)) is not None
            and r.leader == node
            and r.state is AssignmentState.ACTIVE
            and r.successor is None
            for n in self.brokers
        )


async def until(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.005)


@asynccontextmanager
async def fleet(tmp: Path, etcd: EtcdProcess, overrides: dict[str, Any]) -> AsyncIterator[Fleet]:
    ca = generate_ca("bench fleet")
    issuer = DevIssuer.load_or_create(tmp / "issuer")
    catalog = StaticCatalog(
        streams=[StreamSpec(TENANT, NS, STREAM, shards=1, durable=True)], caches=[]
    )
    specs = [ShardSpec(SHARD, durable=True)]

    async def shards() -> list[ShardSpec]:
        return specs

    client = EtcdClient([("127.0.0.1", etcd.client_port)], timeout_s=1.0)
    placer = Placer(client, Keyspace(PREFIX), "bench", shards, lease_ttl_s=2, interval_s=0.2)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(client.close)
        task = asyncio.get_running_loop().create_task(placer.run())

        async def stop_placer() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        stack.push_async_callback(stop_placer)
        brokers: dict[str, Broker] = {}
        for node in NODES:
            settings = {
                "quic_bind": "127.0.0.1:0",
                "metrics_bind": "127.0.0.1:0",
                "peer_bind": "127.0.0.1:0",
                "data_dir": str(tmp / node),
                "durable_storage_dir": str(tmp / node / "durable"),
                "quic_impl": default_impl(),
                "node_id": node,
                "etcd_endpoints": etcd.endpoint,
                "node_lease_ttl_ms": 3000,
                "etcd_prefix": PREFIX,
                **overrides,
            }
            config = dataclasses.replace(
                load_config(environ={}, overrides=settings), catalog=catalog
            )
            view = FleetView(RoutingSnapshot(node_id=node))
            node_fleet = FleetNode(tls=PeerTls.issue(ca, node), view=view)
            broker = Broker(config, verifier=TokenVerifier(issuer.jwks()), fleet=node_fleet)
            await broker.start()
            stack.push_async_callback(broker.stop)
            brokers[node] = broker
        token = issuer.mint(TENANT, subject="bench", perms=full_rights(TENANT))
        moving = Fleet(brokers, placer, token)

        def placed() -> bool:
            route = moving.route(NODES[0])
            return (
                route is not None
                and route.leader is not None
                and moving.settled_on(route.leader)
                and all(
                    b.fleet is not None and len(b.fleet.view.snapshot.members) == 3
                    for b in brokers.values()
                )
            )

        await until(placed, 30, "three members and a placed shard")
        yield moving


async def one_round(mib: int, overrides: dict[str, Any]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="felix-bench-moves-") as folder:
        tmp = Path(folder)
        etcd = EtcdProcess(tmp / "etcd")
        await asyncio.to_thread(etcd.start)
        try:
            async with fleet(tmp, etcd, overrides) as moving:
                return await measure(moving, mib)
        finally:
            await asyncio.to_thread(etcd.stop)


async def measure(moving: Fleet, mib: int) -> dict[str, float]:
    owner = moving.route(NODES[0]).leader
    target, forwarder = (n for n in NODES if n != owner)
    conn, wire = await Wire.open(moving.brokers[owner], moving.token)
    for i in range(mib * 4):
        assert isinstance(await wire.publish(bytes([i % 251]) * SEED_RECORD, i + 1), PublishOk)
    conn.close()

    loop = asyncio.get_running_loop()
    marks: dict[str, float] = {}
    old = moving.brokers[owner].fleet
    assert old is not None

    def watch(previous: RoutingSnapshot, current: RoutingSnapshot) -> None:
        route = current.route(SHARD)
        if route is None:
            return
        if route.state is AssignmentState.MOVING and "fence" not in marks:
            marks["fence"] = loop.time()
        if route.leader == target and route.state is AssignmentState.ACTIVE:
            marks.setdefault("cut", loop.time())

    old.view.add_listener(watch)
    stop = asyncio.Event()
    worst = [0.0]
    refused = [0]
    acked = [0]

    async def publisher(node: str, name: str) -> None:
        conn, wire = await Wire.open(moving.brokers[node], moving.token)
        try:
            n = 0
            while not stop.is_set():
                n += 1
                sent = loop.time()
                answer = await wire.publish(f"{name}-{n}".encode() * 25, n)
                worst[0] = max(worst[0], loop.time() - sent)
                if isinstance(answer, PublishOk):
                    acked[0] += 1
                else:
                    refused[0] += 1
                await asyncio.sleep(0.002)
        finally:
            conn.close()

    tasks = [
        loop.create_task(publisher(owner, "p1")),
        loop.create_task(publisher(forwarder, "p2")),
    ]
    await asyncio.sleep(0.5)
    started = loop.time()
    await moving.placer.move(SHARD, target)
    await until(lambda: moving.settled_on(target), 120, "the cut-over")
    ended = loop.time()
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.gather(*tasks)
    moves = moving.brokers[owner].moves
    assert moves is not None
    stats = moves.stats[SHARD]
    return {
        "hold_s": marks["cut"] - marks["fence"],
        "move_s": ended - started,
        "worst_publish_s": worst[0],
        "refused": float(refused[0]),
        "acked": float(acked[0]),
        "precopied_mib": stats.precopied_bytes / (1 << 20),
        "fenced_kib": stats.fenced_bytes / 1024,
        "passes": float(stats.passes),
    }


async def bench(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'MiB':>4} {'mode':<12} {'hold s':>7} {'move s':>7} {'worst pub s':>11} "
          f"{'refused':>7} {'acked':>6} {'passes':>6} {'before fence MiB':>16} "
          f"{'under fence KiB':>15}")  # fmt: skip
    for mib in sizes:
        for mode, overrides in MODES.items():
            rounds = [await one_round(mib, overrides) for _ in range(args.rounds)]

            def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
                return statistics.median(r[key] for r in rounds)

            print(
                f"{mib:>4} {mode:<12} {med('hold_s'):>7.2f} {med('move_s'):>7.2f} "
                f"{med('worst_publish_s'):>11.2f} {med('refused'):>7.0f} {med('acked'):>6.0f} "
                f"{med('passes'):>6.0f} {med('precopied_mib'):>16.1f} {med('fenced_kib'):>15.1f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,36", help="shard sizes in MiB (default: 16,36)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
