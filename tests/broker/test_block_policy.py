"""The `block` subscriber-queue policy loses nothing: a full queue slows the tenant's
publish worker instead (issue 21: frames offered to a full queue were dropped
without being counted)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.metrics import BrokerMetrics
from felix_broker.streams.engine import Engine, PublishRequest
from felix_wire.binary import EventBatchSharedFrame
from felix_wire.codec import decode_frame
from felix_wire.features import Capabilities
from felix_wire.frame import FrameReader
from felix_wire.messages import EventBatch

SPEC = StreamSpec("t1", "default", "orders", shards=1)


async def test_block_policy_delivers_every_record_and_drops_none(tmp_path: Path) -> None:
    config = load_config(
        environ={},
        overrides={
            "durable_storage_dir": "",
            "subscriber_queue_policy": "block",
            "subscriber_queue_capacity": 1,
            "event_batch_max_events": 4,
        },
        cwd=tmp_path,
    )
    metrics = BrokerMetrics()
    engine = Engine(StaticCatalog(streams=[SPEC], caches=[]), config, metrics)
    shard = engine.shard(SPEC, 0)
    sub = engine.subscribe(shard, Capabilities())
    sent = [f"{i}:{j}".encode() for i in range(40) for j in range(10)]

    async def consume() -> list[bytes]:
        got: list[bytes] = []
        reader = FrameReader()
        for _ in range(10_000):
            if len(got) >= len(sent):
                break
            async with asyncio.timeout(5):
                frames = await sub.next_frames()
            for frame, _count, _base in frames:
                for raw in reader.feed(frame):
                    event = decode_frame(raw)
                    assert isinstance(event, EventBatch | EventBatchSharedFrame)
                    got.extend(event.payloads)
            await asyncio.sleep(0.001)  # a slow subscriber
        return got

    consumer = asyncio.create_task(consume())
    done = []
    for i in range(40):
        request = PublishRequest(shard, sent[i * 10 : (i + 1) * 10], None)
        done.append(await engine.publish(request, acked=True))
    async with asyncio.timeout(10):
        await asyncio.gather(*done)
    async with asyncio.timeout(10):
        got = await consumer
    engine.close()
    assert got == sent
    assert sub.dropped == 0
    assert metrics.registry.get_sample_value("felix_stream_subscriber_dropped_records_total") == 0
