"""Cache benchmark: Felix cache_get / cache_put over QUIC against Redis GET / SET.

Run: ``.venv/bin/python bench/cache.py [--quick] [--durable] [--seconds S]``.

For each operation (get, put), value size (0 B, 100 B, 4 KiB) and concurrency
(1 and 32 requests in flight) it reports throughput (ops/s) and p50/p99
latency (µs) for Felix and, measured in the same run, Redis, and the ratio
Felix/Redis of the throughputs.

- Felix: a broker in a child process (in-memory cache by default, log-backed
  with ``--durable``, fsync mode periodic), one QUIC connection, one
  authenticated stream; the requests in flight are pipelined on it and matched
  by request_id.
- Redis: ``redis-server`` started here on 127.0.0.1 with a free port, without
  persistence, then stopped; redis-py asyncio with a pool of as many
  connections as requests in flight.

Both servers run in their own process; the load generator is one asyncio loop
in this process. Keys cycle over 1,000 names; gets read keys written with the
same value size first. A full run takes about 1.5 minutes, ``--quick`` about 20 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import multiprocessing.connection
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from felix_transport import Connection, Stream, TransportConfig, connect
from felix_wire.codec import decode_frame, encode_frame
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth
from felix_wire.messages import (
    AuthOk,
    CacheGet,
    CacheOk,
    CachePut,
    CacheValue,
    Message,
)

TENANT, NS, CACHE = "bench", "default", "c"
KEYS = 1000
SIZES = (0, 100, 4096)
CONCURRENCY = (1, 32)
OFFICIAL_FLAGS = 0x1FFF
OFFICIAL_FEATURES = 0xFB77FFFF | (0xF << 32)

Op = Callable[[int], Awaitable[None]]


@dataclass(frozen=True)
class Result:
    ops_per_s: float
    p50_us: float
    p99_us: float


# -- the broker, in a child process ---------------------------------------------------


def _serve_broker(pipe: multiprocessing.connection.Connection, data: str, durable: bool) -> None:
    asyncio.run(_broker_main(pipe, Path(data), durable))


async def _broker_main(
    pipe: multiprocessing.connection.Connection, data: Path, durable: bool
) -> None:
    import dataclasses
    import logging

    from felix_broker.app import Broker
    from felix_broker.catalog import CacheSpec, StaticCatalog
    from felix_broker.cli import full_rights
    from felix_broker.config import load_config

    logging.basicConfig(level=logging.WARNING)
    settings = {"quic_bind": "127.0.0.1:0", "metrics_bind": "127.0.0.1:0", "data_dir": str(data)}
    if durable:
        settings["durable_storage_dir"] = str(data / "durable")
    config = dataclasses.replace(
        load_config(environ={}, overrides=settings),
        catalog=StaticCatalog(streams=[], caches=[CacheSpec(TENANT, NS, CACHE, shards=1)]),
    )
    broker = Broker(config)
    await broker.start()
    assert broker.cache is not None and broker.issuer is not None and broker.ca_path
    await broker.cache.start()
    token = broker.issuer.mint(TENANT, subject="bench", perms=full_rights(TENANT))
    pipe.send((broker.quic_port, str(broker.ca_path), token))
    # Wait for the parent's word (or its exit) off the event loop.
    with contextlib.suppress(EOFError):
        await asyncio.to_thread(pipe.recv)
    await broker.cache.close()
    await broker.stop()


# -- a pipelining Felix client ---------------------------------------------------------


class FelixClient:
    """One authenticated stream; answers are matched to requests by request_id."""

    def __init__(self, connection: Connection, stream: Stream) -> None:
        self.connection = connection
        self.stream = stream
        self.waiting: dict[int, asyncio.Future[Message]] = {}
        self.next_id = 1
        self.reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, port: int, ca_pem: bytes, token: str) -> FelixClient:
        connection = await connect(TransportConfig.client(ca_pem), "127.0.0.1", port)
        stream = await connection.open_bidi_stream()
        auth = client_auth(
            TENANT, token, client_flags=OFFICIAL_FLAGS, client_features=OFFICIAL_FEATURES
        )
        await stream.write(encode_frame(auth))
        frames = FrameReader()
        answer = None
        while answer is None:
            got = frames.feed(await stream.read())
            if got:
                answer = decode_frame(got[0])
        assert isinstance(answer, AuthOk), answer
        return cls(connection, stream)

    async def _read(self) -> None:
        frames = FrameReader()
        while True:
            data = await self.stream.read()
            if not data:
                return
            for frame in frames.feed(data):
                message = decode_frame(frame)
                assert isinstance(message, CacheOk | CacheValue), message
                assert message.request_id is not None
                self.waiting.pop(message.request_id).set_result(message)

    async def call(self, build: Callable[[int], Message]) -> Message:
        rid = self.next_id
        self.next_id += 1
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = future
        await self.stream.write(encode_frame(build(rid)))
        return await future

    def close(self) -> None:
        self.reader.cancel()
        self.connection.close()


# -- Redis ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def redis_server() -> Iterator[int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found (apt-get install -y redis-server)")
    port = _free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- measuring --------------------------------------------------------------------------


async def measure(op: Op, concurrency: int, seconds: float) -> Result:
    """Run `op` from `concurrency` workers for `seconds`; latency of every call."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    counter = iter(range(1 << 62))

    async def worker() -> None:
        while True:
            begin = time.perf_counter()
            if begin >= stop_at:
                return
            await op(next(counter))
            latencies.append(time.perf_counter() - begin)

    # A short warm-up, not counted.
    warm_until = time.perf_counter() + min(0.2, seconds / 5)
    while time.perf_counter() < warm_until:
        await op(next(counter))
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return Result(
        ops_per_s=len(latencies) / elapsed,
        p50_us=statistics.median(latencies) * 1e6,
        p99_us=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6,
    )


