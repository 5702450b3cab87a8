"""Felix beside its peers in one run: NATS (core, JetStream, KV) and Redis.

Run: ``.venv/bin/python bench/peers.py [--quick] [--rounds N] [--seconds S] [--only W,...]``.

Every server is started here from its installed program on 127.0.0.1 with an
ephemeral port and a temporary folder, and stopped at the end:

- Felix: ``python -m felix_broker.cli`` with durable storage, fsync mode
  ``periodic`` (a second broker with ``on_commit`` for the acked-publish rows);
- NATS: ``nats-server -js`` (JetStream, file storage), driven by nats-py;
- Redis: ``redis-server`` without persistence, driven by redis-py (cache rows).

A peer whose program (or Python client) is not installed is skipped with a
message. Workloads (100-byte payloads everywhere):

- ``pubsub``: one publisher, fanout 1 and 10 subscribers, each on its own
  connection; delivered records/s over all subscribers. Felix publishes
  batches of 64 without acks to an in-memory stream, to felix_client
  subscribers and, as ``felix-raw``, to raw-frame subscribers (each event
  frame decoded by the generated layer, its payloads counted); NATS publishes
  core messages one by one (its client buffers them).
- ``latency``: one record published, then awaited at one subscriber;
  publish -> deliver p50 and p99.
- ``durable``: acked publishes to a durable stream with 1 and 32 in flight.
  Felix acks after the write (``ack_on_commit`` asked by the client): the
  record is in the page cache, as a JetStream PubAck means; the ``on_commit``
  row (ack after fsync) is printed beside it, against the same JetStream figure.
- ``workqueue``: one consumer reading a pre-filled durable stream; Felix a
  consumer group through felix_client's ``Consumer`` (``batch`` B and
  ``max_in_flight`` 2B, so its next poll of B can overlap the last B's acks,
  as a JetStream fetch may go out before the last fetch's acks are processed;
  each ``record.ack()`` runs as its own task, and a record counts once its ack
  is answered, which the broker does once the ack is durable) and, as
  ``felix-raw``, over raw frames (poll up to B; their acks go out with the next
  poll, every ack's answer awaited), NATS a JetStream pull consumer (fetch B,
  ``msg.ack()`` each, which nats-py sends without awaiting an answer, before
  the next fetch).
- ``kv``: put and get with 1 and 32 requests in flight over 1,000 keys; Felix's
  cache (log-backed, periodic) through felix_client and, as ``felix-raw``,
  through frames of the generated layer on one stream (the broker's share
  without the client's), NATS KV (file storage), Redis SET/GET (32 pooled
  connections at 32 in flight).

Every cell (one workload setting on one system) runs in a fresh client
process; each round runs the systems in alternating order. The table shows
the median of the rounds with min-max, and the ratio Felix/peer per round
(median and min-max). For throughput a ratio above 1 means Felix is faster;
for latency a ratio above 1 means Felix is slower. The machine these run on is
shared: compare ratios from one run, not absolute figures across runs. A full
run takes about 10 minutes (half again with ``--baseline``), ``--quick`` about
2 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TENANT, NS = "t1", "default"
FAN, DUR, JOBS, KV = "fan", "dur", "jobs", "kv"
PAYLOAD = b"p" * 100
KEYS = 1000
BATCH = 64

CATALOG = f"""\
catalog:
  tenants:
    {TENANT}:
      namespaces:
        {NS}:
          streams:
            {FAN}: {{durable: false, shards: 1}}
            {DUR}: {{durable: true, shards: 1}}
            {JOBS}: {{durable: true, shards: 1}}
          caches:
            {KV}: {{shards: 1}}
