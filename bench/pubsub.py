"""Publish -> deliver through the broker, against a raw QUIC relay moving the same bytes.

For binary batches of 64 x 100 B and 64 x 4 KiB at fanout 1 and 10: records/s and
MB/s delivered to all subscribers, and for single-record batches the
publish -> deliver latency p50/p99. Each figure is printed beside a baseline
measured in the same run: a raw relay server (no broker logic: it copies every
byte it receives from the publisher to each subscriber connection, over our
own datagram loop) on aioquic, as the issue asks, and on qh3, the broker's own
stack, so the ratio shows what the broker's Python costs. The broker and the
relays each run in a process of their own, as in production; the clients share
this process.

    python bench/pubsub.py [--quick] [--rounds 3] [--datagram 1350]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from felix_transport import (
    Connection,
    ConnectionClosedError,
    Stream,
    StreamClosedError,
    TransportConfig,
    connect,
    serve,
)
from felix_transport.certs import generate_ca, generate_leaf
from felix_wire.binary import PublishBatchFrame, encode_publish_batch_frame
from felix_wire.codec import encode_frame
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth
from felix_wire.messages import Subscribe

TENANT, NS, STREAM = "t1", "default", "memory"


# --- the raw relay (baseline) ------------------------------------------------------


async def relay_main(port_file: Path, impl: str, datagram: int) -> None:
    """Serve: the first bidi stream of a connection that writes b"P" publishes; every
    other connection's first bidi stream subscribes; bytes are copied to subscribers."""
    ca = generate_ca()
    leaf = generate_leaf(ca)
    subscribers: list[Stream] = []

    async def handler(conn: Connection) -> None:
        stream = await conn.accept_stream()
        role = await stream.readexactly(1)
        if role == b"S":
            uni = await conn.open_uni_stream()
            await uni.write(b"R")
            subscribers.append(uni)
            await conn.wait_closed()
            return
        while data := await stream.read():
            for sub in list(subscribers):
                try:
                    await sub.write(data)
                except (StreamClosedError, ConnectionClosedError):
                    subscribers.remove(sub)  # a subscriber of an earlier round went away

    config = TransportConfig.server(
        leaf.cert_pem + ca.cert_pem, leaf.key_pem, impl=impl, max_datagram_size=datagram
    )
    server = await serve(config, "127.0.0.1", 0, handler)
    port_file.with_suffix(".ca").write_bytes(ca.cert_pem)
    port_file.write_text(str(server.address[1]))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()


# --- processes ---------------------------------------------------------------------


def start_relay(impl: str, datagram: int, tmp: Path) -> tuple[subprocess.Popen[bytes], int, bytes]:
    port_file = tmp / f"relay-{impl}.port"
    process = subprocess.Popen(
        [sys.executable, __file__, "--relay", str(port_file), impl, str(datagram)],
        stderr=subprocess.DEVNULL,
    )
    while not port_file.exists():
        time.sleep(0.02)
    return process, int(port_file.read_text()), port_file.with_suffix(".ca").read_bytes()


def start_broker(tmp: Path, datagram: int) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    out = tmp / "fixture.json"
    # Unacked publishes wait for queue room instead of being shed (the broker's
    # default sheds them when a tenant's queue is full): every published record must
    # arrive for the delivered-records figure to mean anything.
    env = dict(
        os.environ,
        FELIX_MAX_DATAGRAM_SIZE=str(datagram),
        FELIX_SUB_QUEUE_CAPACITY="4096",
        # Room for the whole 4 KiB burst (50 x 256 KiB): the per-subscriber byte bound
        # (8 MiB by default) would otherwise drop part of it and the readers wait forever.
        FELIX_SUBSCRIBER_QUEUE_MAX_BYTES=str(64 << 20),
        FELIX_PUB_INGRESS_WAIT="true",
    )
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
        stderr=subprocess.DEVNULL,
        env=env,
    )
    while not out.exists():
        time.sleep(0.02)
    return process, json.loads(out.read_text())


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()


# --- one measured run ----------------------------------------------------------------


class Side:
    """How to set up publishers and subscribers on one target (broker or relay)."""

    def __init__(self, port: int, ca: bytes, datagram: int, token: str | None) -> None:
        self.port = port
        self.config = TransportConfig.client(ca, max_datagram_size=datagram)
        self.token = token

    async def connect(self) -> Connection:
        return await connect(self.config, "127.0.0.1", self.port)

    async def publisher(self) -> tuple[Connection, Stream]:
        conn = await self.connect()
        stream = await conn.open_bidi_stream()
        if self.token is None:
            await stream.write(b"P")
        else:
            await stream.write(
                encode_frame(
                    client_auth(TENANT, self.token, client_flags=0x1FFF, client_features=0)
                )
            )
            reader = FrameReader()
            while not reader.feed(await stream.read()):
                pass
        return conn, stream

    async def subscriber(self) -> tuple[Connection, Stream]:
        conn = await self.connect()
        stream = await conn.open_bidi_stream()
        if self.token is None:
            await stream.write(b"S")
            uni = await conn.accept_stream()
            await uni.readexactly(1)
            return conn, uni
        auth = client_auth(TENANT, self.token, client_flags=0x1FFF, client_features=0)
        await stream.write(
            encode_frame(auth)
            + encode_frame(Subscribe(tenant_id=TENANT, namespace=NS, stream=STREAM))
        )
        uni = await conn.accept_stream()
        reader = FrameReader()
        while not reader.feed(await uni.read()):  # the event_stream_hello
            pass
        return conn, uni


