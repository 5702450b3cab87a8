"""Bounds on the publish path: event_batch_max_delay_us limits how long a pass of the
tenant's worker takes more before it flushes, and the publish byte budgets
(pub_conn_inflight_bytes, pub_conn_total_inflight_bytes, pub_inflight_bytes)
bound what is read and not yet appended."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.metrics import BrokerMetrics
from felix_broker.streams.budget import ByteBudget
from felix_broker.streams.engine import Engine, PublishRequest
from felix_wire.codec import encode_frame
from felix_wire.features import Capabilities
from felix_wire.messages import AckMode, AuthOk, Publish, PublishOk, Subscribe, Subscribed

from ..fleet.harness import TOPOLOGIES
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

SPEC = StreamSpec("t1", "default", "orders", shards=1)


async def _frames_for_ten_queued_publishes(tmp: Path, max_delay_us: int) -> int:
    config = load_config(
        environ={},
        overrides={"durable_storage_dir": "", "event_batch_max_delay_us": max_delay_us},
        cwd=tmp,
    )
    engine = Engine(StaticCatalog(streams=[SPEC], caches=[]), config, BrokerMetrics())
    shard = engine.shard(SPEC, 0)
    sub = engine.subscribe(shard, Capabilities())
    # All ten are queued before the worker runs once (publish does not yield here).
    done = [
        await engine.publish(PublishRequest(shard, [b"x"], None), acked=True) for _ in range(10)
    ]
    async with asyncio.timeout(5):
        await asyncio.gather(*done)
    async with asyncio.timeout(5):
        frames = await sub.next_frames()
    engine.close()
    assert sum(count for _, count, _ in frames) == 10
    return len(frames)


async def test_max_delay_zero_flushes_every_publish_on_its_own(tmp_path: Path) -> None:
    assert await _frames_for_ten_queued_publishes(tmp_path, 0) == 10


async def test_a_long_max_delay_batches_what_is_queued(tmp_path: Path) -> None:
    assert await _frames_for_ten_queued_publishes(tmp_path, 10_000_000) == 1


async def test_byte_budget_waits_in_order_and_admits_an_oversized_holder_alone() -> None:
    budget = ByteBudget(100)
    await budget.acquire(60)
    second = asyncio.create_task(budget.acquire(60))
    third = asyncio.create_task(budget.acquire(10))
    await asyncio.sleep(0)
    # 10 bytes would fit, but the 60 ahead of it waits first (no overtaking).
    assert not second.done() and not third.done() and budget.held == 60
    budget.release(60)
    async with asyncio.timeout(1):
        await asyncio.gather(second, third)
    assert budget.held == 70
    big = asyncio.create_task(budget.acquire(500))
    await asyncio.sleep(0)
    assert not big.done()
    budget.release(70)
    async with asyncio.timeout(1):
        await big
    assert budget.held == 500  # bigger than the budget: admitted alone
    budget.release(500)
    assert budget.held == 0


async def test_a_cancelled_waiter_gives_way() -> None:
    budget = ByteBudget(10)
    await budget.acquire(10)
    stuck = asyncio.create_task(budget.acquire(10))
    behind = asyncio.create_task(budget.acquire(1))
    await asyncio.sleep(0)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    budget.release(10)
    async with asyncio.timeout(1):
        await behind
    assert budget.held == 1


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_tiny_publish_budgets_still_let_every_publish_through(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(
        tmp_path,
        topology=topology,
        pub_conn_inflight_bytes=1,
        pub_conn_total_inflight_bytes=1,
        pub_inflight_bytes=1,
    ) as broker:
        client = await WireClient.connect(broker)
        stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        burst = b"".join(
            encode_frame(
                Publish(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="orders",
                    payload=b"payload",
                    ack=AckMode.PER_MESSAGE,
                    request_id=i,
                )
            )
            for i in range(50)
        )
        await stream.send(burst)
        answers = [await stream.recv() for _ in range(50)]
        assert [a.request_id for a in answers if isinstance(a, PublishOk)] == list(range(50))
        gauge = broker.metrics.registry.get_sample_value("felix_stream_publish_inflight_bytes")
        assert gauge == 0
        client.close()


async def test_publish_bytes_in_flight_stay_within_the_connection_budget(tmp_path: Path) -> None:
    mib = 1024 * 1024
    async with running_broker(
        tmp_path,
        subscriber_queue_policy="block",
        subscriber_queue_capacity=1,
        pub_conn_inflight_bytes=3 * mib,
    ) as broker:
        client = await WireClient.connect(broker)
        stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        # A subscriber that never reads: its queue fills, the tenant's worker blocks on
        # it, and publishes stay read but not appended.
        await stream.send(Subscribe(tenant_id=TENANT, namespace=NS, stream="orders"))
        assert isinstance(await stream.recv(), Subscribed)
        publisher, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        payload = b"x" * mib

        async def publish_all() -> None:
            for _ in range(20):
                await publisher.send(
                    Publish(tenant_id=TENANT, namespace=NS, stream="orders", payload=payload)
                )

        # The broker stops reading the publisher's stream at the budget, so these
        # writes stall on flow control: they run on their own.
        sending = asyncio.create_task(publish_all())
        # Sample until the budget has been full for a while (at most 10 s: the stacks
        # move 20 MiB at different speeds); it must never be exceeded meanwhile.
        highest, full_for = 0.0, 0
        for _ in range(500):
            await asyncio.sleep(0.02)
            held = broker.metrics.registry.get_sample_value("felix_stream_publish_inflight_bytes")
            assert held is not None and held <= 3 * mib, held
            highest = max(highest, held)
            full_for = full_for + 1 if held >= 2 * mib else 0
            if full_for >= 25:
                break
        assert full_for >= 25, highest
        sending.cancel()
        client.close()
