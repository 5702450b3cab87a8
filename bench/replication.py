"""Replication on a 3-broker fleet: what a Quorum acknowledgement costs, and failover time.

Run: ``.venv/bin/python bench/replication.py [--quick] [--rounds 3] [--kills 5]``.

One run starts, on 127.0.0.1 with ephemeral ports and a temporary folder, the chaos
runner's fleet (`chaos.fleet.ChaosFleet`: etcd, a control plane, three brokers,
each its own OS process, fsync mode ``on_commit``) with three durable one-shard
streams: ``rf1`` (replication factor 1), ``leader3`` (RF 3, ``Leader``: acknowledged
once the leader's own disk holds the write, shipped to both followers after) and
``quorum3`` (RF 3, ``Quorum``: acknowledged once a majority holds the write on
disk). A `felix_client` client connected to the shard's leader publishes 100 B
records with ``ack_on_commit`` (every ack carries its offset, after the leader's
own write at least):

- **throughput**: acknowledged publishes/s with 16 in flight;
- **latency**: publish -> ack p50/p99 of one publish at a time.

Each figure is the median of ``--rounds`` rounds with its min-max, then its ratio to
RF 1 in the same round (median of the per-round ratios). Then **failover**: ``kill -9``
of ``quorum3``'s leader while a client connected to the two others publishes in a
loop (2 s per attempt); the time from the kill to the first acknowledged publish
(on the promoted follower), median of ``--kills`` kills (the old leader restarts
after each, once its successor serves). The kill comes 1 s after the last write,
when both followers hold everything: a kill under load can stall today's failover
(the placer may promote the follower that is behind; its core refuses to open).
The lease TTL is 3 s, so most of it is the lease lapsing. The machine may be
shared and loaded: compare the ratios of one run, not absolute figures across
runs. ``--quick``: fewer publishes (a few minutes in all), the same rounds and kills.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaos.fleet import NAMESPACE, TENANT, ChaosFleet, Layout  # noqa: E402
from felix_broker.catalog import StaticCatalog, StreamSpec  # noqa: E402
from felix_client import Client, ClientConfig, connect  # noqa: E402
from felix_client.errors import BrokerError, ClientError  # noqa: E402
from felix_common.catalog import Consistency  # noqa: E402

STREAMS = ("rf1", "leader3", "quorum3")
PAYLOAD = b"x" * 100
IN_FLIGHT = 16
_OUTCOMES = (BrokerError, ClientError, TimeoutError, OSError)


class BenchLayout(Layout):
    """The chaos layout (its streams keep the fleet's readiness probe) plus the three."""

    def catalog(self) -> StaticCatalog:
        base = super().catalog()
        t, ns = TENANT, NAMESPACE
        extra = [
            StreamSpec(t, ns, "rf1", durable=True),
            StreamSpec(t, ns, "leader3", durable=True, replication_factor=3),
            StreamSpec(
                t, ns, "quorum3", durable=True, replication_factor=3, consistency=Consistency.QUORUM
            ),
        ]
        return StaticCatalog(streams=[*base.streams(), *extra], caches=list(base.caches()))


async def client_for(fleet: ChaosFleet, addrs: list[str]) -> Client:
    return await connect(
        addrs,
        tenant_id=TENANT,
        token=fleet.token,
        namespace=NAMESPACE,
        ca_file=fleet.ca_file,
        config=ClientConfig(ack_on_commit=True, request_timeout=5.0),
    )


async def leader_of(fleet: ChaosFleet, stream: str) -> str:
    client = await client_for(fleet, fleet.addrs)
    try:
        for _ in range(100):
            owners = await client.shard_owners(stream)
            addr = next((o.addr for o in owners if o.shard == 0 and o.addr), None)
            if addr:
                return addr
            await asyncio.sleep(0.2)
    finally:
        await client.aclose()
    raise RuntimeError(f"{stream} has no leader")


FAILED: dict[str, int] = {}  # publishes refused or timed out (quorum_timeout), per stream


async def _publish(client: Client, stream: str) -> bool:
    try:
        await client.publish(stream, PAYLOAD)
    except _OUTCOMES:
        FAILED[stream] = FAILED.get(stream, 0) + 1
        return False
    return True


async def throughput(client: Client, stream: str, count: int) -> float:
    """Acknowledged publishes per second (a failed one counts in FAILED, not here)."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> bool:
        async with gate:
            return await _publish(client, stream)

    began = time.perf_counter()
    acked = sum(await asyncio.gather(*(one() for _ in range(count))))
    return acked / (time.perf_counter() - began)


async def latency(client: Client, stream: str, samples: int) -> tuple[float, float]:
    took: list[float] = []
    for _ in range(samples):
        began = time.perf_counter()
        if await _publish(client, stream):
            took.append((time.perf_counter() - began) * 1e6)
    if not took:
        raise RuntimeError(f"no publish to {stream} was acknowledged")
    took.sort()
    return took[len(took) // 2], took[min(len(took) - 1, int(len(took) * 0.99))]


async def failover(fleet: ChaosFleet) -> float:
    """Seconds from kill -9 of quorum3's leader to the first ack on its successor."""
    old = await leader_of(fleet, "quorum3")
    broker = fleet.by_addr(old)
    assert broker is not None
    client = await client_for(fleet, [a for a in fleet.addrs if a != old])
    try:
        await client.publish("quorum3", PAYLOAD)
        # Both followers catch up first: today's placer may promote the one behind,
        # whose core then refuses to open, and nothing promotes the one ahead.
        await asyncio.sleep(1.0)
        began = time.perf_counter()
        await broker.kill()
        while True:
            try:
                await client.publish("quorum3", PAYLOAD, timeout=2.0)
                took = time.perf_counter() - began
                break
            except _OUTCOMES:
                if time.perf_counter() - began > 60.0:
                    raise RuntimeError("no write was accepted within 60 s of the kill") from None
                await asyncio.sleep(0.02)
    finally:
        await client.aclose()
    if not await fleet.wait_successor("quorum3", old, 60.0):
        raise RuntimeError("the successor does not serve reads")
    await broker.start()
    await fleet.wait_ready(60.0)
    return took


async def bench(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="felix-bench-repl-"))
    fleet = await ChaosFleet.start(folder / "fleet", BenchLayout())
    try:
        count = 500 if args.quick else 3000
        samples = 100 if args.quick else 1000
        kills = args.kills
        print(
            f"replication on a 3-broker fleet on this machine ({os.cpu_count()} cores, shared: "
            f"compare ratios, not absolute figures); median of {args.rounds} rounds\n"
        )
        rows: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for stream in STREAMS:
                client = await client_for(fleet, [await leader_of(fleet, stream)])
                try:
                    await throughput(client, stream, 50)  # warm the path
                    rate = await throughput(client, stream, count)
                    p50, p99 = await latency(client, stream, samples)
                finally:
                    await client.aclose()
                rows.setdefault(f"rate {stream}", []).append(rate)
                rows.setdefault(f"p50 {stream}", []).append(p50)
                rows.setdefault(f"p99 {stream}", []).append(p99)
        m = {name: statistics.median(values) for name, values in rows.items()}

        def ratio(top: str, bottom: str) -> str:
            per = [a / b for a, b in zip(rows[top], rows[bottom], strict=True)]
            return f"{statistics.median(per):.2f} ({min(per):.2f}-{max(per):.2f})"

        def spread(name: str) -> str:
            return f"{m[name]:,.0f} ({min(rows[name]):,.0f}-{max(rows[name]):,.0f})"

        print(
            f"publish -> ack, 100 B, ack_on_commit, to the leader: median (min-max) of "
            f"{args.rounds}; acks/s with {IN_FLIGHT} in flight, latency 1 at a time"
        )
        labels = {"rate": "acks/s", "p50": "p50 (us)", "p99": "p99 (us)"}
        names = {"rf1": "RF 1", "leader3": "RF 3 Leader", "quorum3": "RF 3 Quorum"}
        print(f"  {'':<13}" + "".join(f"{label:>30}" for label in labels.values()))
        for s in STREAMS:
            figures = "".join(f"{spread(f'{what} {s}'):>30}" for what in labels)
            print(f"  {names[s]:<13}{figures}")
        for s in STREAMS[1:]:
            ratios = ", ".join(f"{w} {ratio(f'{w} {s}', f'{w} rf1')}" for w in labels)
            print(f"  {names[s]} vs RF 1 (per round): {ratios}")
        times = [await failover(fleet) for _ in range(kills)]
        print(
            f"\nfailover (quorum3): kill -9 of the leader -> first ack on its successor, "
            f"median of {kills}: {statistics.median(times):.2f} s "
            f"(min {min(times):.2f}, max {max(times):.2f}; lease TTL 3 s)"
        )
        print(f"publishes not acknowledged (refused or timed out): {FAILED or 'none'}")
        print("\nper round:", {k: [round(v) for v in vs] for k, vs in rows.items()})
    finally:
        await fleet.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer publishes, 3 kills")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=5, help="failovers measured")
    args = parser.parse_args()
    if args.rounds < 1 or args.kills < 1:
        parser.error("--rounds and --kills must be at least 1")
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
