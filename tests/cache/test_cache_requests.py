"""Cache requests over real QUIC: exact answers, conditions, races, TTL, eviction, pipelining."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from felix_broker.cache.service import CacheLimits
from felix_broker.cache.shard import CacheShard
from felix_wire.features import Feature
from felix_wire.messages import (
    CacheCondition,
    CacheConditionResult,
    CacheDelete,
    CacheDeleteIf,
    CacheGet,
    CacheOk,
    CachePut,
    CachePutIf,
    CacheValue,
    CacheWatch,
    CounterAdd,
    Error,
    Unsupported,
    VersionCondition,
)

from ..fleet.harness import TOPOLOGIES, leader_of
from ..support.wire import NS, TENANT, WireClient
from .harness import CACHE, MULTI, WITHOUT_CONDITIONAL, cache_broker

pytestmark = pytest.mark.timeout(60)


def put(
    key: str, value: bytes, rid: int, ttl_ms: int | None = None, cache: str = CACHE
) -> CachePut:
    return CachePut(
        tenant_id=TENANT,
        namespace=NS,
        cache=cache,
        key=key,
        value=value,
        request_id=rid,
        ttl_ms=ttl_ms,
    )


def get(key: str, rid: int, cache: str = CACHE) -> CacheGet:
    return CacheGet(tenant_id=TENANT, namespace=NS, cache=cache, key=key, request_id=rid)


def value(key: str, data: bytes | None, rid: int, version: int | None = None) -> CacheValue:
    return CacheValue(
        tenant_id=TENANT,
        namespace=NS,
        cache=CACHE,
        key=key,
        value=data,
        request_id=rid,
        version=version,
    )


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_put_get_delete_answers(tmp_path: Path, durable: bool, topology: str) -> None:
    async with cache_broker(tmp_path, durable=durable, topology=topology) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        await s.send(put("k", b"v1", 1))
        assert await s.recv() == CacheOk(request_id=1)
        await s.send(get("k", 2))
        hit = await s.recv()
        assert isinstance(hit, CacheValue) and hit.version is not None
        assert hit == value("k", b"v1", 2, hit.version)
        await s.send(
            CacheDelete(tenant_id=TENANT, namespace=NS, cache=CACHE, key="k", request_id=3)
        )
        assert await s.recv() == value("k", b"v1", 3)  # the removed value, no version
        await s.send(
            CacheDelete(tenant_id=TENANT, namespace=NS, cache=CACHE, key="k", request_id=4)
        )
        assert await s.recv() == value("k", None, 4)
        await s.send(get("k", 5))
        assert await s.recv() == value("k", None, 5)
        # Without a request_id: cache_ok still carries one (decision cache-put-answer),
        # cache_value leaves it out.
        await s.send(CachePut(tenant_id=TENANT, namespace=NS, cache=CACHE, key="n", value=b""))
        assert await s.recv() == CacheOk(request_id=0)
        await s.send(CacheGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key="n"))
        empty = await s.recv()
        assert isinstance(empty, CacheValue) and empty.value == b"" and empty.request_id is None
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_version_only_to_conditional_offerers(tmp_path: Path, topology: str) -> None:
    async with cache_broker(tmp_path, durable=False, topology=topology) as broker:
        client = await WireClient.connect(broker)
        plain = await client.session(features=WITHOUT_CONDITIONAL)
        await plain.send(put("k", b"v", 1))
        assert await plain.recv() == CacheOk(request_id=1)
        await plain.send(get("k", 2))
        assert await plain.recv() == value("k", b"v", 2)  # no version field at all
        client.close()


async def test_features_in_memory_and_durable(tmp_path: Path) -> None:
    watch_bits = int(
        Feature.FEATURE_CACHE_WATCH
        | Feature.FEATURE_COUNTERS
        | Feature.FEATURE_CACHE_WATCH_RETAINED
    )
    always = int(Feature.FEATURE_CACHE_DELETE | Feature.FEATURE_CACHE_CONDITIONAL)
    async with cache_broker(tmp_path / "m", durable=False) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        assert client.server_features & always == always
        assert not client.server_features & watch_bits
        # Not advertised, so answered like any request this broker does not serve.
        add = CounterAdd(
            tenant_id=TENANT, namespace=NS, cache=CACHE, key="n", delta=1, request_id=9
        )
        await s.send(add)
        assert await s.recv() == Unsupported(request_type="counter_add", request_id=9)
        await s.send(CacheWatch(tenant_id=TENANT, namespace=NS, cache=CACHE, key="k"))
        assert await s.recv() == Unsupported(request_type="cache_watch")
        client.close()
    async with cache_broker(tmp_path / "d", durable=True) as broker:
        client = await WireClient.connect(broker)
        await client.session()
        assert client.server_features & (always | watch_bits) == always | watch_bits
        client.close()


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_conditional_writes(tmp_path: Path, durable: bool, topology: str) -> None:
    async with cache_broker(tmp_path, durable=durable, topology=topology) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()

        def put_if(rid: int, data: bytes, condition: CacheCondition) -> CachePutIf:
            return CachePutIf(
                tenant_id=TENANT,
                namespace=NS,
                cache=CACHE,
                key="lease",
                value=data,
                condition=condition,
                request_id=rid,
            )

        await s.send(put_if(1, b"a", "absent"))
        first = await s.recv()
        assert isinstance(first, CacheConditionResult) and first.applied and first.request_id == 1
        assert first.version is not None
        await s.send(put_if(2, b"b", "absent"))
        assert await s.recv() == CacheConditionResult(
            applied=False, version=first.version, request_id=2
        )
        await s.send(put_if(3, b"c", VersionCondition(version=first.version + 12345)))
        assert await s.recv() == CacheConditionResult(
            applied=False, version=first.version, request_id=3
        )
        await s.send(put_if(4, b"d", VersionCondition(version=first.version)))
        second = await s.recv()
        assert isinstance(second, CacheConditionResult) and second.applied
        assert second.version is not None and second.version > first.version
        await s.send(get("lease", 5))
        assert await s.recv() == value("lease", b"d", 5, second.version)

        def delete_if(rid: int, version: int) -> CacheDeleteIf:
            return CacheDeleteIf(
                tenant_id=TENANT,
                namespace=NS,
                cache=CACHE,
                key="lease",
                version=version,
                request_id=rid,
            )

        await s.send(delete_if(6, first.version))
        assert await s.recv() == CacheConditionResult(
            applied=False, version=second.version, request_id=6
        )
        await s.send(delete_if(7, second.version))
        assert await s.recv() == CacheConditionResult(applied=True, request_id=7)
        await s.send(delete_if(8, second.version))
        assert await s.recv() == CacheConditionResult(applied=False, request_id=8)
        # A version condition on an absent key is refused without a version.
        await s.send(put_if(9, b"e", VersionCondition(version=second.version)))
        assert await s.recv() == CacheConditionResult(applied=False, request_id=9)
        client.close()


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_racing_absent_puts_exactly_one_wins(
    tmp_path: Path, durable: bool, topology: str
) -> None:
    async with cache_broker(tmp_path, durable=durable, topology=topology) as broker:
        clients = [await WireClient.connect(broker) for _ in range(4)]
        streams = [await c.session() for c in clients for _ in range(4)]

        async def contend(i: int) -> CacheConditionResult:
            s = streams[i % len(streams)]
            request = CachePutIf(
                tenant_id=TENANT,
                namespace=NS,
                cache=CACHE,
                key="race",
                value=str(i).encode(),
                condition="absent",
                request_id=i,
            )
            await s.send(request)
            answer = await s.recv()
            assert isinstance(answer, CacheConditionResult)
            return answer

        for rnd in range(3):
            results = await asyncio.gather(*(contend(rnd * 100 + i) for i in range(16)))
            winners = [r for r in results if r.applied]
            assert len(winners) == 1, results
            assert {r.version for r in results} == {winners[0].version}
            s = streams[0]
            await s.send(
                CacheDelete(tenant_id=TENANT, namespace=NS, cache=CACHE, key="race", request_id=999)
            )
            removed = await s.recv()
            assert isinstance(removed, CacheValue)
            assert removed.value == str(winners[0].request_id).encode()
        for c in clients:
            c.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_many_in_flight_answered_by_request_id_without_head_of_line(
    tmp_path: Path, topology: str
) -> None:
    # on_commit: a put's answer waits for its fsync (under none and periodic a put is
    # answered as soon as it is written, from the stream's reader, with no wait).
    async with cache_broker(
        tmp_path, topology=topology, durable=True, durable_fsync_mode="on_commit"
    ) as broker:
        owner = leader_of(broker)  # where the writes are made durable
        assert owner.cache is not None
        client = await WireClient.connect(broker)
        s = await client.session()
        # Make one key's writes slow to become durable: the 31 requests behind it
        # on the same stream must not wait for it.
        spec = owner.config.catalog.cache(TENANT, NS, CACHE)
        assert spec is not None
        shard = owner.cache.shard_of_key(spec, "slow")
        real_wait = shard.wait_durable
        release = asyncio.Event()

        async def slow_wait(offset: int | None) -> None:
            slow = shard.entries.get("slow")
            if offset is not None and slow is not None and slow.offset == offset:
                await release.wait()
            await real_wait(offset)

        shard.wait_durable = slow_wait  # type: ignore[method-assign]
        await s.send(put("slow", b"x", 1))
        for rid in range(2, 33):
            await s.send(
                put(f"k{rid}", str(rid).encode(), rid) if rid % 2 else get(f"k{rid - 1}", rid)
            )
        seen: list[int] = []
        for _ in range(31):
            answer = await s.recv()
            assert isinstance(answer, CacheOk | CacheValue)
            assert answer.request_id is not None
            seen.append(answer.request_id)
        assert sorted(seen) == list(range(2, 33))  # all but the slow one, already
        release.set()
        assert await s.recv() == CacheOk(request_id=1)
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_ttl_reads_absent_at_once_and_the_pass_deletes(tmp_path: Path, topology: str) -> None:
    limits = CacheLimits(ttl_pass_interval=0.1)
    async with cache_broker(tmp_path, topology=topology, durable=False, limits=limits) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        await s.send(put("short", b"v", 1, ttl_ms=200))
        await s.send(put("long", b"v", 2, ttl_ms=60_000))
        await s.send(put("forever", b"v", 3))
        for _ in range(3):
            assert isinstance(await s.recv(), CacheOk)
        await s.send(get("short", 4))
        assert (await s.recv()) == value("short", b"v", 4, version=_version(broker, "short"))
        await asyncio.sleep(0.25)
        await s.send(get("short", 5))
        assert await s.recv() == value("short", None, 5)
        await asyncio.sleep(0.3)
        assert "short" not in _shard(broker).entries  # the pass removed it
        assert leader_of(broker).cache.expirations._value.get() >= 1
        await s.send(get("long", 6))
        assert isinstance(await s.recv(), CacheValue)
        client.close()


def _shard(broker: object) -> CacheShard:
    """The cache's shard at the broker that holds it (the leader, in a fleet)."""
    owner = leader_of(broker)
    assert owner.cache is not None
    spec = owner.config.catalog.cache(TENANT, NS, CACHE)
    assert spec is not None
    shard: CacheShard = owner.cache.shard(spec, 0)
    return shard


