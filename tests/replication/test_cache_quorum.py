"""A Quorum cache (RF 3) on three in-process fleet members: real brokers, real QUIC for
clients and peers (mutual TLS), real storage; the routing snapshot is set by the test
(tests/fleet/harness.py). Puts, deletes, conditional writes and counter adds go
through the replication core; every replica applies the committed ops to its cache
shard, so followers' entries, versions and counters equal the leader's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from felix_broker.cache.shard import CacheLimits
from felix_broker.catalog import CacheSpec, StaticCatalog
from felix_broker.fleet.routing import AssignmentState, Route, ShardId, ShardKind
from felix_common.catalog import Consistency
from felix_wire.errors import ErrorCode
from felix_wire.messages import (
    CacheConditionResult,
    CacheDelete,
    CacheGet,
    CacheOk,
    CachePut,
    CachePutIf,
    CacheValue,
    CounterAdd,
    CounterGet,
    CounterValue,
    Error,
    VersionCondition,
)

from ..fleet.harness import NODES, Fleet, running_fleet
from ..support.waits import until
from ..support.wire import NS, TENANT, WireClient, WireStream
from .in_process import InProcessShard

pytestmark = pytest.mark.timeout(90)

CACHE = "qc"
QUORUM = CacheSpec(TENANT, NS, CACHE, replication_factor=3, consistency=Consistency.QUORUM)
CATALOG = StaticCatalog(streams=[], caches=[QUORUM])
SHARD = ShardId(ShardKind.CACHE, TENANT, NS, CACHE, 0)
HARNESS = InProcessShard(SHARD, cache=True)
lead = HARNESS.lead
driver = HARNESS.driver
serving = HARNESS.serving
opened = HARNESS.opened


def state(fleet: Fleet, node: str) -> tuple[dict[str, tuple[bytes, int]], dict[str, int]]:
    """One replica's cache shard: entries (value, version) and counters."""
    cache = fleet.brokers[node].cache
    assert cache is not None
    shard = cache.shard(QUORUM, 0)
    entries = {k: (e.value, e.version) for k, e in shard.entries.items()}
    counters = {k: c.total for k, c in shard.counters.items()}
    return entries, counters


def put(key: str, value: bytes, rid: int) -> CachePut:
    return CachePut(
        tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, value=value, request_id=rid
    )


def get(key: str, rid: int) -> CacheGet:
    return CacheGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, request_id=rid)


def add(key: str, delta: int, rid: int) -> CounterAdd:
    return CounterAdd(
        tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, delta=delta, request_id=rid
    )


def counter(key: str, rid: int) -> CounterGet:
    return CounterGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, request_id=rid)


async def ask(stream: WireStream, message: object) -> object:
    await stream.send(message)  # type: ignore[arg-type]
    async with asyncio.timeout(15):
        return await stream.recv()


async def test_quorum_cache_writes_are_acked_and_every_replica_holds_the_leaders_state(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path, with_catalog=CATALOG) as fleet:
        await opened(fleet, "node-a", 1)
        client = await WireClient.connect(fleet.entry("node-a"))
        s = await client.session()
        assert await ask(s, put("k", b"v1", 1)) == CacheOk(request_id=1)
        value = await ask(s, get("k", 2))
        assert isinstance(value, CacheValue) and value.value == b"v1"
        version = value.version
        assert version is not None
        # put_if at the version: applied; again at the old version: refused, with the current.
        applied = await ask(
            s,
            CachePutIf(
                tenant_id=TENANT,
                namespace=NS,
                cache=CACHE,
                key="k",
                value=b"v2",
                condition=VersionCondition(version=version),
                request_id=3,
            ),
        )
        assert isinstance(applied, CacheConditionResult) and applied.applied
        stale = await ask(
            s,
            CachePutIf(
                tenant_id=TENANT,
                namespace=NS,
                cache=CACHE,
                key="k",
                value=b"v3",
                condition=VersionCondition(version=version),
                request_id=4,
            ),
        )
        assert stale == CacheConditionResult(applied=False, version=applied.version, request_id=4)
        absent = await ask(
            s,
            CachePutIf(
                tenant_id=TENANT,
                namespace=NS,
                cache=CACHE,
                key="fresh",
                value=b"x",
                condition="absent",
                request_id=5,
            ),
        )
        assert isinstance(absent, CacheConditionResult) and absent.applied
        removed = await ask(
            s, CacheDelete(tenant_id=TENANT, namespace=NS, cache=CACHE, key="fresh", request_id=6)
        )
        assert isinstance(removed, CacheValue) and removed.value == b"x"
        for i in range(10):
            answer = await ask(s, add("hits", 3, 100 + i))
            assert answer == CounterValue(value=3 * (i + 1), request_id=100 + i)
        assert await ask(s, counter("hits", 200)) == CounterValue(value=30, request_id=200)
        want = state(fleet, "node-a")
        assert want == ({"k": (b"v2", applied.version)}, {"hits": 30})
        await until(lambda: all(state(fleet, n) == want for n in ("node-b", "node-c")))
        # A follower serves no reads of its own (its gate refuses them): a get sent to it
        # is forwarded to the leader, which answers.
        gate = fleet.brokers["node-b"].cache_replication
        assert gate is not None and gate.read_refusal(QUORUM, 0) == (ErrorCode.NOT_LEADER, None)
        follower = await WireClient.connect(fleet.entry("node-b"))
        forwarded = await follower.request(get("k", 1))
        assert isinstance(forwarded, CacheValue) and forwarded.value == b"v2", forwarded
        follower.close()
        client.close()


