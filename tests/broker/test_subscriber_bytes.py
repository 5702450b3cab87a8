"""Subscriber queues are bounded in bytes, each and broker-wide (issue 20, finding 5),
over real QUIC with subscribers that never read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from felix_wire.binary import BinaryAckMode, PublishAckFrame, PublishBatchFrame
from felix_wire.messages import EventStreamHello, Subscribe, Subscribed

from ..fleet.harness import NON_OWNER, OWNER, leader_of
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

pytestmark = pytest.mark.timeout(90)

PER_SUB = 256 * 1024
GLOBAL = 1024 * 1024
FRAME = 64 * 1024 + 256  # one encoded event batch at most (event_batch_max_bytes + framing)


async def stalled_subscriber(broker: object) -> WireClient:
    """A subscriber (on its own connection) asking for a 4,096-batch queue, never reading."""
    client = await WireClient.connect(broker)  # type: ignore[arg-type]
    control, _ = await client.authed()
    await control.send(
        Subscribe(tenant_id=TENANT, namespace=NS, stream="orders", queue_capacity=4096)
    )
    answer = await control.recv()
    assert isinstance(answer, Subscribed) and answer.queue_capacity == 4096, answer
    events = await client.event_stream()
    assert isinstance(await events.recv(), EventStreamHello)
    return client


# In a fleet the subscribers are on the owner (a non-owner redirects a subscribe) and the
# publisher on the broker reached, so through a non-owner the publishes are forwarded.
# The policies differ only on the owner's queues, so the fleet runs one of them.
@pytest.mark.parametrize(
    ("policy", "topology"),
    [("drop_new", "one"), ("drop_old", "one"), ("drop_new", OWNER), ("drop_new", NON_OWNER)],
)
async def test_stalled_subscribers_hold_a_bounded_number_of_bytes(
    tmp_path: Path, policy: str, topology: str
) -> None:
    async with running_broker(
        tmp_path,
        topology=topology,
        subscriber_queue_policy=policy,
        subscriber_queue_max_bytes=PER_SUB,
        subscriber_queued_bytes_max=GLOBAL,
    ) as reached:
        broker = leader_of(reached)
        assert broker.engine is not None
        subscribers = [await stalled_subscriber(broker) for _ in range(8)]
        publisher = await WireClient.connect(reached)
        pub, _ = await publisher.authed()
        peak = 0
        # 300 rounds offer ~140 MB to queues bounded at 1 MB; in a fleet 60 (~28 MB) do
        # as well, each forwarded publish being a round trip more.
        rounds = 300 if topology == "one" else 60
        for rid in range(1, rounds + 1):
            await pub.send(
                PublishBatchFrame(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="orders",
                    payloads=[b"x" * 30_000, b"y" * 30_000],
                    request_id=rid,
                    ack_mode=BinaryAckMode.PER_BATCH,
                )
            )
            assert isinstance(await pub.recv(), PublishAckFrame)
            per_sub = [
                sum(len(frame) for frame, _, _ in sub._frames)
                for shard in broker.engine._shards.values()
                for sub in shard.subscribers
            ]
            peak = max(peak, sum(per_sub))
            assert max(per_sub, default=0) <= PER_SUB + FRAME
        assert GLOBAL // 2 < peak <= GLOBAL
        drops = broker.metrics.registry.get_sample_value(
            "felix_stream_subscriber_dropped_records_total"
        )
        assert drops is not None and drops > 0
        for client in subscribers:
            client.close()
        # Polled, not slept: the gauge returns to 0 once the subscriptions are gone.
        for _ in range(200):
            if broker.engine.queued_bytes.used == 0:
                break
            await asyncio.sleep(0.05)
        assert broker.engine.queued_bytes.used == 0
        gauge = broker.metrics.registry.get_sample_value("felix_stream_subscriber_queued_bytes")
        assert gauge == 0
        publisher.close()
