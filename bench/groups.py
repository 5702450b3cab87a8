"""Consumer-group benchmark: records/s through poll -> ack beside plain subscribe, one run.

Run: ``.venv/bin/python bench/groups.py [--quick] [--seconds S] [--records N]``.

An in-process broker with durable storage (fsync mode periodic) over real QUIC
on loopback. The durable stream is filled with ``--records`` 100-byte records
first; then, each for ``--seconds`` and repeated ``--repeats`` times (the
median is printed):

- ``subscribe``: one subscription from ``earliest`` reading the same stream
  (the plain fan-out read path, for scale);
- ``group c=C b=B``: C consumers, each on its own connection, polling up to B
  records and acknowledging each one (acks pipelined on the stream, answers
  awaited before the next poll), for C in (1, 8) and B in (1, 32). Every
  measurement uses a fresh group, so it reads the same records from offset 0.

Ratios, not absolute figures, are what to compare across machines. A full run
takes about 60 s, ``--quick`` about 15 s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.wire import WireStream, open_session
from felix_broker.app import Broker
from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.cli import full_rights
from felix_broker.config import load_config
from felix_transport import Connection
from felix_wire.messages import (
    AckMode,
    GroupAck,
    GroupPoll,
    GroupRecords,
    PublishBatch,
    PublishOk,
    Subscribe,
    Subscribed,
)

TENANT, NS, STREAM = "t1", "default", "jobs"
FLAGS = 0x1FFF
FEATURES = 0xFB77FFFF
SCOPE: dict[str, Any] = {"tenant_id": TENANT, "namespace": NS, "stream": STREAM, "shard": 0}


class Conn:
    """One authenticated stream on its own connection, with a request-id counter."""

    def __init__(self, connection: Connection, stream: WireStream) -> None:
        self.connection = connection
        self.stream = stream
        self.rid = 0

    @classmethod
    async def open(cls, broker: Broker, tok: str) -> Conn:
        assert broker.ca_path is not None
        connection, stream = await open_session(
            broker.ca_path.read_bytes(),
            broker.quic_port,
            TENANT,
            tok,
            flags=FLAGS,
            features=FEATURES,
        )
        return cls(connection, stream)

    async def send(self, message: Any) -> None:
        await self.stream.send(message)

    async def recv(self) -> Any:
        return await self.stream.recv()


async def fill(conn: Conn, records: int) -> None:
    payload = b"x" * 100
    for start in range(0, records, 500):
        conn.rid += 1
        count = min(500, records - start)
        await conn.send(
            PublishBatch(
                **{k: SCOPE[k] for k in ("tenant_id", "namespace", "stream")},
                payloads=[payload] * count,
                ack=AckMode.PER_BATCH,
                request_id=conn.rid,
            )
        )
        assert isinstance(await conn.recv(), PublishOk)


async def consume(conn: Conn, group: str, batch: int, stop: float) -> int:
    done = 0
    while time.perf_counter() < stop:
        conn.rid += 1
        await conn.send(GroupPoll(**SCOPE, group=group, max_records=batch, request_id=conn.rid))
        answer = await conn.recv()
        assert isinstance(answer, GroupRecords), answer
        if not answer.records:
            break
        for record in answer.records:
            conn.rid += 1
            await conn.send(
                GroupAck(**SCOPE, group=group, offset=record.offset, request_id=conn.rid)
            )
        for _ in answer.records:
            await conn.recv()
        done += len(answer.records)
    return done


async def group_rate(conns: list[Conn], group: str, batch: int, seconds: float) -> float:
    started = time.perf_counter()
    stop = started + seconds
    counts = await asyncio.gather(*(consume(c, group, batch, stop) for c in conns))
    return sum(counts) / (time.perf_counter() - started)


async def subscribe_rate(broker: Broker, tok: str, seconds: float, records: int) -> float:
    conn = await Conn.open(broker, tok)
    await conn.send(Subscribe(**{k: SCOPE[k] for k in SCOPE}, start="earliest"))
    assert isinstance(await conn.recv(), Subscribed)
    started = time.perf_counter()
    events = WireStream(await conn.connection.accept_stream())
    got = 0
    try:
        while got < records and time.perf_counter() - started < seconds:
            async with asyncio.timeout(seconds):
                decoded = await events.recv()
            got += len(getattr(decoded, "payloads", ()) or ())
    except (TimeoutError, EOFError):
        pass
    elapsed = time.perf_counter() - started
    conn.connection.close()
    return got / elapsed


async def run(args: argparse.Namespace) -> None:
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    repeats = args.repeats or (1 if args.quick else 3)
    records = args.records or (20_000 if args.quick else 100_000)
    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            "quic_bind": "127.0.0.1:0",
            "metrics_bind": "127.0.0.1:0",
            "data_dir": tmp,
            "durable_storage_dir": str(Path(tmp) / "durable"),
        }
        catalog = StaticCatalog(
            streams=[StreamSpec(TENANT, NS, STREAM, durable=True, shards=1)], caches=[]
        )
        config = dataclasses.replace(load_config(environ={}, overrides=settings), catalog=catalog)
        broker = Broker(config)
        await broker.start()
        try:
            assert broker.issuer is not None
            tok = broker.issuer.mint(TENANT, subject="bench", perms=full_rights(TENANT))
            await fill(await Conn.open(broker, tok), records)
            print(f"{records} records of 100 B; {seconds:.1f} s per run; median of {repeats}")
            rates = [await subscribe_rate(broker, tok, seconds, records) for _ in range(repeats)]
            baseline = statistics.median(rates)
            print(f"{'subscribe':>18}: {baseline:>10.0f} records/s  (baseline)")
            run_id = 0
            for consumers in (1, 8):
                conns = [await Conn.open(broker, tok) for _ in range(consumers)]
                for batch in (1, 32):
                    rates = []
                    for _ in range(repeats):
                        run_id += 1
                        rates.append(await group_rate(conns, f"g{run_id}", batch, seconds))
                    label = f"group c={consumers} b={batch}"
                    rate = statistics.median(rates)
                    print(
                        f"{label:>18}: {rate:>10.0f} records/s  {rate / baseline:.3f} x subscribe"
                    )
                for conn in conns:
                    conn.connection.close()
        finally:
            await broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="short measurements (~15 s)")
    parser.add_argument("--seconds", type=float, default=0.0, help="seconds per measurement")
    parser.add_argument("--repeats", type=int, default=0, help="runs per measurement")
    parser.add_argument("--records", type=int, default=0, help="records to fill the stream")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
