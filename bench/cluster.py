"""A 3-broker fleet on this machine: what forwarding costs, and what three processes add.

Run: ``.venv/bin/python bench/cluster.py [--quick] [--rounds 3] [--workers 6]``.

One run starts, on 127.0.0.1 with ephemeral ports and a temporary folder: etcd,
a control plane (SQLite catalog, placer over etcd), three fleet members and one
standalone broker, each its own OS process (``python -m felix_broker.cli``, as
``felix-broker fixture --brokers 3`` starts them), all taking the same catalog
from the control plane. Streams are in memory, payloads 100 B, publishes binary
and unacked; the brokers wait for queue room rather than shed a publish
(``FELIX_PUB_INGRESS_WAIT``), so every record published is delivered.

- **Forwarding** (stream ``lat``, 1 shard): a subscriber on the shard's owner; a
  publisher connected to the owner, then to a non-owner (which forwards every
  batch over the peer link). Throughput: delivered records/s of 64-record
  batches. Latency: publish -> deliver p50/p99 of 1-record batches, one at a
  time. The ratio non-owner/owner is the forwarding cost.
- **Aggregate** (stream ``agg``, 12 shards): ``--workers`` client processes
  share the 12 shards; per shard a publisher and a subscriber, both on the
  shard's owner (the fleet), or both on the standalone broker. Records
  delivered over all shards divided by the wall time from the first worker's
  start to the last one's end. The ratio fleet/one broker is what spreading
  the shards over three processes gives (Python runs one core per process).

Every figure is the median of ``--rounds`` rounds. The machine these run on may
be shared and loaded: compare the ratios of one run, not absolute figures
across runs. ``--quick`` runs fewer batches (about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from felix_broker.catalog import StaticCatalog, StreamSpec  # noqa: E402
from felix_broker.fixture.run import (  # noqa: E402
    FIXTURE_NAMESPACE,
    FIXTURE_TENANT,
    BrokerProcess,
    FixtureControlPlane,
    FixtureParts,
    full_rights,
    member_env,
    start_etcd,
    write_tls,
)
from felix_common.etcd import EtcdClient, parse_endpoints  # noqa: E402
from felix_common.fleet import (  # noqa: E402
    Keyspace,
    ShardId,
    ShardKind,
    decode_assignment,
    decode_member,
)
from felix_transport import Connection, Stream, TransportConfig, connect  # noqa: E402
from felix_wire.binary import PublishBatchFrame, encode_publish_batch_frame  # noqa: E402
from felix_wire.codec import encode_frame  # noqa: E402
from felix_wire.frame import FrameReader  # noqa: E402
from felix_wire.gating import client_auth  # noqa: E402
from felix_wire.messages import Subscribe  # noqa: E402
from felix_wire.routing import shard_for_key  # noqa: E402

TENANT, NS = FIXTURE_TENANT, FIXTURE_NAMESPACE
LAT, AGG, AGG_SHARDS = "lat", "agg", 12
RECORD = 100
BATCH = 64
# What a subscriber receives per published batch (in-memory stream, flags 0x1FFF):
# one event frame, 12-byte header + u32 count, then u32 length + payload per record.
PER_BATCH = 16 + BATCH * (4 + RECORD)
PER_SINGLE = 16 + 4 + RECORD
BROKER_ENV = {
    "FELIX_PUB_INGRESS_WAIT": "true",
    "FELIX_SUB_QUEUE_CAPACITY": "4096",
    "FELIX_SUBSCRIBER_QUEUE_MAX_BYTES": str(64 << 20),
}


# --- the client side (in worker processes and in the main one) -----------------------


class Client:
    def __init__(self, ca_pem: bytes, token: str) -> None:
        self.config = TransportConfig.client(ca_pem)
        self.token = token

    async def _stream(self, addr: str) -> tuple[Connection, Stream]:
        host, _, port = addr.rpartition(":")
        conn = await connect(self.config, host, int(port))
        stream = await conn.open_bidi_stream()
        return conn, stream

    def _auth(self) -> bytes:
        return encode_frame(client_auth(TENANT, self.token, client_flags=0x1FFF, client_features=0))

    async def publisher(self, addr: str) -> tuple[Connection, Stream]:
        conn, stream = await self._stream(addr)
        await stream.write(self._auth())
        reader = FrameReader()
        while not reader.feed(await stream.read()):
            pass
        return conn, stream

    async def subscriber(
        self, addr: str, stream_name: str, shard: int
    ) -> tuple[Connection, Stream]:
        conn, stream = await self._stream(addr)
        subscribe = Subscribe(tenant_id=TENANT, namespace=NS, stream=stream_name, shard=shard)
        await stream.write(self._auth() + encode_frame(subscribe))
        uni = await conn.accept_stream()
        reader = FrameReader()
        while not reader.feed(await uni.read()):  # the event_stream_hello
            pass
        return conn, uni


def batch_frame(stream: str, key: bytes, count: int) -> bytes:
    payloads = [b"r" * RECORD] * count
    return encode_publish_batch_frame(
        PublishBatchFrame(tenant_id=TENANT, namespace=NS, stream=stream, key=key, payloads=payloads)
    )


async def count_bytes(stream: Stream, target: int) -> None:
    got = 0
    while got < target:
        data = await stream.read()
        if not data:
            raise EOFError("a subscriber's stream ended early")
        got += len(data)


async def pump(
    client: Client, target: str, owner: str, stream: str, shard: int, key: bytes, batches: int
) -> float:
    """Publish `batches` batches to `target`, read them at `owner`; the seconds it took."""
    sub_conn, sub = await client.subscriber(owner, stream, shard)
    pub_conn, pub = await client.publisher(target)
    await asyncio.sleep(0.1)
    frame = batch_frame(stream, key, BATCH)
    started = time.perf_counter()
    reader = asyncio.ensure_future(count_bytes(sub, PER_BATCH * batches))
    for _ in range(batches):
        await pub.write(frame)
    async with asyncio.timeout(300):
        await reader
    elapsed = time.perf_counter() - started
    sub_conn.close()
    pub_conn.close()
    return elapsed


async def latency(
    client: Client, target: str, owner: str, key: bytes, samples: int
) -> tuple[float, float]:
    """p50 and p99 publish -> deliver of 1-record batches, in microseconds."""
    sub_conn, sub = await client.subscriber(owner, LAT, 0)
    pub_conn, pub = await client.publisher(target)
    await asyncio.sleep(0.1)
    frame = batch_frame(LAT, key, 1)
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        await pub.write(frame)
        await count_bytes(sub, PER_SINGLE)
        times.append((time.perf_counter() - started) * 1e6)
    sub_conn.close()
    pub_conn.close()
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.99) - 1)]


async def worker_main(spec: dict[str, Any]) -> None:
    """One client process of the aggregate workload: its shards, each publisher and
    subscriber on the shard's broker; prints {"start", "end", "records"} (wall clock)."""
    client = Client(Path(spec["ca"]).read_bytes(), spec["token"])
    while time.time() < spec["go"]:
        await asyncio.sleep(0.005)
    start = time.time()
    await asyncio.gather(
        *(
            pump(client, addr, addr, AGG, shard, bytes.fromhex(key), spec["batches"])
            for addr, shard, key in spec["shards"]
        )
    )
    end = time.time()
    print(
        json.dumps(
            {"start": start, "end": end, "records": BATCH * spec["batches"] * len(spec["shards"])}
        )
    )


