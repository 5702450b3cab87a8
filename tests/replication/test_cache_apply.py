"""`CacheApplier`: committed cache ops applied in log order to a replica's cache shard.

- Determinism (hypothesis): any sequence of ops applied to two fresh shards gives the
  same entries, versions, counters and outcomes, and counters equal the sum of the
  adds that were accepted: what makes followers' state the leader's.
- A restart rebuilds the shard from the replication log (a replica of one, so its own
  fsync is the majority): the state after reopening equals the state before.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry, Counter

from felix_broker.cache.shard import CacheLimits, CacheShard
from felix_broker.config import FsyncMode
from felix_broker.replication.cache import CacheApplier, decode_op, encode_op
from felix_broker.replication.core import Config
from felix_broker.replication.disk import ReplicaDisk
from felix_broker.replication.driver import ReplicaDriver
from felix_common.fleet import ShardId, ShardKind
from felix_wire.fleet import CacheOpKind, ReplicatedCacheOp

from .cache_ops import apply_all, ops

_ids = itertools.count()


def shard(folder: Path, limits: CacheLimits | None = None) -> CacheShard:
    evictions = Counter(f"e{next(_ids)}", "evictions", registry=CollectorRegistry())
    return CacheShard.open(
        "t/ns/c/0",
        folder,
        limits=limits or CacheLimits(),
        evictions=evictions,
        fsync_mode=FsyncMode.NONE,
    )


def snapshot(s: CacheShard) -> tuple[dict[str, tuple[bytes, int, int]], dict[str, int]]:
    return (
        {k: (e.value, e.version, e.expires_at_ms) for k, e in s.entries.items()},
        {k: c.total for k, c in s.counters.items()},
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=ops)
def test_every_replica_applying_the_same_ops_holds_the_same_state(
    batch: list[ReplicatedCacheOp],
) -> None:
    async def run() -> None:
        # A small memory bound, so eviction is part of what must agree.
        limits = CacheLimits(max_shard_bytes=900)
        with tempfile.TemporaryDirectory() as tmp:
            one = CacheApplier(shard(Path(tmp) / "one", limits), lambda: True)
            two = CacheApplier(shard(Path(tmp) / "two", limits), lambda: True)
            first = await apply_all(one, batch)
            # The other replica gets the same log in other batch sizes.
            second = [o for half in (batch[:7], batch[7:]) for o in await apply_all(two, half)]
            assert first == second
            assert snapshot(one.shard) == snapshot(two.shard)
            sums: dict[str, int] = {}
            for op, outcome in zip(batch, first, strict=True):
                assert outcome is not None
                if op.op is CacheOpKind.COUNTER_ADD and outcome.error is None:
                    sums[op.key] = sums.get(op.key, 0) + (op.delta or 0)
                    assert outcome.total == sums[op.key]
            assert snapshot(one.shard)[1] == sums
            await one.shard.close()
            await two.shard.close()

    asyncio.run(run())


def test_an_op_round_trips_through_its_catalogued_encoding() -> None:
    op = ReplicatedCacheOp(op=CacheOpKind.COUNTER_ADD, key="k", now_ms=5, delta=-3)
    assert decode_op(encode_op(op)) == op


async def _no_peers(_node: str, _message: Any) -> None:
    raise AssertionError("a replica set of one sends nothing")


async def test_a_reopened_replica_rebuilds_its_cache_shard_from_the_replication_log(
    tmp_path: Path,
) -> None:
    shard_id = ShardId(ShardKind.CACHE, "t1", "default", "c", 0)
    folder = tmp_path / "replica"

    async def open_replica(generation: int, state: str) -> tuple[ReplicaDriver, CacheApplier]:
        applier = CacheApplier(shard(tmp_path / state), lambda: True)
        driver = ReplicaDriver.open(
            shard_id,
            "n1",
            ("n1",),
            ReplicaDisk(folder, compact_every=1 << 62),
            _no_peers,
            config=Config(),
            applier=applier,
        )
        driver.start()
        await driver.promote(generation)
        async with asyncio.timeout(10):
            while driver.refusal() is not None:
                await asyncio.sleep(0.01)
        return driver, applier

    driver, applier = await open_replica(1, "state-1")
    writes = [
        ReplicatedCacheOp(op=CacheOpKind.PUT, key="a", now_ms=1, value=b"1"),
        ReplicatedCacheOp(op=CacheOpKind.COUNTER_ADD, key="n", now_ms=1, delta=4),
        ReplicatedCacheOp(op=CacheOpKind.PUT, key="b", now_ms=1, value=b"2"),
        ReplicatedCacheOp(op=CacheOpKind.DELETE, key="a", now_ms=1),
        ReplicatedCacheOp(op=CacheOpKind.COUNTER_ADD, key="n", now_ms=1, delta=6),
    ]
    for op in writes:
        written = await driver.append([encode_op(op)])
        assert applier.take(written.stream_offset) is not None
    before = snapshot(applier.shard)
    assert before[1] == {"n": 10} and set(before[0]) == {"b"}
    await driver.close()
    await applier.shard.close()
    # A new, empty cache shard: everything comes back from the replication log.
    driver, applier = await open_replica(2, "state-2")
    assert snapshot(applier.shard) == before
    await driver.close()
    await applier.shard.close()


def test_the_fixtures_catalog_section_keeps_a_quorum_caches_replication() -> None:
    """The chaos runner and the fixture hand brokers their catalogue as YAML: a
    Quorum cache must stay Quorum with its replication factor (it used to be
    written as a Leader cache of one replica)."""
    from felix_broker.catalog import CacheSpec, StaticCatalog, load_catalog
    from felix_broker.fixture.run import catalog_section
    from felix_common.catalog import Consistency

    spec = CacheSpec(
        "t1", "default", "qc", shards=2, replication_factor=3, consistency=Consistency.QUORUM
    )
    loaded = load_catalog(catalog_section(StaticCatalog(streams=[], caches=[spec])))
    assert loaded.cache("t1", "default", "qc") == spec
