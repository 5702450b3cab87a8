"""Cache calls against the reference broker (each skipped if the broker does not advertise it)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import felix_client
from felix_wire.features import Feature

pytestmark = pytest.mark.timeout(60)


def need(client: felix_client.Client, feature: Feature) -> None:
    if not client.supports(feature):
        pytest.skip(f"the reference broker does not advertise {feature.name} yet")


def fresh() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


async def test_put_get_delete(client: felix_client.Client, felix_fixture: dict[str, Any]) -> None:
    cache = client.cache(felix_fixture["cache"])
    key = fresh()
    assert await cache.get(key) is None
    await cache.put(key, b"value")
    assert await cache.get(key) == b"value"
    need(client, Feature.FEATURE_CACHE_DELETE)
    assert await cache.delete(key) == b"value"
    assert await cache.delete(key) is None
    assert await cache.get(key) is None


async def test_ttl_expires(client: felix_client.Client, felix_fixture: dict[str, Any]) -> None:
    cache = client.cache(felix_fixture["single_shard_cache"])
    key = fresh()
    await cache.put(key, b"short", ttl=0.2)
    assert await cache.get(key) == b"short"
    await asyncio.sleep(0.5)
    assert await cache.get(key) is None


async def test_conditional_writes(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    need(client, Feature.FEATURE_CACHE_CONDITIONAL)
    cache = client.cache(felix_fixture["cache"])
    key = fresh()
    first = await cache.put_if(key, b"a", absent=True)
    assert first.applied and first.version is not None
    again = await cache.put_if(key, b"b", absent=True)
    assert not again.applied and again.version == first.version
    entry = await cache.get_entry(key)
    assert entry is not None and entry.value == b"a" and entry.version == first.version
    second = await cache.put_if(key, b"c", version=first.version)
    assert second.applied
    stale = await cache.delete_if(key, version=first.version)
    assert not stale.applied
    assert (await cache.delete_if(key, version=second.version or 0)).applied
    assert await cache.get(key) is None


async def test_counters(client: felix_client.Client, felix_fixture: dict[str, Any]) -> None:
    need(client, Feature.FEATURE_COUNTERS)
    cache = client.cache(felix_fixture["cache"])
    key = fresh()
    assert await cache.counter_get(key) is None
    assert await cache.counter_add(key, 5) == 5
    assert await cache.counter_add(key, -2) == 3
    assert await cache.counter_get(key) == 3


async def test_many_requests_in_flight(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    cache = client.cache(felix_fixture["cache"])
    keys = [fresh() for _ in range(200)]
    await asyncio.gather(*(cache.put(k, k.encode()) for k in keys))
    values = await asyncio.gather(*(cache.get(k) for k in keys))
    assert values == [k.encode() for k in keys]


async def test_watch_key_and_prefix(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    need(client, Feature.FEATURE_CACHE_WATCH)
    cache = client.cache(felix_fixture["single_shard_cache"])
    key = fresh()
    async with cache.watch(key=key) as watch:
        await cache.put(key, b"1")
        await cache.put(key, b"2")
        first, second = await watch.next(timeout=5), await watch.next(timeout=5)
        assert (first.key, first.value, second.value) == (key, b"1", b"2")
        assert second.offset > first.offset
        if client.supports(Feature.FEATURE_CACHE_DELETE):
            await cache.delete(key)
            assert (await watch.next(timeout=5)).value is None
    prefix = fresh()
    await cache.put(prefix + "/a", b"old")
    need(client, Feature.FEATURE_CACHE_WATCH_RETAINED)
    async with cache.watch(prefix=prefix, shard=0, retained=True) as watch:
        retained = await watch.next(timeout=5)
        assert (retained.key, retained.value) == (prefix + "/a", b"old")
        await cache.put(prefix + "/b", b"new")
        change = await watch.next(timeout=5)
        assert (change.key, change.value) == (prefix + "/b", b"new")