async def run(args: argparse.Namespace) -> None:
    import redis.asyncio as aioredis

    seconds = 0.4 if args.quick else args.seconds
    rows: list[tuple[str, int, int, Result, Result]] = []
    with tempfile.TemporaryDirectory(prefix="felix-bench-") as data, redis_server() as rport:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        broker = ctx.Process(target=_serve_broker, args=(child, data, args.durable), daemon=True)
        broker.start()
        try:
            port, ca_path, token = parent.recv()
            felix = await FelixClient.open(port, Path(ca_path).read_bytes(), token)
            rds = aioredis.Redis(
                host="127.0.0.1",
                port=rport,
                max_connections=max(CONCURRENCY),
                single_connection_client=False,
            )
            for size in SIZES:
                value = b"x" * size
                # Both sides hold the keys the gets read.
                for i in range(KEYS):
                    await felix.call(partial(_put, f"key-{i}", value))
                    await rds.set(f"key-{i}", value)

                async def felix_put(n: int, value: bytes = value) -> None:
                    await felix.call(partial(_put, f"key-{n % KEYS}", value))

                async def felix_get(n: int) -> None:
                    answer = await felix.call(partial(_get, f"key-{n % KEYS}"))
                    assert isinstance(answer, CacheValue) and answer.value is not None

                async def redis_put(n: int, value: bytes = value) -> None:
                    await rds.set(f"key-{n % KEYS}", value)

                async def redis_get(n: int) -> None:
                    assert await rds.get(f"key-{n % KEYS}") is not None

                for name, f_op, r_op in (
                    ("get", felix_get, redis_get),
                    ("put", felix_put, redis_put),
                ):
                    for concurrency in CONCURRENCY:
                        f = await measure(f_op, concurrency, seconds)
                        r = await measure(r_op, concurrency, seconds)
                        rows.append((name, size, concurrency, f, r))
                        _print_row(name, size, concurrency, f, r, header=len(rows) == 1)
            felix.close()
            await rds.aclose()
        finally:
            parent.send("stop")
            broker.join(timeout=15)
            if broker.is_alive():
                broker.kill()
    ratios = [f.ops_per_s / r.ops_per_s for _n, _s, _c, f, r in rows]
    print(f"\nmedian throughput ratio felix/redis: {statistics.median(ratios):.2f}")


def _put(key: str, value: bytes, rid: int) -> CachePut:
    return CachePut(
        tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, value=value, request_id=rid
    )


def _get(key: str, rid: int) -> CacheGet:
    return CacheGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, request_id=rid)


def _print_row(
    name: str, size: int, concurrency: int, f: Result, r: Result, *, header: bool
) -> None:
    if header:
        print(
            f"{'op':<4} {'size':>5} {'inflight':>8} | {'felix ops/s':>11} {'p50 µs':>8} "
            f"{'p99 µs':>8} | {'redis ops/s':>11} {'p50 µs':>8} {'p99 µs':>8} | {'ratio':>5}"
        )
    print(
        f"{name:<4} {size:>5} {concurrency:>8} | {f.ops_per_s:>11.0f} {f.p50_us:>8.0f} "
        f"{f.p99_us:>8.0f} | {r.ops_per_s:>11.0f} {r.p50_us:>8.0f} {r.p99_us:>8.0f} | "
        f"{f.ops_per_s / r.ops_per_s:>5.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (about 20 s in all)")
    parser.add_argument("--durable", action="store_true", help="log-backed cache (fsync periodic)")
    parser.add_argument("--seconds", type=float, default=2.5, help="measured seconds per cell")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