async def test_failover_promotes_a_replica_that_serves_every_acked_put_and_exact_counters(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path, with_catalog=CATALOG) as fleet:
        await opened(fleet, "node-a", 1)
        client = await WireClient.connect(fleet.entry("node-a"))
        s = await client.session()
        for i in range(5):
            assert await ask(s, put(f"key-{i}", b"v%d" % i, i + 1)) == CacheOk(request_id=i + 1)
        for i in range(7):
            assert isinstance(await ask(s, add("n", 2, 50 + i)), CounterValue)
        before = await ask(s, get("key-3", 99))
        assert isinstance(before, CacheValue)
        client.close()
        await fleet.brokers["node-a"].stop()  # the leader's process ends
        fleet.down.add("node-a")
        await opened(fleet, "node-b", 2)
        client = await WireClient.connect(fleet.entry("node-b"))
        s = await client.session()
        for i in range(5):
            answer = await ask(s, get(f"key-{i}", i + 1))
            assert isinstance(answer, CacheValue) and answer.value == b"v%d" % i, answer
        again = await ask(s, get("key-3", 98))
        assert isinstance(again, CacheValue) and again.version == before.version
        assert await ask(s, counter("n", 60)) == CounterValue(value=14, request_id=60)
        assert await ask(s, add("n", 1, 61)) == CounterValue(value=15, request_id=61)
        client.close()


async def test_a_leader_without_a_majority_answers_quorum_timeout_and_serves_nothing_new(
    tmp_path: Path,
) -> None:
    async with running_fleet(
        tmp_path, with_catalog=CATALOG, publish_quorum_timeout_ms=800
    ) as fleet:
        await opened(fleet, "node-a", 1)
        client = await WireClient.connect(fleet.entry("node-a"))
        s = await client.session()
        assert await ask(s, put("k", b"old", 1)) == CacheOk(request_id=1)
        for node in ("node-b", "node-c"):
            listener = fleet.brokers[node].peer_listener
            assert listener is not None
            await listener.close()
        for message in (put("k", b"new", 2), add("c", 5, 3)):
            answer = await ask(s, message)
            assert isinstance(answer, Error), answer
            assert (answer.code, answer.retry) == ("quorum_timeout", "outcome_unknown")
        value = await ask(s, get("k", 4))
        assert isinstance(value, CacheValue) and value.value == b"old"  # not past the mark
        assert await ask(s, counter("c", 5)) == CounterValue(value=None, request_id=5)
        client.close()


async def test_only_the_leader_expires_ttls_and_every_replica_applies_its_deletes(
    tmp_path: Path,
) -> None:
    limits = CacheLimits(ttl_pass_interval=0.05)
    async with running_fleet(tmp_path, with_catalog=CATALOG, cache_limits=limits) as fleet:
        await opened(fleet, "node-a", 1)
        client = await WireClient.connect(fleet.entry("node-a"))
        s = await client.session()
        short = CachePut(
            tenant_id=TENANT,
            namespace=NS,
            cache=CACHE,
            key="t",
            value=b"x",
            ttl_ms=300,
            request_id=1,
        )
        assert await ask(s, short) == CacheOk(request_id=1)
        assert await ask(s, put("keep", b"y", 2)) == CacheOk(request_id=2)
        await until(lambda: all("t" in state(fleet, n)[0] for n in NODES))
        # The expiry is one replicated delete: gone on every replica, the rest kept.
        await until(lambda: all("t" not in state(fleet, n)[0] for n in NODES))
        want = state(fleet, "node-a")
        assert set(want[0]) == {"keep"}
        await until(lambda: all(state(fleet, n) == want for n in NODES))
        gone = await ask(s, get("t", 3))
        assert isinstance(gone, CacheValue) and gone.value is None
        client.close()


async def test_a_leader_whose_lease_lapsed_serves_no_reads_and_takes_no_writes(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path, with_catalog=CATALOG) as fleet:
        await opened(fleet, "node-a", 1)
        client = await WireClient.connect(fleet.entry("node-a"))
        s = await client.session()
        assert await ask(s, put("k", b"v", 1)) == CacheOk(request_id=1)
        fleet.routes[SHARD] = Route(
            1, AssignmentState.UNAVAILABLE, leader="node-a", replicas=NODES, reason="fenced"
        )
        fleet.publish()
        replication = fleet.brokers["node-a"].cache_replication
        assert replication is not None
        await until(lambda: replication.read_refusal(QUORUM, 0) is not None)
        assert replication.read_refusal(QUORUM, 0) == (ErrorCode.SHARD_UNAVAILABLE, "fenced")
        for message in (get("k", 2), put("k", b"w", 3), counter("n", 4)):
            answer = await ask(s, message)
            assert isinstance(answer, Error) and answer.code == "shard_unavailable", answer
        lead(fleet, "node-a", 1)  # the lease renewed: served again, nothing lost
        await until(lambda: serving(fleet, "node-a"))
        value = await ask(s, get("k", 5))
        assert isinstance(value, CacheValue) and value.value == b"v"
        client.close()


async def test_an_entry_bigger_than_the_shard_bound_is_refused_before_it_is_replicated(
    tmp_path: Path,
) -> None:
    limits = CacheLimits(max_shard_bytes=4096)
    async with running_fleet(tmp_path, with_catalog=CATALOG, cache_limits=limits) as fleet:
        await opened(fleet, "node-a", 1)
        held = driver(fleet, "node-a")
        assert held is not None
        length = held.replica.length
        client = await WireClient.connect(fleet.entry("node-a"))
        s = await client.session()
        answer = await ask(s, put("big", b"x" * 5000, 1))
        assert isinstance(answer, Error) and answer.code == "limit_exceeded", answer
        assert held.replica.length == length  # nothing took a place in the log
        assert await ask(s, put("small", b"x", 2)) == CacheOk(request_id=2)
        client.close()
