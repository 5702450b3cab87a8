"""Client benchmark: the felix_client API beside raw frames over felix_wire + felix_transport.

Run: ``.venv/bin/python bench/client.py [--quick] [--runs N]``. Starts a
reference broker (``felix-broker fixture``) on loopback and measures, each
through the client and through hand-driven frames on one stream in the same
run, with the ratio client/raw:

- single publishes: acked (per_message) 100 B records, 64 in flight;
- batches of 64: acked (per_batch) batches of 64 x 100 B records, 8 in flight;
- cache get latency p50/p99 with 32 requests in flight (skipped, with a note,
  when the broker does not serve cache operations), and the benchmark process's
  CPU time per get (``cpu us/req``: the client's own cost per request, much
  less sensitive to a loaded machine than latency) and the broker's
  (``broker us/req``, from /proc);
- consumer groups: records/s of the high-level consumer (`client.consumer`,
  one shard, as an application writes it: `await record.ack()` per record, and
  with the acks left to run as tasks) against the raw poll/ack loop of
  bench/groups.py (polls of 32, the batch's acks pipelined, awaited before the
  next poll). Each run fills the shard with fresh records for a fresh group;
- the idempotent producer (`client.producer`, single 100 B records, its 64
  batches in flight) against plain acked publishes (64 in flight) to the same
  durable stream, in the same run.

Figures are medians over the runs. Broker and benchmark are separate
processes; both share the machine, so absolute numbers depend on it and the
ratios are the point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import felix_client
from bench.wire import WireStream, open_session
from felix_client._session import DEFAULT_OFFER
from felix_transport import StreamClosedError
from felix_wire.binary import BinaryAckMode, PublishAckFrame, PublishBatchFrame
from felix_wire.codec import decode_payload, encode_frame
from felix_wire.features import Feature
from felix_wire.messages import (
    CacheGet,
    CacheOk,
    CachePut,
    CacheValue,
    GroupAck,
    GroupPoll,
    GroupRecords,
)

RECORD = b"r" * 100
Result = dict[str, float]


# -- the broker ----------------------------------------------------------------------


def start_broker(tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    out = tmp / "fixture.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "felix_broker.cli",
            "fixture",
            "--out",
            str(out),
            "--ca-file",
            str(tmp / "ca.pem"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not out.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the reference broker did not start")
        time.sleep(0.05)
    doc = json.loads(out.read_text())
    doc["broker_pid"] = process.pid
    return process, doc


def broker_cpu(doc: dict[str, Any]) -> float:
    """CPU seconds the broker process has used (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{doc['broker_pid']}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime, fields 14 and 15 of stat(5), in clock ticks.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- raw frames ----------------------------------------------------------------------


class RawStream:
    """One authenticated stream driven by hand: frames in, answers by request id."""

    def __init__(self, wire: WireStream) -> None:
        # The authenticated stream and its frame reader (which may hold a partial frame).
        self.stream = wire.stream
        self.reader = wire.reader
        self.waiters: dict[int, asyncio.Future[object]] = {}
        self.next_id = 1
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, doc: dict[str, Any]) -> tuple[RawStream, Any]:
        host, port = doc["addrs"][0].rsplit(":", 1)
        connection, wire = await open_session(
            Path(doc["ca_file"]).read_bytes(),
            int(port),
            doc["tenant_id"],
            doc["token"],
            host=host,
            flags=DEFAULT_OFFER.flags,
            features=DEFAULT_OFFER.features,
        )
        raw = cls(wire)
        raw.task = asyncio.get_running_loop().create_task(raw.read_loop())
        return raw, connection

    async def read_loop(self) -> None:
        with contextlib.suppress(StreamClosedError):
            await self._read_frames()

    async def _read_frames(self) -> None:
        while data := await self.stream.read():
            for frame in self.reader.feed(data):
                answer: Any = decode_payload(frame.flags, frame.payload)
                future = self.waiters.pop(answer.request_id, None)
                if future is not None:
                    future.set_result(answer)

    async def request(self, frame_for: Callable[[int], bytes]) -> object:
        request_id = self.next_id
        self.next_id += 1
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.waiters[request_id] = future
        await self.stream.write(frame_for(request_id))
        return await future