"""

Cell = dict[str, Any]
Figures = dict[str, float]
# (row label, system, metric) -> round -> value
Results = dict[tuple[str, str, str], dict[int, float]]


# --- servers --------------------------------------------------------------------------


@dataclass
class Server:
    """A peer's process, and what its clients need to reach it."""

    name: str
    process: subprocess.Popen[bytes]
    target: dict[str, Any] = field(default_factory=dict)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _wait_for_line(log: Path, needle: str, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if log.exists():
            for line in log.read_text(errors="replace").splitlines():
                if needle in line:
                    return line
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited: {log.read_text(errors='replace')}")
        time.sleep(0.05)
    raise RuntimeError(f"no {needle!r} in {log} within 30 s")


def start_felix(tmp: Path, fsync_mode: str, source: Path | None = None) -> Server:
    """A broker from this checkout, or from the source tree `source` (a baseline)."""
    data = tmp / (f"felix-{fsync_mode}" if source is None else "felix-base")
    data.mkdir()
    (data / "broker.yaml").write_text(CATALOG)
    common = [sys.executable, "-m", "felix_broker.cli", "--data-dir", str(data)]
    path = str(ROOT) if source is None else f"{source}{os.pathsep}{source / 'generated'}"
    env = dict(os.environ, PYTHONPATH=path)
    log = data / "stdout.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *common,
                "--config",
                str(data / "broker.yaml"),
                "--quic-bind",
                "127.0.0.1:0",
                "--metrics-bind",
                "127.0.0.1:0",
                "--set",
                f"durable_fsync_mode={fsync_mode}",
                # Unacked publishes wait for queue room instead of being shed, and a
                # subscriber queue holds a whole measurement's burst: every published
                # record must arrive for the delivered-records figure to mean anything.
                "--set",
                "pub_ingress_wait=true",
                "--set",
                "subscriber_queue_capacity=4096",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = Server(f"felix-{fsync_mode}", process)
    try:
        quic = _wait_for_line(log, "QUIC on", process)
        ca = _wait_for_line(log, "CA certificate", process).rsplit(" ", 1)[1]
        port = int(quic.split("QUIC on ", 1)[1].split()[0].rsplit(":", 1)[1])
        token = subprocess.run(
            [*common, "token", "--tenant", TENANT, "--ttl", "86400"],
            check=True,
            capture_output=True,
            env=env,
        ).stdout.decode()
    except BaseException:
        server.stop()
        raise
    server.target = {"addr": f"127.0.0.1:{port}", "ca": ca, "token": token.strip()}
    return server


def start_nats(tmp: Path) -> Server:
    binary = shutil.which("nats-server")
    assert binary is not None
    data = tmp / "nats"
    data.mkdir()
    log = data / "server.log"
    process = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", str(data), "-l", str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Server("nats", process)
    try:
        line = _wait_for_line(log, "Listening for client connections on", process)
    except BaseException:
        server.stop()
        raise
    server.target = {"url": "nats://" + line.rsplit(" ", 1)[1]}
    return server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_redis(tmp: Path) -> Server:
    binary = shutil.which("redis-server")
    assert binary is not None
    data = tmp / "redis"
    data.mkdir()
    log = data / "server.log"
    port = _free_port()  # redis-server cannot report a port it chose itself
    process = subprocess.Popen(
        [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(data),
            "--logfile",
            str(log),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Server("redis", process)
    try:
        _wait_for_line(log, "Ready to accept connections", process)
    except BaseException:
        server.stop()
        raise
    server.target = {"url": f"redis://127.0.0.1:{port}/0"}
    return server


# --- Felix clients ----------------------------------------------------------------------


async def felix_client(target: dict[str, Any], *, ack_on_commit: bool = False) -> Any:
    import felix_client

    config = felix_client.ClientConfig(ack_on_commit=ack_on_commit)
    return await felix_client.connect(
        target["addr"],
        tenant_id=TENANT,
        token=target["token"],
        namespace=NS,
        ca_file=target["ca"],
        config=config,
    )


class RawFelix:
    """One authenticated stream of raw frames, for the requests felix_client lacks."""

    def __init__(self, connection: Any, stream: Any) -> None:
        from felix_wire.frame import FrameReader

        self.connection = connection
        self.stream = stream
        self.reader = FrameReader()
        self.pending: list[Any] = []
        self.rid = 0
        self.waiters: dict[int, asyncio.Future[Any]] = {}
        self.dispatcher: asyncio.Future[None] | None = None

    @classmethod
    async def open(cls, target: dict[str, Any]) -> RawFelix:
        from felix_transport import TransportConfig, connect
        from felix_wire.gating import client_auth
        from felix_wire.messages import AuthOk

        config = TransportConfig.client(Path(target["ca"]).read_bytes())
        host, port = target["addr"].rsplit(":", 1)
        connection = await connect(config, host, int(port))
        raw = cls(connection, await connection.open_bidi_stream())
        auth = client_auth(TENANT, target["token"], client_flags=0x1FFF, client_features=0xFB77FFFF)
        await raw.send(auth)
        answer = await raw.recv()
        assert isinstance(answer, AuthOk), answer
        return raw

    async def send(self, *messages: Any) -> None:
        from felix_wire.codec import encode_frame

        await self.stream.write(b"".join(encode_frame(m) for m in messages))

    async def recv(self) -> Any:
        from felix_wire.codec import decode_frame

        while not self.pending:
            data = await self.stream.read()
            if not data:
                raise EOFError("stream ended")
            self.pending.extend(decode_frame(f) for f in self.reader.feed(data))
        return self.pending.pop(0)

    async def call(self, build: Callable[[int], Any]) -> Any:
        """Send `build(request_id)` and wait for the answer with that request_id; many
        calls may be in flight, one reader task matches answers to them."""
        self.rid += 1
        rid = self.rid
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters[rid] = future
        if self.dispatcher is None:
            self.dispatcher = asyncio.ensure_future(self._dispatch())
        await self.send(build(rid))
        return await future

    async def _dispatch(self) -> None:
        while True:
            answer = await self.recv()
            waiter = self.waiters.pop(answer.request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(answer)


# --- workloads --------------------------------------------------------------------------


async def until(seconds: float, workers: int, one: Callable[[int], Awaitable[int]]) -> Figures:
    """Run `workers` loops of `one(worker)` (each returning a count) for `seconds`."""
    stop = time.perf_counter() + seconds
    done = [0] * workers

    async def loop(worker: int) -> None:
        while time.perf_counter() < stop:
            got = await one(worker)
            if got == 0:
                return  # nothing left (a drained work queue)
            done[worker] += got

    started = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in range(workers)))
    return {"rate": sum(done) / (time.perf_counter() - started)}


def quantiles(samples: list[float]) -> Figures:
    samples.sort()

    def pick(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] * 1e6

    return {"p50": pick(0.50), "p99": pick(0.99)}


async def count_until(counter: Callable[[], int], target: int, idle: float = 2.0) -> float:
    """Wait until counter() reaches target or stops moving for `idle` s; the time of
    the last progress."""
    last, seen = time.perf_counter(), -1
    while counter() < target:
        now = counter()
        if now != seen:
            last, seen = time.perf_counter(), now
        elif time.perf_counter() - last > idle:
            break
        await asyncio.sleep(0.005)
    return time.perf_counter() if counter() >= target else last


async def felix_pubsub(target: dict[str, Any], fanout: int, records: int) -> Figures:
    from felix_wire.messages import AckMode

    subscribers = [await felix_client(target) for _ in range(fanout)]
    publisher = await felix_client(target)
    counts = [0] * fanout
    subs = [await c.subscribe(FAN).open() for c in subscribers]

    async def drain(i: int) -> None:
        async for _ in subs[i]:
            counts[i] += 1

    readers = [asyncio.ensure_future(drain(i)) for i in range(fanout)]
    batch = [PAYLOAD] * BATCH
    started = time.perf_counter()
    for _ in range(records // BATCH):
        await publisher.publish_batch(FAN, batch, ack=AckMode.NONE)
    ended = await count_until(lambda: sum(counts), fanout * records)
    figures = {"rate": sum(counts) / (ended - started), "lost": fanout * records - sum(counts)}
    for reader in readers:
        reader.cancel()
    for client in [publisher, *subscribers]:
        await client.aclose()
    return figures


async def felix_raw_pubsub(target: dict[str, Any], fanout: int, records: int) -> Figures:
    """`felix_pubsub` with raw-frame subscribers: each event frame decoded by the
    generated layer and its payloads counted, no client object per event (what
    felix_client's subscriber is held against: issue 21 asks for >= 80% of it)."""
    from felix_wire.codec import decode_frame
    from felix_wire.frame import FrameReader
    from felix_wire.messages import AckMode, Subscribe, Subscribed

    raws = [await RawFelix.open(target) for _ in range(fanout)]
    events = []
    for i, raw in enumerate(raws):
        await raw.send(Subscribe(tenant_id=TENANT, namespace=NS, stream=FAN, subscription_id=i + 1))
        answer = await raw.recv()
        assert isinstance(answer, Subscribed), answer
        events.append(await raw.connection.accept_stream())
    counts = [0] * fanout

    async def drain(i: int) -> None:
        reader = FrameReader()
        stream = events[i]
        while data := await stream.read():
            for frame in reader.feed(data):
                payloads = getattr(decode_frame(frame), "payloads", None)
                if payloads is not None:  # an event batch (the hello has none)
                    counts[i] += len(payloads)

    readers = [asyncio.ensure_future(drain(i)) for i in range(fanout)]
    publisher = await felix_client(target)
    batch = [PAYLOAD] * BATCH
    started = time.perf_counter()
    for _ in range(records // BATCH):
        await publisher.publish_batch(FAN, batch, ack=AckMode.NONE)
    ended = await count_until(lambda: sum(counts), fanout * records)
    figures = {"rate": sum(counts) / (ended - started), "lost": fanout * records - sum(counts)}
    for reader in readers:
        reader.cancel()
    await publisher.aclose()
    for raw in raws:
        raw.connection.close()
    return figures


async def nats_pubsub(target: dict[str, Any], fanout: int, records: int) -> Figures:
    import nats

    subscribers = [await nats.connect(target["url"]) for _ in range(fanout)]
    publisher = await nats.connect(target["url"])
    counts = [0] * fanout
    for i, nc in enumerate(subscribers):

        async def handler(_msg: Any, i: int = i) -> None:
            counts[i] += 1

        await nc.subscribe(FAN, cb=handler, pending_msgs_limit=records + 1)
        await nc.flush()
    started = time.perf_counter()
    for _ in range(records):
        await publisher.publish(FAN, PAYLOAD)
    await publisher.flush()
    ended = await count_until(lambda: sum(counts), fanout * records)
    figures = {"rate": sum(counts) / (ended - started), "lost": fanout * records - sum(counts)}
    for nc in [publisher, *subscribers]:
        await nc.close()
    return figures


async def felix_latency(target: dict[str, Any], samples: int) -> Figures:
    from felix_wire.messages import AckMode

    subscriber, publisher = await felix_client(target), await felix_client(target)
    sub = await subscriber.subscribe(FAN).open()
    times: list[float] = []
    lost = 0
    for i in range(samples + 50):
        start = time.perf_counter()
        await publisher.publish(FAN, PAYLOAD, ack=AckMode.NONE)
        try:
            await sub.next(timeout=2)
        except TimeoutError:
            lost += 1  # reported; a lost record is no sample
            continue
        if i >= 50:  # the first ones warm connections up
            times.append(time.perf_counter() - start)
    await publisher.aclose()
    await subscriber.aclose()
    return {**quantiles(times), "lost": lost}


async def nats_latency(target: dict[str, Any], samples: int) -> Figures:
    import nats
    import nats.errors

    subscriber, publisher = await nats.connect(target["url"]), await nats.connect(target["url"])
    sub = await subscriber.subscribe(FAN)
    await subscriber.flush()
    times: list[float] = []
    lost = 0
    for i in range(samples + 50):
        start = time.perf_counter()
        await publisher.publish(FAN, PAYLOAD)
        try:
            await sub.next_msg(timeout=2)
        except nats.errors.TimeoutError:
            lost += 1
            continue
        if i >= 50:
            times.append(time.perf_counter() - start)
    await publisher.close()
    await subscriber.close()
    return {**quantiles(times), "lost": lost}


async def felix_durable(target: dict[str, Any], inflight: int, seconds: float) -> Figures:
    client = await felix_client(target, ack_on_commit=True)

    async def one(_worker: int) -> int:
        offset = await client.publish(DUR, PAYLOAD)
        assert offset is not None  # acked after the write, with its offset
        return 1

    await one(0)
    figures = await until(seconds, inflight, one)
    await client.aclose()
    return figures


async def nats_durable(target: dict[str, Any], inflight: int, seconds: float) -> Figures:
    import nats

    nc = await nats.connect(target["url"])
    js = nc.jetstream()

    async def one(_worker: int) -> int:
        await js.publish(f"{DUR}.x", PAYLOAD)
        return 1

    await one(0)
    figures = await until(seconds, inflight, one)
    await nc.close()
    return figures


async def felix_workqueue(
    target: dict[str, Any], batch: int, seconds: float, group: str
) -> Figures:
    """felix_client's consumer with `batch` claimed at most: each record's ack runs
    as a task; acked records (their answers received) per second."""
    client = await felix_client(target)
    consumer = client.consumer(JOBS, group=group, shards=[0], batch=batch, max_in_flight=2 * batch)
    acking: set[asyncio.Task[None]] = set()
    acked = [0]

    def done(task: asyncio.Task[None]) -> None:
        acking.discard(task)
        if not task.cancelled() and task.exception() is None:
            acked[0] += 1

    loop = asyncio.get_running_loop()
    async with consumer:
        record = await consumer.next(timeout=10)
        started = time.perf_counter()
        stop = started + seconds
        while True:
            task = loop.create_task(record.ack())
            acking.add(task)
            task.add_done_callback(done)
            if time.perf_counter() >= stop:
                break
            record = await consumer.next(timeout=10)
        await asyncio.gather(*acking)
        figures = {"rate": acked[0] / (time.perf_counter() - started)}
    await client.aclose()
    return figures


async def felix_raw_workqueue(
    target: dict[str, Any], batch: int, seconds: float, group: str
) -> Figures:
    """Poll up to `batch`, then send their acks together with the next poll (as a
    JetStream consumer's acks travel with its next pull request); every ack's answer
    (given once the ack is durable) is awaited before the records count."""
    from felix_wire.messages import CacheOk, GroupAck, GroupPoll, GroupRecords

    raw = await RawFelix.open(target)
    scope: dict[str, Any] = {
        "tenant_id": TENANT,
        "namespace": NS,
        "stream": JOBS,
        "shard": 0,
        "group": group,
    }
    unacked: list[int] = []

    async def exchange(poll: bool) -> int:
        """Ack what the last poll took (and poll again); the records now acked."""
        messages: list[Any] = []
        for offset in unacked:
            raw.rid += 1
            messages.append(GroupAck(**scope, offset=offset, request_id=raw.rid))
        if poll:
            raw.rid += 1
            messages.append(GroupPoll(**scope, max_records=batch, request_id=raw.rid))
        await raw.send(*messages)
        acked = len(unacked)
        unacked.clear()
        for _ in messages:
            answer = await raw.recv()
            if isinstance(answer, GroupRecords):
                unacked.extend(record.offset for record in answer.records)
            else:
                assert isinstance(answer, CacheOk), answer
        return acked

    await exchange(True)
    stop = time.perf_counter() + seconds
    started = time.perf_counter()
    done = 0
    while unacked and time.perf_counter() < stop:
        done += await exchange(True)
    done += await exchange(False)
    figures = {"rate": done / (time.perf_counter() - started)}
    raw.connection.close()
    return figures


async def nats_workqueue(target: dict[str, Any], batch: int, seconds: float, group: str) -> Figures:
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    nc = await nats.connect(target["url"])
    js = nc.jetstream()
    psub = await js.pull_subscribe(f"{JOBS}.>", durable=group, stream=JOBS.upper())

    async def one(_worker: int) -> int:
        try:
            msgs = await psub.fetch(batch, timeout=1)
        except NatsTimeout:
            return 0
        for msg in msgs:
            await msg.ack()
        return len(msgs)

    figures = await until(seconds, 1, one)
    await nc.close()
    return figures


def keys() -> list[str]:
    return [f"key-{i}" for i in range(KEYS)]


async def felix_kv(target: dict[str, Any], op: str, inflight: int, seconds: float) -> Figures:
    client = await felix_client(target)
    cache = client.cache(KV)
    names = keys()
    await asyncio.gather(*(cache.put(k, PAYLOAD) for k in names))
    turn = [0]

    async def one(_worker: int) -> int:
        turn[0] += 1
        key = names[turn[0] % KEYS]
        if op == "put":
            await cache.put(key, PAYLOAD)
        else:
            assert await cache.get(key) == PAYLOAD
        return 1

    figures = await until(seconds, inflight, one)
    await client.aclose()
    return figures


async def felix_raw_kv(target: dict[str, Any], op: str, inflight: int, seconds: float) -> Figures:
    """The cache through frames of the generated layer: the broker's share without
    felix_client's (one stream, requests pipelined by request_id)."""
    from felix_wire.messages import CacheGet, CacheOk, CachePut, CacheValue

    raw = await RawFelix.open(target)
    scope: dict[str, Any] = {"tenant_id": TENANT, "namespace": NS, "cache": KV}
    names = keys()
    for key in names:

        def put(rid: int, key: str = key) -> CachePut:
            return CachePut(**scope, key=key, value=PAYLOAD, request_id=rid)

        assert isinstance(await raw.call(put), CacheOk)
    turn = [0]

    async def one(_worker: int) -> int:
        turn[0] += 1
        key = names[turn[0] % KEYS]
        if op == "put":
            answer = await raw.call(
                lambda rid: CachePut(**scope, key=key, value=PAYLOAD, request_id=rid)
            )
            assert isinstance(answer, CacheOk), answer
        else:
            answer = await raw.call(lambda rid: CacheGet(**scope, key=key, request_id=rid))
            assert isinstance(answer, CacheValue) and answer.value == PAYLOAD, answer
        return 1

    figures = await until(seconds, inflight, one)
    raw.connection.close()
    return figures


async def nats_kv(target: dict[str, Any], op: str, inflight: int, seconds: float) -> Figures:
    import nats

    nc = await nats.connect(target["url"])
    kv = await nc.jetstream().key_value(KV)
    names = keys()
    await asyncio.gather(*(kv.put(k, PAYLOAD) for k in names))
    turn = [0]

    async def one(_worker: int) -> int:
        turn[0] += 1
        key = names[turn[0] % KEYS]
        if op == "put":
            await kv.put(key, PAYLOAD)
        else:
            assert (await kv.get(key)).value == PAYLOAD
        return 1

    figures = await until(seconds, inflight, one)
    await nc.close()
    return figures


async def redis_kv(target: dict[str, Any], op: str, inflight: int, seconds: float) -> Figures:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(target["url"], max_connections=inflight)
    names = keys()
    await client.mset({k: PAYLOAD for k in names})
    turn = [0]

    async def one(_worker: int) -> int:
        turn[0] += 1
        key = names[turn[0] % KEYS]
        if op == "put":
            await client.set(key, PAYLOAD)
        else:
            assert await client.get(key) == PAYLOAD
        return 1

    figures = await until(seconds, inflight, one)
    await client.aclose()
    return figures


async def run_cell(cell: Cell) -> Figures:
    """One measurement, in this (fresh) process."""
    system, work, t = cell["system"], cell["work"], cell["target"]
    seconds: float = cell["seconds"]
    felix = system.startswith("felix")
    if work == "pubsub":
        run = {"nats": nats_pubsub, "felix-raw": felix_raw_pubsub}.get(system, felix_pubsub)
        return await run(t, cell["n"], cell["records"])
    if work == "latency":
        return await (felix_latency if felix else nats_latency)(t, cell["samples"])
    if work == "durable":
        return await (felix_durable if felix else nats_durable)(t, cell["n"], seconds)
    if work == "workqueue":
        run_wq = {"nats": nats_workqueue, "felix-raw": felix_raw_workqueue}.get(
            system, felix_workqueue
        )
        return await run_wq(t, cell["n"], seconds, cell["group"])
    if work == "kv":
        kv = {"nats": nats_kv, "redis": redis_kv, "felix-raw": felix_raw_kv}.get(system, felix_kv)
        return await kv(t, cell["op"], cell["n"], seconds)
    raise ValueError(f"unknown workload {work}")


# --- setup of the peers' streams --------------------------------------------------------


async def felix_setup(target: dict[str, Any], records: int) -> None:
    client = await felix_client(target)
    batch = [PAYLOAD] * 500
    for _ in range(records // 500):
        await client.publish_batch(JOBS, batch)
    await client.aclose()


async def nats_setup(target: dict[str, Any], records: int) -> None:
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(target["url"])
    js = nc.jetstream()
    await js.add_stream(name=DUR.upper(), subjects=[f"{DUR}.>"], storage=StorageType.FILE)
    await js.add_stream(name=JOBS.upper(), subjects=[f"{JOBS}.>"], storage=StorageType.FILE)
    await js.create_key_value(bucket=KV, storage=StorageType.FILE)
    for i in range(records):
        await nc.publish(f"{JOBS}.x", PAYLOAD)
        if i % 5000 == 4999:
            await nc.flush()
    await nc.flush()
    deadline = time.monotonic() + 60
    while (await js.stream_info(JOBS.upper())).state.messages < records:
        if time.monotonic() > deadline:
            raise RuntimeError("JetStream did not store the work-queue records in 60 s")
        await asyncio.sleep(0.1)
    await nc.close()


# --- the run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table: a workload setting measured on several systems."""

    label: str
    work: str
    params: dict[str, Any]
    systems: tuple[str, ...]
    metrics: tuple[str, ...] = ("rate",)


def rows(quick: bool) -> list[Row]:
    records = 6_400 if quick else 32_000
    samples = 300 if quick else 2_000
    out: list[Row] = []
    for fanout in (1, 10):
        params = {"n": fanout, "records": records // fanout if fanout > 1 else records}
        systems = ("felix", "felix-raw", "nats")
        out.append(Row(f"pub/sub 100 B fanout {fanout}", "pubsub", params, systems))
    out.append(
        Row(
            "publish->deliver latency (us)",
            "latency",
            {"samples": samples},
            ("felix", "nats"),
            ("p50", "p99"),
        )
    )
    for n in (1, 32):
        systems = ("felix", "felix-on_commit", "nats")
        out.append(Row(f"acked durable publish, {n} in flight", "durable", {"n": n}, systems))
    for n in (1, 32):
        systems = ("felix", "felix-raw", "nats")
        out.append(Row(f"work queue batch {n}", "workqueue", {"n": n}, systems))
    for op in ("put", "get"):
        for n in (1, 32):
            row = Row(
                f"kv {op}, {n} in flight",
                "kv",
                {"op": op, "n": n},
                ("felix", "felix-raw", "nats", "redis"),
            )
            out.append(row)
    return out


def cell_process(cell: Cell) -> Figures:
    completed = subprocess.run(
        [sys.executable, __file__, "--cell", json.dumps(cell)],
        capture_output=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    if completed.returncode != 0:
        raise RuntimeError(f"cell {cell['system']} {cell['work']} failed:\n{completed.stderr!r}")
    result: Figures = json.loads(completed.stdout.decode().strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def peers(tmp: Path, wanted: set[str], baseline: Path | None) -> Iterator[dict[str, Server]]:
    servers: dict[str, Server] = {}
    try:
        servers["felix"] = start_felix(tmp, "periodic")
        if baseline is not None:
            servers["felix-base"] = start_felix(tmp, "periodic", baseline)
        servers["felix-raw"] = servers["felix"]  # the same broker, driven by raw frames
        if "durable" in wanted:
            servers["felix-on_commit"] = start_felix(tmp, "on_commit")
        try:
            import nats  # noqa: F401

            if shutil.which("nats-server"):
                servers["nats"] = start_nats(tmp)
            else:
                print("skipping NATS: nats-server is not installed (apt-get install nats-server)")
        except ImportError:
            print("skipping NATS: nats-py is not installed (pip install -e '.[bench]')")
        if "kv" in wanted:
            try:
                import redis  # noqa: F401

                if shutil.which("redis-server"):
                    servers["redis"] = start_redis(tmp)
                else:
                    print("skipping Redis: redis-server is not installed")
            except ImportError:
                print("skipping Redis: redis-py is not installed (pip install -e '.[bench]')")
        yield servers
    finally:
        for server in {id(s): s for s in servers.values()}.values():
            server.stop()


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.0f}"
    return f"{med:.0f} ({min(values):.0f}-{max(values):.0f})"


def fmt_ratio(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(values):.2f}-{max(values):.2f})"


def run(args: argparse.Namespace) -> None:
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    table = rows(args.quick)
    if args.only:
        table = [r for r in table if r.work in args.only.split(",")]
    wanted = {r.work for r in table}
    prefill = 15_000 if args.quick else 100_000
    with (
        tempfile.TemporaryDirectory(prefix="felix-peers-") as tmpdir,
        peers(Path(tmpdir), wanted, args.baseline) as servers,
    ):
        if "workqueue" in wanted:
            asyncio.run(felix_setup(servers["felix"].target, prefill))
            if "felix-base" in servers:
                asyncio.run(felix_setup(servers["felix-base"].target, prefill))
        if "nats" in servers:
            asyncio.run(nats_setup(servers["nats"].target, prefill if "workqueue" in wanted else 0))
        print(
            f"{rounds} round(s), {seconds:.1f} s per timed cell, a fresh client process per cell;"
            " median (min-max) over rounds"
        )
        results: Results = {}
        for index in range(rounds):
            for row_number, row in enumerate(table):
                systems = [s for s in row.systems if s in servers]
                if "felix-base" in servers:
                    systems.insert(1, "felix-base")
                if (index + row_number) % 2:
                    systems.reverse()
                for system in systems:
                    cell: Cell = {
                        "system": system,
                        "work": row.work,
                        "target": servers[system].target,
                        "seconds": seconds,
                        "group": f"g{index}x{row_number}{system.replace('-', '')}",
                        **row.params,
                    }
                    try:
                        figures = cell_process(cell)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        print(f"  note: {row.label} on {system}, round {index + 1}, failed: {exc}")
                        continue
                    for metric in row.metrics:
                        results.setdefault((row.label, system, metric), {})[index] = figures[metric]
                    if figures.get("lost"):
                        print(f"  note: {row.label} on {system} lost {figures['lost']:.0f} records")
        report(table, results, servers, rounds)


def report(table: list[Row], results: Results, servers: dict[str, Server], rounds: int) -> None:
    peers_present = [p for p in ("nats", "redis") if p in servers]
    base = "felix-base" in servers
    head = f"{'workload':<38} {'system':<16} {'figure':>26}"
    ratio_heads = "".join(f" {'Felix/' + p:>20}" for p in peers_present)
    print(head + ratio_heads + (f" {'Felix/felix-base':>20}" if base else ""))
    for row in table:
        for metric in row.metrics:
            unit = "records/s" if row.work in ("pubsub", "workqueue") else "ops/s"
            if row.work == "latency":
                unit = f"{metric} us"
            systems = list(row.systems)
            if base:
                systems.insert(1, "felix-base")
            for system in systems:
                mine = results.get((row.label, system, metric), {})
                if not mine:
                    continue
                line = f"{row.label:<38} {system:<16} {fmt(list(mine.values())) + ' ' + unit:>26}"
                others: list[str] = list(peers_present) if system.startswith("felix") else []
                if system == "felix-base":
                    others = []
                elif base and system == "felix":
                    others.append("felix-base")
                for other in others:
                    theirs = results.get((row.label, other, metric), {})
                    # Ratios of the same round only: both ran minutes apart at most.
                    ratios = [mine[r] / theirs[r] for r in sorted(mine) if theirs.get(r)]
                    line += f" {fmt_ratio(ratios):>20}"
                raw = results.get((row.label, "felix-raw", metric), {})
                if system == "felix" and raw:
                    # What felix_client costs over raw frames on the same broker.
                    ratios = [mine[r] / raw[r] for r in sorted(mine) if raw.get(r)]
                    line += f"  felix/raw {fmt_ratio(ratios)}"
                print(line)
    print(
        "ratios are per round (same-run), median (min-max) of "
        f"{rounds}; throughput above 1 = Felix faster, latency above 1 = Felix slower"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="one short round (~1.5 min)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default 3, quick 1)")
    parser.add_argument("--seconds", type=float, default=0.0, help="seconds per timed cell")
    parser.add_argument("--only", default="", help="workloads, e.g. kv,workqueue")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also run a broker from this source tree (e.g. an older commit's "
        "`git archive`) as felix-base, for same-run before/after ratios",
    )
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        import logging

        logging.basicConfig(level=logging.ERROR)
        figures = asyncio.run(run_cell(json.loads(args.cell)))
        print(json.dumps(figures))
        return
    run(args)


if __name__ == "__main__":
    main()