# --- the servers -------------------------------------------------------------------


def key_for(shard: int, shards: int) -> bytes:
    """A routing key that lands on `shard` (modulo routing)."""
    for i in range(100_000):
        key = f"k{i}".encode()
        if shard_for_key(key, shards) == shard:
            return key
    raise RuntimeError(f"no key found for shard {shard}")


class Servers:
    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="felix-bench-cluster-"))
        self.parts = FixtureParts()
        self.ca_file = self.tmp / "ca.pem"
        self.token = ""
        self.fleet: dict[str, str] = {}  # node id -> client addr
        self.single = ""
        self.etcd = ""
        self.owners: dict[ShardId, str] = {}  # shard -> its owner's client addr

    async def start(self) -> None:
        catalog = StaticCatalog(
            streams=[
                StreamSpec(TENANT, NS, LAT, durable=False, shards=1),
                StreamSpec(TENANT, NS, AGG, durable=False, shards=AGG_SHARDS),
            ],
            caches=[],
        )
        ca, tls = write_tls(self.ca_file, self.tmp / "tls")
        tls_env = {key: str(value) for key, value in tls.items()}
        self.etcd = await start_etcd(self.tmp / "etcd", self.parts)
        plane = await FixtureControlPlane.start(self.tmp, self.parts, catalog, etcd=self.etcd)
        env = {
            **BROKER_ENV,
            "FELIX_CONTROLPLANE_URL": plane.url,
            "FELIX_CONTROLPLANE_SYNC_TOKEN_FILE": str(plane.sync_token_file),
        }
        members = await asyncio.gather(
            *(
                BrokerProcess.start(
                    self.tmp / node,
                    catalog,
                    {**env, **member_env(node, self.etcd, ca, self.tmp / f"{node}.peer")},
                    tls_env,
                    self.parts,
                )
                for node in ("node-1", "node-2", "node-3")
            )
        )
        single = await BrokerProcess.start(self.tmp / "single", catalog, env, tls_env, self.parts)
        self.single = single.addr
        self.token = await plane.mint(TENANT, "bench", full_rights(TENANT), 3600)
        await self._wait_placed({m.addr for m in members})

    async def _wait_placed(self, addrs: set[str]) -> None:
        client = EtcdClient(parse_endpoints(self.etcd))
        keys = Keyspace("/felix")
        try:
            deadline = time.monotonic() + 60
            while True:
                owners = await self._owners(client, keys)
                if (
                    set(self.fleet.values()) == addrs
                    and len(owners) == 1 + AGG_SHARDS
                    and all(owners.values())
                ):
                    self.owners = owners
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError("the fleet did not place every shard within 60 s")
                await asyncio.sleep(0.2)
        finally:
            await client.close()

    async def _owners(self, client: EtcdClient, keys: Keyspace) -> dict[ShardId, str]:
        _, members = await client.get_prefix(keys.members)
        self.fleet = {}
        for kv in members:
            member = decode_member(kv.value)
            self.fleet[member.node_id] = member.client_addr
        _, assignments = await client.get_prefix(keys.assignments)
        owners: dict[ShardId, str] = {}
        for kv in assignments:
            record = decode_assignment(kv.value)
            if str(record.state) == "active" and record.leader in self.fleet:
                owners[keys.shard_of(kv.key)] = self.fleet[record.leader]
        return owners

    def owner(self, stream: str, shard: int) -> str:
        return self.owners[ShardId(ShardKind.STREAM, TENANT, NS, stream, shard)]

    async def close(self) -> None:
        await self.parts.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


