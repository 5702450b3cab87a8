"""Snapshots of a Quorum cache shard (replication/snapshot.py) and the compaction of its
replication log they allow, on real files.

- Exactness (hypothesis): a shard rebuilt from a snapshot taken after any prefix of an
  op sequence, then given the rest, holds the same entries, versions, TTLs, counters,
  recency order and tail as the shard that applied the whole sequence, and answers
  every op alike (so a replica rebuilt from a snapshot agrees with one that was not).
- A replica of one (its own fsync is the majority) compacts its replication log below
  its newest snapshot, and a restart rebuilds exact values, versions and counters from
  the snapshot and the entries above it; the next put gets the version it would have.
- A torn snapshot (a crash before its rename) is never read: the older one is the truth.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter

from felix_broker.cache.shard import CacheLimits, CacheShard
from felix_broker.config import FsyncMode
from felix_broker.replication.cache import CacheApplier, Snapshots, encode_op
from felix_broker.replication.core import Config
from felix_broker.replication.driver import ReplicaDriver
from felix_broker.replication.snapshot import (
    SnapshotDisk,
    capture,
    encode_snapshot,
    load_newest,
    restore,
    write_snapshot,
)
from felix_broker.storage import LogConfig
from felix_common.fleet import ShardId, ShardKind
from felix_wire.fleet import CacheOpKind, CacheSnapshot, ReplicatedCacheOp

from .cache_ops import apply_all, ops

_ids = itertools.count()
LIMITS = CacheLimits(max_shard_bytes=900)  # eviction is part of what must agree
LOG_CONFIG = LogConfig(fsync_mode=FsyncMode.NONE)


def open_shard(folder: Path, limits: CacheLimits = LIMITS) -> CacheShard:
    evictions = Counter(f"s{next(_ids)}", "evictions", registry=CollectorRegistry())
    return CacheShard.open(
        "t/ns/c/0", folder, limits=limits, evictions=evictions, fsync_mode=FsyncMode.NONE
    )


def state(s: CacheShard) -> tuple[list[tuple[str, bytes, int, int]], dict[str, int], int]:
    """Entries in recency order (value, version, TTL deadline), counters, and the tail."""
    entries = [(k, e.value, e.version, e.expires_at_ms) for k, e in s.entries.items()]
    return entries, {k: c.total for k, c in s.counters.items()}, s.tail


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=ops, cut=st.integers(0, 40))
def test_a_shard_rebuilt_from_a_snapshot_then_given_the_rest_equals_the_whole_history(
    batch: list[ReplicatedCacheOp], cut: int
) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            whole = CacheApplier(open_shard(root / "whole"), lambda: True)
            head = await apply_all(whole, batch[:cut])
            assert len(head) == len(batch[:cut])
            snap = capture(whole.shard, offset=cut, generation=1)
            write_snapshot(root, cut, encode_snapshot(snap))
            loaded = load_newest(root)
            assert loaded == snap
            restore(root / "rebuilt", loaded, LOG_CONFIG)
            rebuilt = CacheApplier(open_shard(root / "rebuilt"), lambda: True, start=loaded)
            assert state(rebuilt.shard) == state(whole.shard)
            assert rebuilt.position == cut
            rest = batch[cut:]
            assert await apply_all(rebuilt, rest) == await apply_all(whole, rest)
            assert state(rebuilt.shard) == state(whole.shard)
            await whole.shard.close()
            await rebuilt.shard.close()

    asyncio.run(run())


def test_a_torn_snapshot_is_never_read_and_an_older_one_stays_the_truth(tmp_path: Path) -> None:
    old = CacheSnapshot(offset=4, generation=1, tail=9, entries=[], counters=[])
    write_snapshot(tmp_path, 4, encode_snapshot(old))
    newer = encode_snapshot(CacheSnapshot(offset=8, generation=1, tail=12, entries=[], counters=[]))
    (tmp_path / "snapshot-8.bin.tmp").write_bytes(newer)  # a crash before the rename
    (tmp_path / "snapshot-12.bin").write_bytes(newer[:-3])  # torn (not our writer's doing)
    assert load_newest(tmp_path) == old
    assert not (tmp_path / "snapshot-8.bin.tmp").exists()


async def _no_peers(_node: str, _message: Any) -> None:
    raise AssertionError("a replica set of one sends nothing")


SHARD = ShardId(ShardKind.CACHE, "t1", "default", "c", 0)


async def open_replica(
    folder: Path, generation: int, *, every: int = 16, compact_every: int = 4
) -> tuple[ReplicaDriver, CacheApplier, SnapshotDisk]:
    """A replica of one wired as `CacheReplication._open` wires one (files rewritten
    more often than snapshots are taken: the snapshot must bound the rewrite)."""
    start = load_newest(folder)
    state_folder = folder / "state"
    restore(state_folder, start, LOG_CONFIG)
    disk = SnapshotDisk(folder, compact_every=compact_every)
    snapshots = Snapshots(folder, disk, every)
    applier = CacheApplier(
        open_shard(state_folder, CacheLimits()), lambda: True, snapshots=snapshots, start=start
    )
    driver = ReplicaDriver.open(
        SHARD, "n1", ("n1",), disk, _no_peers, config=Config(), applier=applier
    )
    snapshots.durable = lambda: driver.replica.synced_length
    driver.start()
    await driver.promote(generation)
    async with asyncio.timeout(10):
        while driver.refusal() is not None:
            await asyncio.sleep(0.01)
    return driver, applier, disk


async def test_a_restart_after_compaction_rebuilds_exact_values_versions_and_counters(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "replica"
    driver, applier, disk = await open_replica(folder, 1)
    for i in range(60):
        op = [
            ReplicatedCacheOp(op=CacheOpKind.PUT, key=f"k{i % 7}", now_ms=1, value=b"v%d" % i),
            ReplicatedCacheOp(
                op=CacheOpKind.PUT, key="ttl", now_ms=1000 + i, value=b"t", ttl_ms=10**9
            ),
            ReplicatedCacheOp(op=CacheOpKind.COUNTER_ADD, key=f"n{i % 3}", now_ms=1, delta=i),
            ReplicatedCacheOp(op=CacheOpKind.DELETE, key=f"k{(i + 3) % 7}", now_ms=1),
        ][i % 4]
        written = await driver.append([encode_op(op)])
        assert applier.take(written.stream_offset) is not None
    # The file was rewritten below the newest snapshot, never above it.
    async with asyncio.timeout(10):
        while disk.base == 0:
            await asyncio.sleep(0.01)
    assert 0 < disk.base <= applier.snapshot_at
    assert load_newest(folder) is not None
    before = state(applier.shard)
    sums = {f"n{j}": sum(i for i in range(2, 60, 4) if i % 3 == j) for j in range(3)}
    assert before[1] == sums
    await driver.close()
    await applier.shard.close()

    driver, applier, disk = await open_replica(folder, 2)
    assert disk.base > 0  # nothing below the compacted point was needed
    assert state(applier.shard) == before
    # The next put's version is the one the shard would have given without a restart
    # (the generation-start entry of generation 2 takes no cache offset).
    written = await driver.append(
        [encode_op(ReplicatedCacheOp(op=CacheOpKind.PUT, key="z", now_ms=1, value=b"z"))]
    )
    outcome = applier.take(written.stream_offset)
    assert outcome is not None and outcome.version == before[2]
    await driver.close()
    await applier.shard.close()