def _version(broker: object, key: str) -> int:
    return _shard(broker).entries[key].version


async def test_ttl_pass_is_bounded_per_shard(tmp_path: Path) -> None:
    limits = CacheLimits(ttl_pass_interval=3600, ttl_deletes_per_pass=5)
    async with cache_broker(tmp_path, durable=False, limits=limits) as broker:
        shard = _shard(broker)
        now = int(time.time() * 1000)
        for i in range(12):
            shard.put(f"k{i}", b"v", 1, now)
        assert shard.expire_due(now + 10) == 5
        assert shard.expire_due(now + 10) == 5
        assert shard.expire_due(now + 10) == 2
        assert not shard.entries


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("durable", [False, True])
async def test_memory_bound_evicts_least_recently_used(
    tmp_path: Path, durable: bool, topology: str
) -> None:
    limits = CacheLimits(max_shard_bytes=10 * (1000 + 64 + 3))
    async with cache_broker(tmp_path, topology=topology, durable=durable, limits=limits) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        for i in range(10):
            await s.send(put(f"k{i}", bytes(1000), i))
            assert await s.recv() == CacheOk(request_id=i)
        await s.send(get("k0", 100))  # k0 is now the most recently used
        assert isinstance(await s.recv(), CacheValue)
        await s.send(put("k10", bytes(1000), 101))
        assert await s.recv() == CacheOk(request_id=101)
        await s.send(get("k1", 102))  # the least recently used went
        assert await s.recv() == value("k1", None, 102)
        await s.send(get("k0", 103))
        hit = await s.recv()
        assert isinstance(hit, CacheValue) and hit.value == bytes(1000)
        assert leader_of(broker).cache.evictions._value.get() == 1  # at the holder
        # One entry larger than the whole bound is refused.
        await s.send(put("huge", bytes(20_000), 104))
        refused = await s.recv()
        assert isinstance(refused, Error) and refused.code == "limit_exceeded"
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_permissions_and_unknown_cache(tmp_path: Path, topology: str) -> None:
    async with cache_broker(tmp_path, durable=True, topology=topology) as broker:
        client = await WireClient.connect(broker)
        reader = await client.session(perms=[f"cache.read:cache:{TENANT}/*"])
        await reader.send(get("k", 1))
        assert await reader.recv() == value("k", None, 1)
        await reader.send(put("k", b"v", 2))
        refused = await reader.recv()
        assert isinstance(refused, Error) and refused.code == "forbidden"
        add = CounterAdd(
            tenant_id=TENANT, namespace=NS, cache=CACHE, key="n", delta=1, request_id=3
        )
        await reader.send(add)
        refused = await reader.recv()
        assert isinstance(refused, Error) and refused.code == "forbidden"
        writer = await client.session(perms=[f"cache.write:cache:{TENANT}/*"])
        await writer.send(put("k", b"v", 4))
        assert await writer.recv() == CacheOk(request_id=4)
        await writer.send(CacheWatch(tenant_id=TENANT, namespace=NS, cache=CACHE, key="k"))
        refused = await writer.recv()
        assert isinstance(refused, Error) and refused.code == "forbidden"
        s = await client.session()
        await s.send(get("k", 5, cache="nope"))
        missing = await s.recv()
        assert isinstance(missing, Error) and missing.code == "not_found"
        await s.send(CacheGet(tenant_id="t2", namespace=NS, cache=CACHE, key="k", request_id=6))
        other = await s.recv()
        assert isinstance(other, Error) and other.code == "forbidden"
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_keys_route_to_shards_by_cache_mode(tmp_path: Path, topology: str) -> None:
    from felix_wire.routing import CACHE_MODE, shard_for_key

    async with cache_broker(tmp_path, topology=topology, durable=True) as broker:
        holder = leader_of(broker)  # where the keys are held
        assert holder.cache is not None
        client = await WireClient.connect(broker)
        s = await client.session()
        keys = [f"user-{i}" for i in range(40)]
        for rid, key in enumerate(keys):
            await s.send(put(key, key.encode(), rid, cache=MULTI))
            assert await s.recv() == CacheOk(request_id=rid)
        spec = holder.config.catalog.cache(TENANT, NS, MULTI)
        assert spec is not None
        used = set()
        for key in keys:
            index = shard_for_key(key.encode(), 4, CACHE_MODE)
            used.add(index)
            assert key in holder.cache.shard(spec, index).entries
        assert len(used) > 1
        client.close()