# --- the measurements ----------------------------------------------------------------


def aggregate(servers: Servers, fleet: bool, workers: int, batches: int) -> float:
    """Delivered records/s over the 12 shards, `workers` client processes."""
    plan: list[list[tuple[str, int, str]]] = [[] for _ in range(workers)]
    for shard in range(AGG_SHARDS):
        addr = servers.owner(AGG, shard) if fleet else servers.single
        plan[shard % workers].append((addr, shard, key_for(shard, AGG_SHARDS).hex()))
    go = time.time() + 2.0  # every worker connected and waiting by then
    procs = []
    for shards in plan:
        spec = {
            "ca": str(servers.ca_file),
            "token": servers.token,
            "go": go,
            "batches": batches,
            "shards": shards,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker", json.dumps(spec)],
                stdout=subprocess.PIPE,
            )
        )
    results: list[dict[str, float]] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"a worker failed with status {proc.returncode}")
        results.append(json.loads(out))
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    return float(sum(r["records"] for r in results) / (end - start))


async def bench(args: argparse.Namespace) -> None:
    servers = Servers()
    try:
        await servers.start()
        client = Client(servers.ca_file.read_bytes(), servers.token)
        owner = servers.owner(LAT, 0)
        non_owner = next(a for a in sorted(servers.fleet.values()) if a != owner)
        key = key_for(0, 1)
        batches = 300 if args.quick else 1500
        samples = 300 if args.quick else 1000
        agg_batches = 150 if args.quick else 600
        print(
            f"3-broker fleet vs one broker on this machine ({os.cpu_count()} cores, shared: "
            f"compare ratios, not absolute figures); median of {args.rounds} rounds\n"
        )
        rows: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, target in (("owner", owner), ("non-owner", non_owner)):
                elapsed = await pump(client, target, owner, LAT, 0, key, batches)
                rows.setdefault(f"rate {name}", []).append(BATCH * batches / elapsed)
                p50, p99 = await latency(client, target, owner, key, samples)
                rows.setdefault(f"p50 {name}", []).append(p50)
                rows.setdefault(f"p99 {name}", []).append(p99)
            for name, fleet in (("fleet", True), ("single", False)):
                rate = await asyncio.to_thread(aggregate, servers, fleet, args.workers, agg_batches)
                rows.setdefault(f"agg {name}", []).append(rate)
        m = {name: statistics.median(values) for name, values in rows.items()}

        def ratio(top: str, bottom: str) -> str:
            """The median of the per-round ratios, with their min-max."""
            per = [a / b for a, b in zip(rows[top], rows[bottom], strict=True)]
            return f"{statistics.median(per):.2f} ({min(per):.2f}-{max(per):.2f})"

        print(f"forwarding (stream {LAT}, 1 shard; subscriber on the owner)")
        print(f"  {'':<34}{'owner':>12}{'non-owner':>12}   ratio per round: median (min-max)")
        ro, rn = m["rate owner"], m["rate non-owner"]
        label = "delivered rec/s, 64 x 100 B"
        print(f"  {label:<34}{ro:>12,.0f}{rn:>12,.0f}   {ratio('rate non-owner', 'rate owner')}")
        for pct in ("p50", "p99"):
            o, n = m[f"{pct} owner"], m[f"{pct} non-owner"]
            label = f"publish -> deliver {pct} (us), 1 rec"
            print(
                f"  {label:<34}{o:>12,.0f}{n:>12,.0f}   {ratio(f'{pct} non-owner', f'{pct} owner')}"
            )
        fleet_rate, single_rate = m["agg fleet"], m["agg single"]
        print(
            f"\naggregate (stream {AGG}, {AGG_SHARDS} shards, {args.workers} client processes, "
            f"a publisher and a subscriber per shard)"
        )
        print(f"  3-broker fleet   {fleet_rate:>12,.0f} delivered rec/s")
        print(f"  one broker       {single_rate:>12,.0f} delivered rec/s")
        print(f"  ratio fleet/one  {ratio('agg fleet', 'agg single'):>12}")
        print("\nper round:", json.dumps({k: [round(v) for v in vs] for k, vs in rows.items()}))
    finally:
        await servers.close()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        asyncio.run(worker_main(json.loads(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches (about a minute)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=6, help="client processes (aggregate)")
    args = parser.parse_args()
    if args.rounds < 1 or not 1 <= args.workers <= AGG_SHARDS:
        parser.error("--rounds must be at least 1 and --workers between 1 and 12")
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
