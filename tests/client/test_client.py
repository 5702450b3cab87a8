"""Every client call against the reference broker, over real QUIC."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import felix_client
from felix_client import (
    ClientConfig,
    ForbiddenError,
    NotFoundError,
    NotSupportedByBrokerError,
    UnauthenticatedError,
)
from felix_wire.features import Capabilities, Feature

from .conftest import amint_token, connect_client

pytestmark = pytest.mark.timeout(60)


async def test_connect_negotiates_and_closes(felix_fixture: dict[str, Any]) -> None:
    async with await connect_client(felix_fixture) as client:
        caps = client.capabilities
        assert caps.has_feature(Feature.FEATURE_ERROR_CODES)
        assert caps.has_feature(Feature.FEATURE_STREAM_SHARDS)
        assert await client.stream_shards(felix_fixture["durable_stream"]) == 4
        assert await client.stream_shards(felix_fixture["missing_stream"]) == 0
    await client.aclose()  # idempotent


async def test_token_provider_is_asked_per_stream(felix_fixture: dict[str, Any]) -> None:
    calls = 0

    async def provider() -> str:
        nonlocal calls
        calls += 1
        return str(felix_fixture["token"])

    client = await felix_client.connect(
        felix_fixture["addrs"],
        tenant_id=felix_fixture["tenant_id"],
        token_provider=provider,
        namespace=felix_fixture["namespace"],
        ca_file=felix_fixture["ca_file"],
    )
    async with client:
        await client.publish(felix_fixture["memory_stream"], b"p")
    assert calls == 2  # the probe stream and one publish stream


async def test_publish_modes(client: felix_client.Client, felix_fixture: dict[str, Any]) -> None:
    memory, durable = felix_fixture["memory_stream"], felix_fixture["durable_stream"]
    # The in-memory stream is acknowledged when queued: no offset.
    assert await client.publish(memory, b"acked") is None
    assert await client.publish(memory, b"unacked", ack="none") is None
    assert await client.publish(durable, b"keyed", key=b"user-1") is None
    assert await client.publish_batch(memory, [b"a", b"b", b"c"]) is None
    assert await client.publish_batch(durable, [b"a", b"b"], key=b"k", ack="none") is None
    assert await client.publish_batch(memory, [b"a"], ack="per_message") is None
    with pytest.raises(ValueError):
        await client.publish_batch(memory, [])


async def test_subscribe_receives_events(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["memory_stream"]
    async with client.subscribe(stream) as sub:
        assert sub.shards == [0] and sub.subscription_ids[0] is not None
        await client.publish_batch(stream, [b"one", b"two"])
        await client.publish(stream, b"three", ack="none")
        got = [await sub.next(timeout=5) for _ in range(3)]
    assert [e.payload for e in got] == [b"one", b"two", b"three"]
    assert all(e.shard == 0 and e.publisher == "fixture" for e in got)
    assert sub.closed
    with pytest.raises(StopAsyncIteration):
        await sub.next()


async def test_subscribe_by_await_and_iteration_on_a_keyed_shard(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["durable_stream"]
    shard = await client.shard_for_key(stream, b"order-7")
    sub = await client.subscribe(stream, shard=shard)
    try:
        for i in range(3):
            await client.publish(stream, b"k%d" % i, key=b"order-7")
        seen = []
        async for event in sub:
            seen.append(event.payload)
            if len(seen) == 3:
                break
        assert seen == [b"k0", b"k1", b"k2"]
        with pytest.raises(TimeoutError):
            await sub.next(timeout=0.2)
    finally:
        await sub.aclose()


async def test_two_subscribers_each_get_everything(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["memory_stream"]
    async with client.subscribe(stream) as a, client.subscribe(stream) as b:
        await client.publish_batch(stream, [b"x", b"y"])
        for sub in (a, b):
            assert [(await sub.next(timeout=5)).payload for _ in range(2)] == [b"x", b"y"]


async def test_errors_are_typed(client: felix_client.Client, felix_fixture: dict[str, Any]) -> None:
    missing = felix_fixture["missing_stream"]
    with pytest.raises(NotFoundError) as info:
        await client.publish(missing, b"x")
    assert info.value.retry is felix_client.RetryClass.RETRY_AFTER
    assert info.value.code is felix_client.ErrorCode.NOT_FOUND
    with pytest.raises(NotFoundError):
        await client.publish_batch(missing, [b"x", b"y"])
    with pytest.raises(NotFoundError):
        await client.subscribe(missing)
    # A refusal leaves the stream usable.
    assert await client.publish(felix_fixture["memory_stream"], b"still fine") is None


async def test_unauthorized_token_is_forbidden(felix_fixture: dict[str, Any]) -> None:
    async with await connect_client(felix_fixture, token=felix_fixture["unauthorized_token"]) as c:
        with pytest.raises(ForbiddenError) as info:
            await c.publish(felix_fixture["memory_stream"], b"x")
        assert info.value.retry is felix_client.RetryClass.FATAL
        with pytest.raises(ForbiddenError):
            await c.subscribe(felix_fixture["memory_stream"])


async def test_forged_token_is_unauthenticated(felix_fixture: dict[str, Any]) -> None:
    forged = await amint_token(felix_fixture, forged=True)
    with pytest.raises(UnauthenticatedError):
        await connect_client(felix_fixture, token=forged)
    # (An expired token needs the broker's 60 s leeway to pass: not tested here.)


async def test_pipelined_acked_publishes(
    felix_fixture: dict[str, Any],
) -> None:
    stream = felix_fixture["memory_stream"]
    config = ClientConfig(max_inflight_publish_bytes=4096)
    async with await connect_client(felix_fixture, config=config) as client:
        count = 400
        await client.publish(stream, b"warm-up")  # opens the pooled stream first
        async with client.subscribe(stream) as sub:
            payloads = [b"p%04d" % i + b"." * 64 for i in range(count)]
            await asyncio.gather(*(client.publish(stream, p) for p in payloads))
            got = [(await sub.next(timeout=5)).payload for _ in range(count)]
        # All on one pooled stream (same stream, no key), admitted first come first
        # served under the 4 KiB in-flight bound: order is the callers' order.
        assert got == payloads


async def test_stream_read_pages_and_offset_for_time(felix_fixture: dict[str, Any]) -> None:
    """Against a broker with durable storage: bounded reads and time lookups."""
    config = ClientConfig(ack_on_commit=True)  # acks after the write carry offsets
    async with await connect_client(felix_fixture, config=config) as client:
        assert client.supports(Feature.FEATURE_STREAM_READ)
        stream = felix_fixture["durable_stream"]
        before = time.time_ns() // 1000
        first = await client.publish(stream, b"read-0")
        assert first is not None
        for i in range(1, 5):
            assert await client.publish(stream, f"read-{i}".encode()) == first + i
        pages = [
            page
            async for page in client.stream_read(stream, start=first, end=first + 5, max_records=2)
        ]
        assert [len(page.records) for page in pages] == [2, 2, 1]
        records = [record for page in pages for record in page.records]
        assert [r.payload for r in records] == [f"read-{i}".encode() for i in range(5)]
        assert [r.offset for r in records] == list(range(first, first + 5))
        assert all(r.timestamp_micros >= before for r in records)
        assert await client.offset_for_time(stream, before) == first
        assert await client.offset_for_time(stream, time.time_ns() // 1000 + 10**8) is None


async def test_brokers_that_advertise_less_get_nothing_they_lack(
    felix_fixture: dict[str, Any],
) -> None:
    """Against a broker advertising only the v1 basics (modelled by narrowing the
    negotiated capabilities), every featured request fails locally."""
    async with await connect_client(felix_fixture) as client:
        client._capabilities = Capabilities(client.capabilities.flags, 0)
        cache = client.cache(felix_fixture["cache"])
        opened = _streams_open(client)
        for call in (
            lambda: cache.delete("k"),
            lambda: cache.put_if("k", b"v", absent=True),
            lambda: cache.delete_if("k", version=1),
            lambda: cache.counter_add("k", 1),
            lambda: cache.counter_get("k"),
            lambda: client.stream_shards(felix_fixture["durable_stream"]),
            lambda: client.cache_shards(felix_fixture["cache"]),
            lambda: client.shard_owners(felix_fixture["durable_stream"]),
            lambda: client.offset_for_time(felix_fixture["durable_stream"], 0),
        ):
            with pytest.raises(NotSupportedByBrokerError):
                await call()
        with pytest.raises(NotSupportedByBrokerError):
            cache.watch(key="k")
        with pytest.raises(NotSupportedByBrokerError) as info:
            client.stream_read(felix_fixture["durable_stream"], start=0)
        assert info.value.missing == ("FEATURE_STREAM_READ",)
        with pytest.raises(NotSupportedByBrokerError, match="queue_capacity"):
            client.subscribe(felix_fixture["memory_stream"], queue_capacity=16)
        assert _streams_open(client) == opened


def _streams_open(client: felix_client.Client) -> int:
    pools = (client._publish, client._requests, client._events)
    return sum(len(link.open_channels()) for pool in pools for link in pool._links if link)


async def test_discovery(client: felix_client.Client, felix_fixture: dict[str, Any]) -> None:
    assert await client.cache_shards(felix_fixture["cache"]) == 4
    assert await client.cache_shards(felix_fixture["single_shard_cache"]) == 1
    owners = await client.shard_owners(felix_fixture["durable_stream"])
    assert [o.shard for o in owners] == [0, 1, 2, 3]
    owners = await client.shard_owners(felix_fixture["cache"], kind="cache")
    assert len(owners) == 4


async def test_broken_connection_is_replaced(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["memory_stream"]
    await client.publish(stream, b"before")
    for link in client._publish._links:
        if link is not None:
            link.connection.close()
            await link.connection.wait_closed()
    assert await client.publish(stream, b"after") is None


async def test_retry_helper_retries_what_the_class_allows(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    attempts = 0

    async def publish_missing() -> int | None:
        nonlocal attempts
        attempts += 1
        return await client.publish(felix_fixture["missing_stream"], b"x")

    with pytest.raises(NotFoundError):  # retry_after: retried, then given up
        await felix_client.retry(publish_missing, attempts=3, base_delay=0.001)
    assert attempts == 3
    attempts = 0
    async with await connect_client(felix_fixture, token=felix_fixture["unauthorized_token"]) as c:

        async def publish_forbidden() -> int | None:
            nonlocal attempts
            attempts += 1
            return await c.publish(felix_fixture["memory_stream"], b"x")

        with pytest.raises(ForbiddenError):  # fatal: never retried
            await felix_client.retry(publish_forbidden, attempts=3)
    assert attempts == 1
