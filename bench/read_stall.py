"""Does a big stream_read stall other streams' publishes? Publish latency with and without it.

Run: ``.venv/bin/python bench/read_stall.py [--quick] [--seconds S] [--repeats N]``.

An in-process broker with durable storage (fsync mode periodic) over real QUIC
on loopback. A durable stream is filled with ``--megabytes`` of 4 KiB records.
Then, for ``--seconds`` each, a probe publishes acked 100-byte publishes to an
in-memory stream, one in flight, and records each publish -> publish_ok time:

- ``idle``: nothing else runs;
- ``reading``: a reader in another process (so its decoding is not on the
  broker's event loop) loops ``stream_read`` pages of up to 4 MiB over the
  durable stream, one page in flight.

Printed: p50 / p99 / max probe latency per phase, the lag of a 1 ms timer on
the broker's event loop (a call that blocks the loop shows as one long lag;
CPU contention on a busy machine shows as many small ones), each the median
over ``--repeats`` rounds, and the reader's pages/s. Figures are for comparing one
build with another on one machine, not across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from felix_broker.app import Broker
from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.cli import full_rights
from felix_broker.config import load_config
from felix_transport import TransportConfig, connect
from felix_wire.codec import decode_frame, encode_frame
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth
from felix_wire.messages import (
    AckMode,
    AuthOk,
    Publish,
    PublishBatch,
    PublishOk,
    StreamRead,
    StreamRecords,
)

TENANT, NS, LOG, PROBE = "t1", "default", "history", "probe"
FLAGS = 0x1FFF
FEATURES = 0xFB77FFFF
PAGE_BYTES = 4 * 1024 * 1024
RECORD = b"r" * 4096


class Conn:
    """One authenticated stream on its own connection."""

    def __init__(self, stream: Any, connection: Any) -> None:
        self.stream = stream
        self.connection = connection
        self.reader = FrameReader()
        self.pending: list[Any] = []

    @classmethod
    async def open(cls, port: int, ca: bytes, tok: str) -> Conn:
        connection = await connect(TransportConfig.client(ca), "127.0.0.1", port)
        conn = cls(await connection.open_bidi_stream(), connection)
        await conn.send(client_auth(TENANT, tok, client_flags=FLAGS, client_features=FEATURES))
        assert isinstance(await conn.recv(), AuthOk)
        return conn

    async def send(self, message: Any) -> None:
        await self.stream.write(encode_frame(message))

    async def recv(self) -> Any:
        while not self.pending:
            data = await self.stream.read()
            if not data:
                raise EOFError("stream ended")
            self.pending.extend(decode_frame(f) for f in self.reader.feed(data))
        return self.pending.pop(0)


async def fill(conn: Conn, megabytes: int) -> int:
    records = megabytes * 1024 * 1024 // len(RECORD)
    for rid, start in enumerate(range(0, records, 256)):
        count = min(256, records - start)
        batch = PublishBatch(
            tenant_id=TENANT,
            namespace=NS,
            stream=LOG,
            payloads=[RECORD] * count,
            ack=AckMode.PER_BATCH,
            request_id=rid,
        )
        await conn.send(batch)
        assert isinstance(await conn.recv(), PublishOk)
    return records


async def _read_pages(port: int, ca: bytes, tok: str, records: int, seconds: float) -> int:
    conn = await Conn.open(port, ca, tok)
    pages, offset, rid = 0, 0, 0
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        rid += 1
        read = StreamRead(
            tenant_id=TENANT,
            namespace=NS,
            stream=LOG,
            shard=0,
            from_=offset,
            max_bytes=PAGE_BYTES,
            request_id=rid,
        )
        await conn.send(read)
        page = await conn.recv()
        assert isinstance(page, StreamRecords), page
        pages += 1
        offset = page.next_offset if page.next_offset < records else 0
    conn.connection.close()
    return pages


def reader_process(port: int, ca: bytes, tok: str, records: int, seconds: float, out: Any) -> None:
    out.put(asyncio.run(_read_pages(port, ca, tok, records, seconds)))


async def probe(conn: Conn, seconds: float) -> list[float]:
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    rid = 0
    while time.perf_counter() < stop:
        rid += 1
        publish = Publish(
            tenant_id=TENANT,
            namespace=NS,
            stream=PROBE,
            payload=b"p" * 100,
            ack=AckMode.PER_MESSAGE,
            request_id=rid,
        )
        started = time.perf_counter()
        await conn.send(publish)
        assert isinstance(await conn.recv(), PublishOk)
        latencies.append((time.perf_counter() - started) * 1e6)
    return latencies


async def loop_lag(stop: asyncio.Event) -> list[float]:
    """How late a 1 ms timer on the broker's event loop fires, in microseconds, until
    `stop`: a call that blocks the loop shows as one long lag."""
    lags: list[float] = []
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + 0.001
        await asyncio.sleep(0.001)
        lags.append(max(0.0, (loop.time() - due) * 1e6))
    return lags


async def measured(conn: Conn, seconds: float) -> tuple[list[float], list[float]]:
    """Probe latencies and loop lags over one phase."""
    stop = asyncio.Event()
    lagging = asyncio.create_task(loop_lag(stop))
    latencies = await probe(conn, seconds)
    stop.set()
    return latencies, await lagging


def figures(latencies: list[float]) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    return (
        ordered[len(ordered) // 2],
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        ordered[-1],
    )


async def run(args: argparse.Namespace) -> None:
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    repeats = args.repeats or (1 if args.quick else 3)
    megabytes = args.megabytes or (16 if args.quick else 64)
    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            "quic_bind": "127.0.0.1:0",
            "metrics_bind": "127.0.0.1:0",
            "data_dir": tmp,
            "durable_storage_dir": str(Path(tmp) / "durable"),
        }
        catalog = StaticCatalog(
            streams=[
                StreamSpec(TENANT, NS, LOG, durable=True, shards=1),
                StreamSpec(TENANT, NS, PROBE, shards=1),
            ],
            caches=[],
        )
        config = dataclasses.replace(load_config(environ={}, overrides=settings), catalog=catalog)
        broker = Broker(config)
        await broker.start()
        try:
            assert broker.issuer is not None and broker.ca_path is not None
            tok = broker.issuer.mint(TENANT, subject="bench", perms=full_rights(TENANT))
            ca = broker.ca_path.read_bytes()
            records = await fill(await Conn.open(broker.quic_port, ca, tok), megabytes)
            conn = await Conn.open(broker.quic_port, ca, tok)
            print(
                f"{megabytes} MiB of 4 KiB records; stream_read pages of up to 4 MiB; "
                f"{seconds:.1f} s per phase; median of {repeats}"
            )
            rows: dict[str, list[tuple[float, float, float]]] = {"idle": [], "reading": []}
            lags: dict[str, list[tuple[float, float, float]]] = {"idle": [], "reading": []}
            pages: list[float] = []
            context = multiprocessing.get_context("spawn")
            for _ in range(repeats):
                latencies, lagged = await measured(conn, seconds)
                rows["idle"].append(figures(latencies))
                lags["idle"].append(figures(lagged))
                out = context.Queue()
                reader = context.Process(
                    target=reader_process,
                    args=(broker.quic_port, ca, tok, records, seconds + 1.0, out),
                )
                reader.start()
                await asyncio.sleep(0.5)  # the reader connects and is under way
                latencies, lagged = await measured(conn, seconds)
                rows["reading"].append(figures(latencies))
                lags["reading"].append(figures(lagged))
                pages.append(await asyncio.to_thread(out.get) / (seconds + 1.0))
                await asyncio.to_thread(reader.join)
            for phase, phase_rows in rows.items():
                p50, p99, top = (statistics.median(m[i] for m in phase_rows) for i in range(3))
                print(
                    f"{phase:>8}: publish->ok p50 {p50:8.0f} us  p99 {p99:8.0f} us  "
                    f"max {top:8.0f} us"
                )
                p50, p99, top = (statistics.median(m[i] for m in lags[phase]) for i in range(3))
                print(
                    f"{'':>8}  loop lag    p50 {p50:8.0f} us  p99 {p99:8.0f} us  max {top:8.0f} us"
                )
            print(f"  reader: {statistics.median(pages):.1f} pages/s of up to 4 MiB")
            conn.connection.close()
        finally:
            await broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="short measurements")
    parser.add_argument("--seconds", type=float, default=0.0, help="seconds per phase")
    parser.add_argument("--repeats", type=int, default=0, help="rounds (median printed)")
    parser.add_argument("--megabytes", type=int, default=0, help="MiB to fill the log with")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
