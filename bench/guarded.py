"""Guarded-write benchmark: idempotent and conditional publishes beside plain acked ones.

Run: ``.venv/bin/python bench/guarded.py [--quick] [--seconds S] [--repeats R]``.

An in-process broker with durable storage (fsync mode periodic, acks after the
write: ``ack_on_commit`` on, so every kind is answered once appended) over real
QUIC on loopback, one durable single-shard stream, 100-byte records in batches
of one. Each measurement runs ``--seconds`` and is repeated ``--repeats``
times; the median is printed, with its ratio to the plain acked publish of the
same run (the kinds take turns within each repeat):

- one in flight (request, answer, next request): ``plain`` (JSON publish_batch,
  acked), ``idempotent`` (publish_idempotent, one producer, consecutive
  sequences), ``publish_if`` (expected_offset = the tail the previous answer
  implies), ``commit`` (an event with one put);
- pipelined, 32 in flight on one stream: ``plain`` and ``idempotent`` (a
  conditional write cannot be pipelined: its expectation needs the previous
  answer).

Ratios, not absolute figures, are what to compare across machines. A full run
takes about 30 s, ``--quick`` about 6 s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
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
    Commit,
    CommitOk,
    PublishBatch,
    PublishIdempotent,
    PublishIf,
    PublishOk,
    StateChangePut,
)

TENANT, NS, STREAM = "t1", "default", "bench"
FLAGS = 0x1FFF
FEATURES = 0xFB77FFFF
SCOPE: dict[str, Any] = {"tenant_id": TENANT, "namespace": NS, "stream": STREAM}
PAYLOAD = b"x" * 100
# Per window, the kinds measured; the first is the baseline of its window.
KINDS = ((1, ("plain", "idempotent", "publish_if", "commit")), (32, ("plain", "idempotent")))


class Conn:
    """One authenticated stream on its own connection."""

    def __init__(self, stream: Any, connection: Any) -> None:
        self.stream = stream
        self.connection = connection
        self.reader = FrameReader()
        self.pending: list[Any] = []

    @classmethod
    async def open(cls, broker: Broker, tok: str) -> Conn:
        assert broker.ca_path is not None
        config = TransportConfig.client(broker.ca_path.read_bytes())
        connection = await connect(config, "127.0.0.1", broker.quic_port)
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


class Writer:
    """Builds the n-th request of one kind; `tail` follows the answers (for publish_if)."""

    def __init__(self, kind: str, producer: int) -> None:
        self.kind = kind
        self.producer = producer
        self.sequence = 0
        self.tail = 0

    def request(self, rid: int) -> Any:
        if self.kind == "plain":
            return PublishBatch(**SCOPE, payloads=[PAYLOAD], ack=AckMode.PER_BATCH, request_id=rid)
        if self.kind == "idempotent":
            self.sequence += 1
            return PublishIdempotent(
                **SCOPE,
                payloads=[PAYLOAD],
                request_id=rid,
                producer_id=self.producer,
                sequence=self.sequence - 1,
            )
        if self.kind == "publish_if":
            return PublishIf(**SCOPE, payloads=[PAYLOAD], expected_offset=self.tail, request_id=rid)
        return Commit(
            **SCOPE,
            entity_key=b"entity",
            event=PAYLOAD,
            changes=[StateChangePut(key="k", value=b"v")],
            request_id=rid,
        )

    def answered(self, answer: Any) -> None:
        assert isinstance(answer, PublishOk | CommitOk), answer
        assert answer.offset is not None
        self.tail = answer.offset + 1


async def rate(conn: Conn, writer: Writer, window: int, seconds: float) -> float:
    rid = 0
    done = 0
    in_flight = 0
    started = time.perf_counter()
    stop = started + seconds
    while time.perf_counter() < stop or in_flight:
        while in_flight < window and time.perf_counter() < stop:
            rid += 1
            await conn.send(writer.request(rid))
            in_flight += 1
        writer.answered(await conn.recv())
        in_flight -= 1
        done += 1
    return done / (time.perf_counter() - started)


async def measure(
    broker: Broker,
    tok: str,
    kinds: tuple[str, ...],
    window: int,
    seconds: float,
    repeats: int,
    tail: Callable[[], int],
) -> dict[str, float]:
    """Median rate per kind; the kinds take turns in every repeat, so a change of machine
    load during the run falls on all of them alike."""
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    for run in range(repeats):
        for kind in kinds:
            conn = await Conn.open(broker, tok)
            writer = Writer(kind, producer=hash((kind, window, run)) & (2**64 - 1))
            writer.tail = tail()
            rates[kind].append(await rate(conn, writer, window, seconds))
            conn.connection.close()
    return {kind: statistics.median(values) for kind, values in rates.items()}


async def run(args: argparse.Namespace) -> None:
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    repeats = args.repeats or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            "quic_bind": "127.0.0.1:0",
            "metrics_bind": "127.0.0.1:0",
            "data_dir": tmp,
            "durable_storage_dir": str(Path(tmp) / "durable"),
            "ack_on_commit": True,
        }
        catalog = StaticCatalog(
            streams=[StreamSpec(TENANT, NS, STREAM, durable=True, shards=1)], caches=[]
        )
        config = dataclasses.replace(load_config(environ={}, overrides=settings), catalog=catalog)
        broker = Broker(config)
        await broker.start()
        try:
            assert broker.issuer is not None and broker.engine is not None
            engine = broker.engine
            spec = engine.stream(TENANT, NS, STREAM)
            assert spec is not None

            def tail() -> int:
                return engine.shard(spec, 0).next_offset

            tok = broker.issuer.mint(TENANT, subject="bench", perms=full_rights(TENANT))
            print(f"100 B records, one per request; {seconds:.1f} s per run; median of {repeats}")
            for window, kinds in KINDS:
                baseline = 0.0
                medians = await measure(broker, tok, kinds, window, seconds, repeats, tail)
                for kind, value in medians.items():
                    if kind == "plain":
                        baseline = value
                        note = "(baseline)"
                    else:
                        note = f"{value / baseline:.3f} x plain"
                    label = f"{kind} w={window}"
                    print(f"{label:>16}: {value:>9.0f} requests/s  {note}")
        finally:
            await broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--repeats", type=int)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