# -- workloads -----------------------------------------------------------------------


async def in_flight(total: int, depth: int, one: Callable[[], Awaitable[object]]) -> float:
    """Run `total` calls with `depth` in flight; seconds taken."""
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await one()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(depth)))
    return time.perf_counter() - start


def throughput(records: int, seconds: float) -> Result:
    return {"rec/s": records / seconds, "MB/s": records * len(RECORD) / seconds / 1e6}


async def publish_client(doc: dict[str, Any], n: int, batch: int, depth: int) -> Result:
    async with await felix_client.connect(
        doc["addrs"],
        tenant_id=doc["tenant_id"],
        token=doc["token"],
        namespace=doc["namespace"],
        ca_file=doc["ca_file"],
    ) as client:
        stream = doc["memory_stream"]
        payloads = [RECORD] * batch
        await client.publish(stream, RECORD)

        async def one() -> object:
            if batch == 1:
                return await client.publish(stream, RECORD)
            return await client.publish_batch(stream, payloads)

        seconds = await in_flight(n // batch, depth, one)
    return throughput(n, seconds)


async def publish_raw(doc: dict[str, Any], n: int, batch: int, depth: int) -> Result:
    raw, connection = await RawStream.open(doc)
    payloads = [RECORD] * batch
    mode = BinaryAckMode.PER_MESSAGE if batch == 1 else BinaryAckMode.PER_BATCH

    def frame(request_id: int) -> bytes:
        return encode_frame(
            PublishBatchFrame(
                request_id=request_id,
                ack_mode=mode,
                tenant_id=doc["tenant_id"],
                namespace=doc["namespace"],
                stream=doc["memory_stream"],
                payloads=payloads,
            )
        )

    async def one() -> object:
        answer = await raw.request(frame)
        assert isinstance(answer, PublishAckFrame) and answer.status == 0
        return answer

    seconds = await in_flight(n // batch, depth, one)
    connection.close()
    return throughput(n, seconds)


async def publish_idempotent(doc: dict[str, Any], n: int) -> Result:
    """Single records through the idempotent producer (its 64 batches in flight)."""
    client = await _connect(doc)
    async with client, client.producer(doc["durable_stream"]) as producer:
        await producer.publish(RECORD)
        start = time.perf_counter()
        for _ in range(n):
            await producer.send(RECORD)  # waits while 64 are unanswered
        await producer.flush()
        seconds = time.perf_counter() - start
    return throughput(n, seconds)


async def publish_acked(doc: dict[str, Any], n: int) -> Result:
    """Plain acked single publishes to the same stream, 64 in flight."""
    async with await _connect(doc) as client:
        stream = doc["durable_stream"]
        await client.publish(stream, RECORD)
        seconds = await in_flight(n, 64, lambda: client.publish(stream, RECORD))
    return throughput(n, seconds)


def percentiles(samples: list[float]) -> Result:
    samples.sort()

    def pick(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] * 1e6

    return {"p50 us": pick(0.50), "p99 us": pick(0.99)}


async def cache_client(doc: dict[str, Any], n: int, depth: int) -> Result:
    async with await felix_client.connect(
        doc["addrs"],
        tenant_id=doc["tenant_id"],
        token=doc["token"],
        namespace=doc["namespace"],
        ca_file=doc["ca_file"],
    ) as client:
        cache = client.cache(doc["cache"])
        keys = [f"bench-{i}" for i in range(64)]
        await asyncio.gather(*(cache.put(k, RECORD) for k in keys))
        samples: list[float] = []
        turn = 0

        async def one() -> object:
            nonlocal turn
            turn += 1
            start = time.perf_counter()
            value = await cache.get(keys[turn % len(keys)])
            samples.append(time.perf_counter() - start)
            return value

        cpu, served = time.process_time(), broker_cpu(doc)
        await in_flight(n, depth, one)
        cpu, served = time.process_time() - cpu, broker_cpu(doc) - served
    return {**percentiles(samples), "cpu us/req": cpu / n * 1e6, "broker us/req": served / n * 1e6}


async def cache_raw(doc: dict[str, Any], n: int, depth: int) -> Result:
    raw, connection = await RawStream.open(doc)
    scope = {"tenant_id": doc["tenant_id"], "namespace": doc["namespace"], "cache": doc["cache"]}
    keys = [f"bench-{i}" for i in range(64)]
    for key in keys:

        def put(rid: int, key: str = key) -> bytes:
            return encode_frame(CachePut(**scope, key=key, value=RECORD, request_id=rid))

        await raw.request(put)
    samples: list[float] = []
    turn = 0

    async def one() -> object:
        nonlocal turn
        turn += 1
        key = keys[turn % len(keys)]
        start = time.perf_counter()
        answer = await raw.request(
            lambda rid: encode_frame(CacheGet(**scope, key=key, request_id=rid))
        )
        samples.append(time.perf_counter() - start)
        assert isinstance(answer, CacheValue)
        return answer

    cpu, served = time.process_time(), broker_cpu(doc)
    await in_flight(n, depth, one)
    cpu, served = time.process_time() - cpu, broker_cpu(doc) - served
    connection.close()
    return {**percentiles(samples), "cpu us/req": cpu / n * 1e6, "broker us/req": served / n * 1e6}


async def _group_ready(doc: dict[str, Any], records: int) -> tuple[str, int]:
    """A fresh group at the tail of one shard, then `records` new records there."""
    group = f"bench-{time.monotonic_ns()}"
    async with await _connect(doc) as client:
        stream = doc["durable_stream"]
        shard = await client.shard_for_key(stream, b"bench")
        await client.group(stream, group).seek(shard, "latest")
        for start in range(0, records, 500):
            count = min(500, records - start)
            await client.publish_batch(stream, [RECORD] * count, key=b"bench")
    return group, shard


async def _connect(doc: dict[str, Any]) -> felix_client.Client:
    return await felix_client.connect(
        doc["addrs"],
        tenant_id=doc["tenant_id"],
        token=doc["token"],
        namespace=doc["namespace"],
        ca_file=doc["ca_file"],
    )


async def consume_client(doc: dict[str, Any], n: int, acks_in_tasks: bool) -> Result:
    group, shard = await _group_ready(doc, n)
    async with await _connect(doc) as client:
        consumer = client.consumer(
            doc["durable_stream"], group=group, shards=[shard], batch=32, wait=0.5
        )
        pending: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        async with consumer:
            for _ in range(n):
                record = await consumer.next(timeout=30)
                if acks_in_tasks:
                    task = asyncio.get_running_loop().create_task(record.ack())
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                else:
                    await record.ack()
            await asyncio.gather(*pending)
            seconds = time.perf_counter() - start
    return throughput(n, seconds)


async def consume_raw(doc: dict[str, Any], n: int) -> Result:
    group, shard = await _group_ready(doc, n)
    raw, connection = await RawStream.open(doc)
    scope = {
        "tenant_id": doc["tenant_id"],
        "namespace": doc["namespace"],
        "stream": doc["durable_stream"],
        "shard": shard,
        "group": group,
    }

    def poll(rid: int) -> bytes:
        return encode_frame(GroupPoll(**scope, max_records=32, wait_ms=500, request_id=rid))

    def ack(offset: int) -> Callable[[int], bytes]:
        return lambda rid: encode_frame(GroupAck(**scope, offset=offset, request_id=rid))

    done = 0
    start = time.perf_counter()
    while done < n:
        answer = await raw.request(poll)
        assert isinstance(answer, GroupRecords) and answer.records, answer
        acks = await asyncio.gather(*(raw.request(ack(r.offset)) for r in answer.records))
        assert all(isinstance(a, CacheOk) for a in acks)
        done += len(answer.records)
    seconds = time.perf_counter() - start
    connection.close()
    return throughput(done, seconds)


# -- driver --------------------------------------------------------------------------


def median(results: list[Result]) -> Result:
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


async def serves_cache(doc: dict[str, Any]) -> bool:
    async with await felix_client.connect(
        doc["addrs"],
        tenant_id=doc["tenant_id"],
        token=doc["token"],
        namespace=doc["namespace"],
        ca_file=doc["ca_file"],
    ) as client:
        # Cache get/put have no feature bit; a broker serving caches advertises
        # their siblings (delete, watch, counters) alongside.
        if not client.supports(Feature.FEATURE_CACHE_DELETE):
            return False
        try:
            await client.cache(doc["cache"]).get("probe")
        except felix_client.NotSupportedByBrokerError:
            return False
    return True


async def run(doc: dict[str, Any], runs: int, quick: bool, only: str | None = None) -> None:
    singles = 2_000 if quick else 20_000
    batched = 64 * (100 if quick else 1_000)
    gets = 2_000 if quick else 20_000
    rows: list[tuple[str, Result, Result, str]] = []
    cases: list[
        tuple[str, Callable[[], Awaitable[Result]], Callable[[], Awaitable[Result]], str]
    ] = [
        (
            "publish single (64 in flight)",
            lambda: publish_client(doc, singles, 1, 64),
            lambda: publish_raw(doc, singles, 1, 64),
            "rec/s",
        ),
        (
            "publish batch of 64 (8 in flight)",
            lambda: publish_client(doc, batched, 64, 8),
            lambda: publish_raw(doc, batched, 64, 8),
            "rec/s",
        ),
    ]
    if await serves_cache(doc):
        cases.append(
            (
                "cache get (32 in flight)",
                lambda: cache_client(doc, gets, 32),
                lambda: cache_raw(doc, gets, 32),
                "p50 us",
            )
        )
    else:
        print("note: the broker does not serve cache operations; cache latency skipped")
    consumed = 2_000 if quick else 10_000
    cases += [
        (
            "consumer, await record.ack()",
            lambda: consume_client(doc, consumed, False),
            lambda: consume_raw(doc, consumed),
            "rec/s",
        ),
        (
            "consumer, acks as tasks",
            lambda: consume_client(doc, consumed, True),
            lambda: consume_raw(doc, consumed),
            "rec/s",
        ),
    ]
    versus: list[
        tuple[str, Callable[[], Awaitable[Result]], Callable[[], Awaitable[Result]], str]
    ] = [
        (
            "idempotent producer vs acked publish",
            lambda: publish_idempotent(doc, singles),
            lambda: publish_acked(doc, singles),
            "rec/s",
        )
    ]
    if only is not None:
        cases = [case for case in cases if only in case[0]]
        versus = [case for case in versus if only in case[0]]
    for name, client_case, raw_case, key in cases:
        client_results, raw_results = [], []
        for _ in range(runs):
            client_results.append(await client_case())
            raw_results.append(await raw_case())
        rows.append((name, median(client_results), median(raw_results), key))
    print(f"{'workload':36} {'metric':8} {'client':>12} {'raw':>12} {'client/raw':>10}")
    for name, client_result, raw_result, _key in rows:
        for metric in client_result:
            c, r = client_result[metric], raw_result[metric]
            print(f"{name:36} {metric:8} {c:12.1f} {r:12.1f} {c / r:10.2f}")
    if versus:
        # Same run, same durable stream, 100 B records, 64 in flight each way. An
        # idempotent batch is answered after the write (with its offset); a plain
        # acked publish to a leader-mode stream when it is queued.
        pairs = []
        for name, first, second, _key in versus:
            firsts, seconds = [], []
            for _ in range(runs):
                firsts.append(await first())
                seconds.append(await second())
            pairs.append((name, median(firsts), median(seconds)))
        print(f"{'workload':36} {'metric':8} {'idempotent':>12} {'acked':>12} {'ratio':>10}")
        for name, first_result, second_result in pairs:
            for metric in first_result:
                a, b = first_result[metric], second_result[metric]
                print(f"{name:36} {metric:8} {a:12.1f} {b:12.1f} {a / b:10.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run, small workloads")
    parser.add_argument("--only", help="only the workloads whose name contains this")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as tmp:
        process, doc = start_broker(Path(tmp))
        try:
            asyncio.run(run(doc, runs, args.quick, args.only))
        finally:
            process.terminate()
            process.wait(timeout=15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
