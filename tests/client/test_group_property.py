"""A property of the consumer, over real QUIC against the reference broker: across
any sequence of consumer restarts, each settling what it got by ack, nack or not
at all, every record of the stream is processed at least once and a record once
acked is never delivered again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import felix_client
from felix_client import ClientTimeoutError

from .conftest import connect_client

pytestmark = pytest.mark.timeout(240)

Fate = str  # "ack" | "nack" | "leave"
sessions_strategy = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=10),  # records this consumer takes
        st.lists(st.sampled_from(["ack", "nack", "leave"]), min_size=1, max_size=6),
    ),
    max_size=3,
)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(count=st.integers(min_value=1, max_value=20), sessions=sessions_strategy)
def test_at_least_once_and_never_after_an_ack(
    felix_fixture: dict[str, Any], count: int, sessions: list[tuple[int, list[Fate]]]
) -> None:
    asyncio.run(_bounded(_run(felix_fixture, count, sessions), 60))


async def _run(doc: dict[str, Any], count: int, sessions: list[tuple[int, list[Fate]]]) -> None:
    stream = doc["durable_stream"]
    async with await connect_client(doc) as client:
        group = client.group(stream, f"prop-{uuid.uuid4().hex[:10]}")
        for shard in range(await client.stream_shards(stream)):
            await group.seek(shard, "latest", if_new=True)
        published = {b"p-%d" % i for i in range(count)}
        for payload in sorted(published):
            await client.publish(stream, payload, key=payload)

        processed: set[bytes] = set()
        acked: set[bytes] = set()
        for take, fates in sessions:
            async with _consumer(client, group) as consumer:
                for i in range(take):
                    try:
                        record = await consumer.next(timeout=1.0)
                    except ClientTimeoutError:
                        break
                    assert record.payload not in acked, "an acked record came back"
                    processed.add(record.payload)
                    fate = fates[i % len(fates)]
                    if fate == "ack":
                        await record.ack()
                        acked.add(record.payload)
                    elif fate == "nack":
                        await record.nack()
            # "leave": the consumer hands it back as it closes.

        # A record handed back too often is dead-lettered (FELIX_GROUP_MAX_ATTEMPTS):
        # processed, and never delivered again unless redriven.
        dead: set[bytes] = set()
        async with _consumer(client, group) as consumer:
            while acked | dead != published:
                try:
                    record = await consumer.next(timeout=3)
                except ClientTimeoutError:
                    dead = await _dead_letters(client, group)
                    assert acked | dead == published
                    break
                assert record.payload not in acked, "an acked record came back"
                processed.add(record.payload)
                await record.ack()
                acked.add(record.payload)
            with pytest.raises(ClientTimeoutError):
                await consumer.next(timeout=0.5)  # and nothing more
        assert processed == published
        assert not acked & dead


async def _dead_letters(client: felix_client.Client, group: felix_client.Group) -> set[bytes]:
    out: set[bytes] = set()
    for shard in range(await client.stream_shards(group.stream)):
        for offset in await group.dead_letters(shard):
            pages = client.stream_read(group.stream, start=offset, end=offset + 1, shard=shard)
            async for page in pages:
                out.update(r.payload for r in page.records)
    return out


def _consumer(client: felix_client.Client, group: felix_client.Group) -> felix_client.Consumer:
    return client.consumer(group.stream, group=group.name, wait=0.2, max_in_flight=8, batch=4)


async def _bounded(run: Coroutine[Any, Any, None], seconds: float) -> None:
    async with asyncio.timeout(seconds):
        await run
