"""Consumer groups through the client, over real QUIC against the reference broker:
every group call, and the high-level consumer."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

import felix_client
from felix_client import ClientTimeoutError, InvalidRequestError, StaleClaimError

pytestmark = pytest.mark.timeout(90)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def _fresh_group(client: felix_client.Client, stream: str, prefix: str) -> felix_client.Group:
    """A new group whose cursor is at the tail of every shard (a new group
    otherwise starts at the oldest record, and the shared stream has many)."""
    group = client.group(stream, _name(prefix))
    for shard in range(await client.stream_shards(stream)):
        seek = await group.seek(shard, "latest", if_new=True)
        assert seek.moved
    return group


async def test_every_group_call(client: felix_client.Client, felix_fixture: dict[str, Any]) -> None:
    stream = felix_fixture["durable_stream"]
    group = await _fresh_group(client, stream, "calls")
    shard = await client.shard_for_key(stream, b"gk")
    for i in range(3):
        await client.publish(stream, b"g%d" % i, key=b"gk")
    first = await group.poll(shard, max_records=10, wait=5)
    assert [r.payload for r in first] == [b"g0", b"g1", b"g2"]
    assert all(r.attempts == 1 and r.shard == shard and r.stream == stream for r in first)
    assert first[0].timestamp_micros
    a, b, c = first

    await group.ack(shard, a.offset)
    with pytest.raises(StaleClaimError):
        await group.nack(shard, a.offset, attempts=a.attempts)  # that delivery is finished
    await group.nack(shard, b.offset, delay=0.3, attempts=b.attempts)
    granted = await group.extend(shard, c.offset, attempts=c.attempts, by=20)
    assert 19 <= granted <= 20
    state = await group.describe(shard)
    assert state.in_flight == 2 and state.committed == a.offset + 1  # c, and b delayed
    assert state.tail == c.offset + 1 and state.dead_letters == 0

    started = time.monotonic()
    again = await group.poll(shard, max_records=10, wait=5)
    assert [(r.offset, r.attempts) for r in again] == [(b.offset, 2)]
    assert time.monotonic() - started >= 0.2  # not before its delay

    await group.dead_letter(shard, b.offset)
    assert await group.dead_letters(shard) == [b.offset]
    await group.redrive(shard, b.offset)
    assert await group.dead_letters(shard) == []
    redriven = await group.poll(shard, max_records=10, wait=5)
    assert [r.offset for r in redriven] == [b.offset]
    await group.dead_letter(shard, b.offset)
    await group.discard(shard, b.offset)
    assert await group.dead_letters(shard) == []

    await group.ack(shard, c.offset)
    assert await group.poll(shard, max_records=10) == []
    assert (await group.describe(shard)).committed == c.offset + 1
    moved = await group.seek(shard, a.offset)
    assert moved == felix_client.SeekResult(a.offset, True)
    assert [r.payload for r in await group.poll(shard, max_records=1, wait=5)] == [b"g0"]
    assert await group.delete(shard) is True
    assert await group.delete(shard) is False


async def test_a_refusal_meets_its_own_request(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    """The broker refuses group calls with an `error` naming no request: a long
    poll in flight must not take the refusal of an ack sent after it."""
    stream = felix_fixture["durable_stream"]
    group = await _fresh_group(client, stream, "refusal")
    polling = asyncio.create_task(group.poll(1, max_records=1, wait=1.5))
    await asyncio.sleep(0.2)
    with pytest.raises(InvalidRequestError):
        await group.ack(1, 10**9)  # past the tail
    assert await polling == []


async def test_the_consumer_reads_every_shard(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["durable_stream"]
    group = await _fresh_group(client, stream, "every")
    payloads = {b"c%02d" % i for i in range(40)}
    for payload in sorted(payloads):
        await client.publish(stream, payload, key=payload)
    seen: list[bytes] = []
    shards: set[int] = set()
    async with client.consumer(stream, group=group.name, wait=0.5) as consumer:
        async for record in consumer:
            seen.append(record.payload)
            shards.add(record.shard)
            await record.ack()
            if len(seen) == len(payloads):
                break
        assert consumer.in_flight == 0
    assert sorted(seen) == sorted(payloads) and shards == {0, 1, 2, 3}
    for shard in range(4):
        state = await group.describe(shard)
        assert state.in_flight == 0 and state.owed == 0 and state.committed == state.tail


async def test_the_consumers_acks_share_a_stream_and_a_refusal_there_loses_none(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    """A consumer's acks are pipelined on one stream; a refusal there names no
    request, so it retires the stream and every ack pending on it is sent again
    on a stream of its own: each ack is still answered by its own outcome."""
    stream = felix_fixture["durable_stream"]
    group = await _fresh_group(client, stream, "piped")
    shard = await client.shard_for_key(stream, b"piped")
    for i in range(40):
        await client.publish(stream, b"p%02d" % i, key=b"piped")
    async with client.consumer(
        stream, group=group.name, shards=[shard], batch=16, max_in_flight=32, wait=0.3
    ) as consumer:
        first = [await consumer.next(timeout=10) for _ in range(8)]
        await asyncio.gather(*(r.ack() for r in first))
        pipe = consumer._acks._channels[None]
        second = [await consumer.next(timeout=10) for _ in range(24)]
        refused, *acked = await asyncio.gather(
            consumer._acks.ack(shard, 10**9),  # past the tail: refused on the shared stream
            *(r.ack() for r in second),
        )
        assert refused is False and acked == [None] * 24
        assert pipe.closed and consumer._acks._channels.get(None) is not pipe
        with pytest.raises(InvalidRequestError):
            await group.ack(shard, 10**9)  # on its own stream the refusal is its own
        rest = [await consumer.next(timeout=10) for _ in range(8)]
        await asyncio.gather(*(r.ack() for r in rest))
        assert [r.payload for r in first + second + rest] == [b"p%02d" % i for i in range(40)]
        assert consumer.in_flight == 0
    state = await group.describe(shard)
    assert state.in_flight == 0 and state.owed == 0 and state.committed == state.tail


async def test_the_consumer_bounds_what_is_in_flight(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["durable_stream"]
    group = await _fresh_group(client, stream, "bounded")
    for i in range(10):
        await client.publish(stream, b"b%d" % i, key=b"bounded")
    async with client.consumer(stream, group=group.name, max_in_flight=3, wait=0.3) as consumer:
        held = [await consumer.next(timeout=10) for _ in range(3)]
        assert consumer.in_flight == 3
        with pytest.raises(ClientTimeoutError):
            await consumer.next(timeout=1.0)
        await held[0].ack()
        fourth = await consumer.next(timeout=10)
        assert fourth.payload == b"b3"
        with pytest.raises(felix_client.ClientError):
            await held[0].ack()  # settled once only
        await held[1].nack(delay=0.3)
        again = await consumer.next(timeout=10)
        assert (again.payload, again.attempts) == (b"b1", 2)
    # Closing handed back what was claimed and not settled.
    shard = await client.shard_for_key(stream, b"bounded")
    assert (await group.describe(shard)).in_flight == 0


async def test_the_consumer_extends_claims_in_work(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["durable_stream"]
    group = await _fresh_group(client, stream, "extend")
    await client.publish(stream, b"slow job", key=b"extend")
    shard = await client.shard_for_key(stream, b"extend")
    async with client.consumer(stream, group=group.name, visibility=1.0, wait=0.3) as consumer:
        record = await consumer.next(timeout=10)
        await asyncio.sleep(2.5)  # well past the 1 s claim
        # Nobody else got it meanwhile: the claim was kept alive.
        assert await group.poll(shard, max_records=1) == []
        await record.ack()
    assert (await group.describe(shard)).committed == record.offset + 1


async def test_a_consumer_member_reclaims_after_a_restart(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["durable_stream"]
    group = await _fresh_group(client, stream, "member")
    await client.publish(stream, b"reclaimed", key=b"member")
    shard = await client.shard_for_key(stream, b"member")
    claimed = await group.poll(shard, max_records=1, wait=5, consumer="w1", visibility=60)
    assert [r.payload for r in claimed] == [b"reclaimed"]
    # A restarted w1 gets its own claim back now, not after the 60 s lapse.
    async with client.consumer(stream, group=group.name, consumer="w1", wait=0.3) as consumer:
        record = await consumer.next(timeout=10)
        assert (record.payload, record.attempts) == (b"reclaimed", 2)
        await record.ack()
