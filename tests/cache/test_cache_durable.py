"""The log-backed cache over real QUIC: counters, watches, restart, compaction."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from felix_broker.app import Broker
from felix_broker.cache.service import WATCH_ID_BASE, CacheLimits
from felix_broker.cache.shard import CacheShard
from felix_wire.messages import (
    CacheEvent,
    CacheGet,
    CacheOk,
    CachePut,
    CacheValue,
    CacheWatch,
    CacheWatchLagged,
    CacheWatchStarted,
    CounterAdd,
    CounterGet,
    CounterValue,
    CursorErrorReason,
    Error,
    SubscribeCursorError,
)

from ..fleet.harness import THROUGH_LEADER, TOPOLOGIES
from ..support.wire import NS, TENANT, WireClient, WireStream
from .harness import CACHE, MULTI, cache_broker

pytestmark = pytest.mark.timeout(90)


def put(key: str, data: bytes, rid: int, ttl_ms: int | None = None) -> CachePut:
    return CachePut(
        tenant_id=TENANT,
        namespace=NS,
        cache=CACHE,
        key=key,
        value=data,
        request_id=rid,
        ttl_ms=ttl_ms,
    )


def watch(**fields: object) -> CacheWatch:
    return CacheWatch(tenant_id=TENANT, namespace=NS, cache=CACHE, **fields)  # type: ignore[arg-type]


def shard_of(broker: Broker) -> CacheShard:
    assert broker.cache is not None
    spec = broker.config.catalog.cache(TENANT, NS, CACHE)
    assert spec is not None
    return broker.cache.shard(spec, 0)


async def start_watch(
    client: WireClient, request: CacheWatch
) -> tuple[CacheWatchStarted, WireStream]:
    s = await client.session()
    await s.send(request)
    started = await s.recv()
    assert isinstance(started, CacheWatchStarted), started
    assert started.subscription_id >= WATCH_ID_BASE
    return started, await client.event_stream(started.subscription_id)


async def events(frames: WireStream, count: int) -> list[CacheEvent]:
    got = []
    for _ in range(count):
        event = await frames.recv()
        assert isinstance(event, CacheEvent), event
        got.append(event)
    return got


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_counters(tmp_path: Path, topology: str) -> None:
    async with cache_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()

        def add(key: str, delta: int, rid: int) -> CounterAdd:
            return CounterAdd(
                tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, delta=delta, request_id=rid
            )

        def read(key: str, rid: int) -> CounterGet:
            return CounterGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, request_id=rid)

        await s.send(read("hits", 1))
        assert await s.recv() == CounterValue(request_id=1)  # never written: absent
        await s.send(add("hits", 5, 2))
        assert await s.recv() == CounterValue(value=5, request_id=2)
        await s.send(add("hits", -5, 3))
        assert await s.recv() == CounterValue(value=0, request_id=3)
        await s.send(read("hits", 4))
        assert await s.recv() == CounterValue(value=0, request_id=4)  # zero, not absent
        # A cache value under the same key is a separate thing.
        await s.send(put("hits", b"text", 5))
        assert await s.recv() == CacheOk(request_id=5)
        await s.send(add("hits", 2, 6))
        assert await s.recv() == CounterValue(value=2, request_id=6)
        await s.send(
            CacheGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key="hits", request_id=7)
        )
        got = await s.recv()
        assert isinstance(got, CacheValue) and got.value == b"text"
        await s.send(add("hits", 2**63 - 1, 8))
        overflow = await s.recv()
        assert isinstance(overflow, Error) and overflow.code == "invalid_request"
        # Concurrent adds from many streams all count.
        streams = [await client.session() for _ in range(8)]

        async def bump(st: WireStream) -> None:
            for i in range(8):  # eight in flight per stream
                await st.send(add("many", 1, 100 + i))
            for _ in range(8):
                assert isinstance(await st.recv(), CounterValue)

        await asyncio.gather(*(bump(st) for st in streams))
        await s.send(read("many", 9))
        assert await s.recv() == CounterValue(value=64, request_id=9)
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_key_watch_live_changes_and_deletes(tmp_path: Path, topology: str) -> None:
    async with cache_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        await s.send(put("k", b"before", 1))
        assert await s.recv() == CacheOk(request_id=1)
        started, ev = await start_watch(client, watch(key="k"))
        assert started.resnapshot is False and started.retained_count is None
        assert started.resume_offset == shard_of(broker).tail
        await s.send(put("other", b"x", 2))
        await s.send(put("k", b"v1", 3, ttl_ms=60_000))
        await s.send(
            CachePut(
                tenant_id=TENANT, namespace=NS, cache=CACHE, key="k", value=b"v2", request_id=4
            )
        )
        for _ in range(3):
            assert isinstance(await s.recv(), CacheOk)
        from felix_wire.messages import CacheDelete

        await s.send(
            CacheDelete(tenant_id=TENANT, namespace=NS, cache=CACHE, key="k", request_id=5)
        )
        assert isinstance(await s.recv(), CacheValue)
        one, two, gone = await events(ev, 3)
        assert (one.key, one.value) == ("k", b"v1") and one.expires_at_millis > 0
        assert (two.key, two.value, two.expires_at_millis) == ("k", b"v2", 0)
        assert (gone.key, gone.value, gone.expires_at_millis) == ("k", None, 0)
        assert started.resume_offset <= one.offset < two.offset < gone.offset
        # The version a get reports is the offset of the put that set it.
        await s.send(put("k", b"v3", 6))
        assert await s.recv() == CacheOk(request_id=6)
        (three,) = await events(ev, 1)
        assert shard_of(broker).entries["k"].version == three.offset
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_prefix_watch_retained_then_live(tmp_path: Path, topology: str) -> None:
    async with cache_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        for rid, key in enumerate(["room/a", "room/b", "hall/x"]):
            await s.send(put(key, key.encode(), rid))
            assert await s.recv() == CacheOk(request_id=rid)
        started, ev = await start_watch(client, watch(prefix="room/", retained=True))
        assert started.retained_count == 2
        retained = await events(ev, 2)
        assert {(e.key, e.value) for e in retained} == {
            (b"room/a".decode(), b"room/a"),
            ("room/b", b"room/b"),
        }
        await s.send(put("hall/y", b"no", 10))
        await s.send(put("room/c", b"yes", 11))
        assert isinstance(await s.recv(), CacheOk)
        assert isinstance(await s.recv(), CacheOk)
        (live,) = await events(ev, 1)
        assert (live.key, live.value) == ("room/c", b"yes")
        # Nothing retained: the count is there and 0.
        started, _ev = await start_watch(client, watch(key="absent", retained=True))
        assert started.retained_count == 0
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_watch_refusals(tmp_path: Path, topology: str) -> None:
    async with cache_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        for bad in (
            watch(),
            watch(key="k", prefix="p"),
            watch(key="k", retained=True, from_offset=0),
            CacheWatch(tenant_id=TENANT, namespace=NS, cache=MULTI, prefix="p"),
            CacheWatch(tenant_id=TENANT, namespace=NS, cache=MULTI, prefix="p", shard=4),
        ):
            await s.send(bad)
            answer = await s.recv()
            assert isinstance(answer, Error) and answer.code == "invalid_request", (bad, answer)
        tail = shard_of(broker).tail
        await s.send(watch(key="k", from_offset=tail + 5))
        assert await s.recv() == SubscribeCursorError(
            reason=CursorErrorReason.IN_FUTURE, requested=tail + 5, available=tail
        )
        # A prefix watch naming its shard on a multi-shard cache is fine.
        await s.send(CacheWatch(tenant_id=TENANT, namespace=NS, cache=MULTI, prefix="p", shard=3))
        assert isinstance(await s.recv(), CacheWatchStarted)
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_watch_from_offset_replays_then_goes_live_without_gap_or_duplicate(
    tmp_path: Path, topology: str
) -> None:
    async with cache_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        start = shard_of(broker).tail
        for i in range(50):
            await s.send(put(f"p/{i % 5}", str(i).encode(), i))
        for _ in range(50):
            assert isinstance(await s.recv(), CacheOk)
        writer_done = asyncio.Event()

        async def keep_writing() -> None:
            w = await client.session()
            for i in range(50, 150):
                await w.send(put(f"p/{i % 5}", str(i).encode(), i))
                assert isinstance(await w.recv(), CacheOk)
            writer_done.set()

        task = asyncio.create_task(keep_writing())
        started, ev = await start_watch(client, watch(prefix="p/", from_offset=start))
        assert started.resume_offset == start and not started.resnapshot
        got = await events(ev, 150)
        await task
        assert [int(e.value or b"") for e in got] == list(range(150))
        offsets = [e.offset for e in got]
        assert offsets == sorted(set(offsets))
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_ttl_expiry_reaches_a_watcher_as_a_delete(tmp_path: Path, topology: str) -> None:
    limits = CacheLimits(ttl_pass_interval=0.1)
    async with cache_broker(tmp_path, topology=topology, limits=limits) as broker:
        client = await WireClient.connect(broker)
        _started, ev = await start_watch(client, watch(key="session"))
        s = await client.session()
        await s.send(put("session", b"token", 1, ttl_ms=300))
        assert await s.recv() == CacheOk(request_id=1)
        (stored,) = await events(ev, 1)
        assert stored.value == b"token" and stored.expires_at_millis > 0
        (expired,) = await events(ev, 1)
        assert (expired.key, expired.value) == ("session", None) and expired.offset > stored.offset
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_lagging_watch_gets_lagged_and_its_stream_ends(tmp_path: Path, topology: str) -> None:
    limits = CacheLimits(watch_queue_capacity=4)
    async with cache_broker(tmp_path, topology=topology, limits=limits) as broker:
        client = await WireClient.connect(broker)
        started, ev = await start_watch(client, watch(key="hot"))
        shard = shard_of(broker)
        # Ten changes in one synchronous step: the queue (4) overflows before the
        # watch's writer runs at all.
        offsets = [shard.put("hot", str(i).encode(), None, 0).offset for i in range(10)]
        got = await events(ev, 4)
        assert [e.offset for e in got] == offsets[:4]
        assert await ev.recv() == CacheWatchLagged(resume_from=offsets[4])
        with pytest.raises(EOFError):
            await ev.recv()
        # Re-watching from resume_from is gapless.
        started, ev = await start_watch(client, watch(key="hot", from_offset=offsets[4]))
        got = await events(ev, 6)
        assert [e.offset for e in got] == offsets[4:]
        assert started.subscription_id > WATCH_ID_BASE
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_stop_sending_ends_the_watch(tmp_path: Path, topology: str) -> None:
    async with cache_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        _started, ev = await start_watch(client, watch(key="k"))
        shard = shard_of(broker)
        assert len(shard._key_watchers.get("k", ())) == 1
        ev.stream.stop_sending(0)
        shard.put("k", b"v", None, 0)  # the next write shows the broker the stop
        for _ in range(50):
            if not shard._key_watchers.get("k"):
                break
            await asyncio.sleep(0.05)
        assert not shard._key_watchers.get("k")
        client.close()


async def test_values_versions_counters_survive_restart_and_watch_resumes(tmp_path: Path) -> None:
    async with cache_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        s = await client.session()
        await s.send(put("a", b"1", 1))
        await s.send(put("b", b"2", 2, ttl_ms=3_600_000))
        await s.send(
            CounterAdd(tenant_id=TENANT, namespace=NS, cache=CACHE, key="n", delta=7, request_id=3)
        )
        for _ in range(3):
            await s.recv()
        shard = shard_of(broker)
        versions = {k: e.version for k, e in shard.entries.items()}
        checkpoint = shard.tail
        await s.send(put("a", b"after", 4))
        assert await s.recv() == CacheOk(request_id=4)
        tail = shard.tail
        client.close()
    async with cache_broker(tmp_path) as broker:
        shard = shard_of(broker)
        assert shard.tail == tail
        assert shard.entries["b"].version == versions["b"]
        assert shard.entries["b"].expires_at_ms > 0
        assert shard.counter("n") == 7
        client = await WireClient.connect(broker)
        s = await client.session()
        await s.send(CacheGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key="a", request_id=1))
        got = await s.recv()
        assert isinstance(got, CacheValue) and got.value == b"after"
        # Resume the watch from before the restart: the change made then replays.
        _started, ev = await start_watch(client, watch(key="a", from_offset=checkpoint))
        (replayed,) = await events(ev, 1)
        assert (replayed.value, replayed.offset) == (b"after", checkpoint)
        await s.send(put("a", b"live", 2))
        assert await s.recv() == CacheOk(request_id=2)
        (live,) = await events(ev, 1)
        assert live.value == b"live" and live.offset == tail
        client.close()


async def test_compaction_under_load_keeps_every_live_key_version_and_counter(
    tmp_path: Path,
) -> None:
    limits = CacheLimits(segment_bytes=16 * 1024, compact_min_bytes=64 * 1024, compact_ratio=2.0)
    rng = random.Random(5)
    async with cache_broker(tmp_path, limits=limits) as broker:
        client = await WireClient.connect(broker)
        shard = shard_of(broker)
        assert shard.log is not None
        expected: dict[str, bytes] = {}
        streams = [await client.session() for _ in range(4)]
        first_start = shard.log.start_offset
        tails = []

        async def writer(n: int) -> None:
            s = streams[n]
            for i in range(400):
                key = f"k{rng.randrange(60)}"
                data = f"{n}-{i}".encode() * rng.randrange(1, 20)
                await s.send(put(key, data, i))
                assert await s.recv() == CacheOk(request_id=i)
                expected[key] = data
                tails.append(shard.log.next_offset if shard.log else 0)

        adds = await client.session()
        for i in range(20):
            await adds.send(
                CounterAdd(
                    tenant_id=TENANT, namespace=NS, cache=CACHE, key=f"c{i}", delta=i, request_id=i
                )
            )
            await adds.recv()
        await asyncio.gather(*(writer(n) for n in range(4)))
        for _ in range(100):
            if not shard.compacting:
                break
            await asyncio.sleep(0.02)
        assert tails == sorted(tails)  # offsets never rewind
        assert shard.log.start_offset > first_start  # compaction ran and freed segments
        versions = {k: e.version for k, e in shard.entries.items()}
        for key, data in expected.items():
            assert shard.entries[key].value == data
        s = streams[0]
        for rid, (key, data) in enumerate(expected.items()):
            await s.send(
                CacheGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, request_id=rid)
            )
            got = await s.recv()
            assert (
                isinstance(got, CacheValue) and got.value == data and got.version == versions[key]
            )
        # A watch from before the compacted history gets a resnapshot of current values.
        started, ev = await start_watch(client, watch(prefix="k", from_offset=first_start))
        assert started.resnapshot and started.retained_count is None
        snap = await events(ev, len(expected))
        assert {e.key: (e.value, e.offset) for e in snap} == {
            k: (d, versions[k]) for k, d in expected.items()
        }
        client.close()
    # And all of it again after a restart from the compacted log.
    async with cache_broker(tmp_path, limits=limits) as broker:
        shard = shard_of(broker)
        assert {k: e.version for k, e in shard.entries.items()} == versions
        assert {k: e.value for k, e in shard.entries.items()} == expected
        assert all(shard.counter(f"c{i}") == i for i in range(20))
