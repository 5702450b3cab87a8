"""Group changes riding a Quorum stream's replication log (replication/groups.py):
told apart from publish batches, applied in log order to a real stream log and a
real group log, counted as applied after a restart only up to the last batch the
stream log holds, and harmless when applied a second time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.groups.records import GroupChange, GroupDurable, Kind, apply_change, decode_change
from felix_broker.groups.service import GroupService
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.apply import StreamApplier, encode_batch
from felix_broker.replication.core import Entry
from felix_broker.replication.groups import (
    GroupStreamApplier,
    decode_changes,
    encode_changes,
    is_group_entry,
)
from felix_broker.storage import LogConfig, LogStore
from felix_broker.streams.engine import Engine
from felix_common.catalog import Consistency
from felix_wire.fleet import ReplicatedBatch

pytestmark = pytest.mark.timeout(30)

SPEC = StreamSpec(
    "t1", "ns", "quorum", durable=True, replication_factor=3, consistency=Consistency.QUORUM
)
KEY = ("t1", "ns", "quorum", 0)


def batch(*payloads: bytes) -> Entry:
    return Entry(1, encode_batch(ReplicatedBatch(timestamp_us=1, payloads=list(payloads))))


def group(*changes: GroupChange) -> Entry:
    return Entry(1, encode_changes(changes))


def test_group_entries_are_told_apart_from_batches_and_round_trip() -> None:
    changes = [GroupChange(kind, "g", 7) for kind in Kind]
    entry = group(*changes)
    assert is_group_entry(entry)
    assert decode_changes(entry.payload) == changes
    assert not is_group_entry(batch(b"x"))
    with_everything = ReplicatedBatch(
        timestamp_us=2, publisher="p", payloads=[b"a"], producer_id=1, sequence=2, digest=3
    )
    assert not is_group_entry(Entry(1, encode_batch(with_everything)))
    assert not is_group_entry(Entry(1, b"", start=True))
    with pytest.raises(ValueError):
        encode_changes([])


@dataclass
class Replica:
    engine: Engine
    groups: GroupService
    applier: GroupStreamApplier

    def durable(self) -> dict[str, GroupDurable]:
        log = self.groups._shard_groups(SPEC, 0).log
        state: dict[str, GroupDurable] = {}
        for record in log.read(log.start_offset, max_records=1000, max_bytes=1 << 20):
            apply_change(state, decode_change(record.payload))
        return state

    def stream(self) -> list[bytes]:
        log = self.engine.shard(SPEC, 0).log
        assert log is not None
        return [r.payload for r in log.read(0, max_records=100, max_bytes=1 << 20)]


@pytest.fixture
async def replica(tmp_path: Path) -> AsyncIterator[Replica]:
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path)}, cwd=tmp_path)
    assert config.durable_storage_dir is not None
    catalog = StaticCatalog(streams=[SPEC], caches=[])
    store = LogStore(config.durable_storage_dir, config=LogConfig())
    await store.recover_all()
    store.start()
    engine = Engine(catalog, config, BrokerMetrics(), store)
    groups = GroupService(config=config, catalog=catalog, engine=engine)
    await groups.start()
    applier = GroupStreamApplier(StreamApplier(engine.shard(SPEC, 0)), groups)
    try:
        yield Replica(engine, groups, applier)
    finally:
        await groups.close()
        engine.close()
        await store.aclose()


async def test_entries_apply_in_log_order_and_a_restart_reapplies_only_after_the_last_batch(
    replica: Replica,
) -> None:
    entries = [
        Entry(1, b"", start=True),
        batch(b"a", b"b"),
        group(GroupChange(Kind.CURSOR, "g", 0), GroupChange(Kind.ACKED, "g", 1)),
        batch(b"c"),
        group(GroupChange(Kind.CURSOR, "g", 2), GroupChange(Kind.DEAD, "g", 2)),
    ]
    assert await replica.applier.apply(entries) == [None, 0, None, 2, None]
    assert replica.stream() == [b"a", b"b", b"c"]
    want = replica.durable()
    assert want["g"].cursor == 2 and want["g"].dead == {2} and want["g"].acked == set()
    # After a restart: the trailing group entry is not counted (applied again once
    # committed); everything up to the last batch the stream log holds is.
    assert replica.applier.applied_entries(entries, 0) == 4
    assert replica.applier.applied_entries(entries[1:], 0) == 3
    assert replica.applier.applied_entries(entries[3:], 2) == 1
    await replica.applier.apply(entries[4:])
    assert replica.durable() == want
    # Applying the whole group history again (a suffix replayed) changes nothing.
    await replica.applier.apply([entries[2], entries[4]])
    assert replica.durable() == want
    assert replica.stream() == [b"a", b"b", b"c"]
    with pytest.raises(ValueError):
        replica.applier.applied_entries(entries[1:2], 0)  # 2 records, not the 3 held


async def test_a_generation_start_drops_the_in_memory_groups(replica: Replica) -> None:
    await replica.applier.apply([batch(b"a")])
    replica.groups._shard_groups(SPEC, 0)
    assert KEY in replica.groups._shards
    await replica.applier.apply([Entry(2, b"", start=True)])
    assert KEY not in replica.groups._shards  # rebuilt from the group log on next use


async def test_a_quorum_shards_group_log_compacts_to_its_committed_state_only(
    tmp_path: Path,
) -> None:
    """Compaction of a Quorum shard's group log copies what its replication applied,
    never the leader's in-memory settles ahead of the mark; a restart replays it."""
    from felix_broker.fleet.routing import RoutingSnapshot
    from felix_broker.groups.service import GroupServiceLimits
    from felix_broker.replication.groups import GroupReplication

    config = load_config(environ={}, overrides={"data_dir": str(tmp_path)}, cwd=tmp_path)
    assert config.durable_storage_dir is not None
    catalog = StaticCatalog(streams=[SPEC], caches=[])
    store = LogStore(config.durable_storage_dir, config=LogConfig())
    await store.recover_all()
    store.start()
    engine = Engine(catalog, config, BrokerMetrics(), store)
    limits = GroupServiceLimits(segment_bytes=512, compact_min_bytes=1024)

    def service() -> GroupService:
        groups = GroupService(config=config, catalog=catalog, engine=engine, limits=limits)
        groups.replication = GroupReplication(lambda _shard: None, lambda: RoutingSnapshot("n"))
        return groups

    groups = service()
    await groups.start()
    replica = Replica(
        engine, groups, GroupStreamApplier(StreamApplier(engine.shard(SPEC, 0)), groups)
    )
    try:
        await replica.applier.apply([batch(b"r%d" % i) for i in range(10)])
        for i in range(150):
            changes = [GroupChange(Kind.CURSOR, "g", i % 8), GroupChange(Kind.ACKED, "g", 9)]
            await replica.applier.apply([group(*changes)])
        await replica.applier.apply([group(GroupChange(Kind.DEAD, "g", 8))])
        committed = replica.durable()
        assert committed["g"].cursor == 149 % 8 and committed["g"].dead == {8}
        shard = groups._shard_groups(SPEC, 0)
        # The leader's state runs ahead of its mark: settles not yet committed.
        shard.durable["g"] = GroupDurable(cursor=10)
        shard.durable["h"] = GroupDurable(cursor=3)
        assert groups._wants_compaction(shard)
        before = shard.log.start_offset
        assert await groups.compact(shard) > 0
        assert shard.log.start_offset > before
        assert replica.durable() == committed  # the copy is the committed state
        await groups.close()
        # A restart rebuilds the committed state from the compacted log.
        groups = service()
        await groups.start()
        assert groups._shard_groups(SPEC, 0).durable == committed
    finally:
        await groups.close()
        engine.close()
        await store.aclose()