async def count_bytes(stream: Stream, target: int) -> None:
    got = 0
    while got < target:
        data = await stream.read()
        if not data:
            raise EOFError("subscriber stream ended early")
        got += len(data)


async def throughput(side: Side, fanout: int, record: int, batches: int) -> float:
    """Delivered records/s over all subscribers."""
    payloads = [b"r" * record] * 64
    frame = encode_publish_batch_frame(
        PublishBatchFrame(tenant_id=TENANT, namespace=NS, stream=STREAM, payloads=payloads)
    )
    # What each subscriber receives per batch: the broker re-frames events (12-byte
    # header + u32 count + per record u32 length), the relay copies the frame as is.
    # The broker cuts event batches at 64 events and 64 KiB (its defaults).
    per_frame = min(64, max(1, 65536 // record))
    frames = -(-64 // per_frame)
    per_batch = frames * 16 + 64 * (4 + record) if side.token else len(frame)
    subs = [await side.subscriber() for _ in range(fanout)]
    pub_conn, pub = await side.publisher()
    await asyncio.sleep(0.1)
    started = time.perf_counter()
    readers = [asyncio.ensure_future(count_bytes(s, per_batch * batches)) for _, s in subs]
    for _ in range(batches):
        await pub.write(frame)
    async with asyncio.timeout(120):
        await asyncio.gather(*readers)
    elapsed = time.perf_counter() - started
    for conn, _ in [*subs, (pub_conn, pub)]:
        conn.close()
    return 64 * batches * fanout / elapsed


async def latency(side: Side, samples: int) -> tuple[float, float]:
    """p50 and p99 publish -> deliver of single-record batches, in microseconds."""
    frame = encode_publish_batch_frame(
        PublishBatchFrame(tenant_id=TENANT, namespace=NS, stream=STREAM, payloads=[b"x" * 100])
    )
    per = 12 + 4 + 4 + 100 if side.token else len(frame)
    (sub_conn, sub) = await side.subscriber()
    pub_conn, pub = await side.publisher()
    await asyncio.sleep(0.1)
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        await pub.write(frame)
        await count_bytes(sub, per)
        times.append((time.perf_counter() - started) * 1e6)
    sub_conn.close()
    pub_conn.close()
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


async def median_rate(side: Side, fanout: int, record: int, batches: int, rounds: int) -> float:
    return statistics.median(
        [await throughput(side, fanout, record, batches) for _ in range(rounds)]
    )


async def bench(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="felix-bench-"))
    broker, fixture = start_broker(tmp, args.datagram)
    relays = {impl: start_relay(impl, args.datagram, tmp) for impl in ("aioquic", "qh3")}
    try:
        token = str(fixture["token"])
        port = int(str(fixture["addrs"][0]).rsplit(":", 1)[1])  # type: ignore[index]
        sides = {
            "broker": Side(port, (tmp / "ca.pem").read_bytes(), args.datagram, token),
            **{
                f"raw {impl}": Side(p, ca, args.datagram, None)
                for impl, (_, p, ca) in relays.items()
            },
        }
        batches = 200 if args.quick else 800
        print(
            f"publish -> deliver, max datagram {args.datagram} B, median of {args.rounds} rounds\n"
        )
        header = ("case", "broker rec/s", "MB/s", "raw aioquic", "ratio", "raw qh3", "ratio")
        widths = (22, 14, 8, 14, 7, 12, 7)
        print(
            "".join(
                f"{h:<{w}}" if i == 0 else f"{h:>{w}}"
                for i, (h, w) in enumerate(zip(header, widths, strict=True))
            )
        )
        for record in (100, 4096):
            for fanout in (1, 10):
                n = batches if record == 100 else max(50, batches // 8)
                rates = {
                    name: await median_rate(side, fanout, record, n, args.rounds)
                    for name, side in sides.items()
                }
                b, ra, rq = rates["broker"], rates["raw aioquic"], rates["raw qh3"]
                case = f"64 x {record} B, fanout {fanout}"
                print(
                    f"{case:<22}{b:>14,.0f}{b * record / 1e6:>8.1f}"
                    f"{ra:>14,.0f}{b / ra:>7.2f}{rq:>12,.0f}{b / rq:>7.2f}"
                )
        samples = 300 if args.quick else 1000
        print()
        for name, side in sides.items():
            p50, p99 = await latency(side, samples)
            print(f"latency {name:<12} batch of 1: p50 {p50:7.0f} us   p99 {p99:7.0f} us")
    finally:
        stop(broker)
        for process, _, _ in relays.values():
            stop(process)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--relay":
        asyncio.run(relay_main(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--datagram", type=int, default=1350, help="max datagram size (loopback allows more)"
    )
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
