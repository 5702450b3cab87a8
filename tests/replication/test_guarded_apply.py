"""Guarded batches (publish_if, commit) of a Quorum stream applied at their place in
the log (replication/apply.py): a condition is checked against the stream log's
tail when the batch's turn comes, the same on every replica; a refused batch writes
nothing; a commit's state changes reach the state view; the restart walk and the
compaction weighing count a refused batch as no records."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.groups.records import GroupChange, Kind
from felix_broker.groups.service import GroupService
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.apply import (
    StreamApplier,
    commit_mark,
    encode_batch,
    records_at,
    replicated_commit,
)
from felix_broker.replication.core import Entry
from felix_broker.replication.groups import GroupStreamApplier, encode_changes
from felix_broker.storage import LogConfig, LogStore
from felix_broker.storage.format import CommitMark, StoredChange
from felix_broker.streams.engine import Engine
from felix_common.catalog import Consistency
from felix_wire.fleet import ReplicatedBatch

pytestmark = pytest.mark.timeout(30)

SPEC = StreamSpec(
    "t1", "ns", "quorum", durable=True, replication_factor=3, consistency=Consistency.QUORUM
)


def batch(*payloads: bytes, expected: int | None = None, commit: CommitMark | None = None) -> Entry:
    replicated = ReplicatedBatch(
        timestamp_us=1,
        payloads=list(payloads),
        expected_offset=expected,
        commit=replicated_commit(commit) if commit is not None else None,
    )
    return Entry(1, encode_batch(replicated))


class Replica:
    def __init__(self, engine: Engine, groups: GroupService) -> None:
        self.engine = engine
        self.stream_applier = StreamApplier(engine.shard(SPEC, 0))
        self.applier = GroupStreamApplier(self.stream_applier, groups)

    def stream(self) -> list[bytes]:
        log = self.engine.shard(SPEC, 0).log
        assert log is not None
        return [r.payload for r in log.read(0, max_records=100, max_bytes=1 << 20)]


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[list[Replica]]:
    """Two replicas' real stream logs and group services (a leader and a follower)."""
    made: list[tuple[LogStore, Engine, GroupService]] = []
    out: list[Replica] = []
    try:
        for name in ("a", "b"):
            folder = tmp_path / name
            config = load_config(environ={}, overrides={"data_dir": str(folder)}, cwd=folder)
            assert config.durable_storage_dir is not None
            catalog = StaticCatalog(streams=[SPEC], caches=[])
            store = LogStore(config.durable_storage_dir, config=LogConfig())
            await store.recover_all()
            store.start()
            engine = Engine(catalog, config, BrokerMetrics(), store)
            groups = GroupService(config=config, catalog=catalog, engine=engine)
            await groups.start()
            made.append((store, engine, groups))
            out.append(Replica(engine, groups))
        yield out
    finally:
        for store, engine, groups in made:
            await groups.close()
            engine.close()
            await store.aclose()


async def test_conditions_are_checked_at_their_place_in_the_log_on_every_replica(
    replicas: list[Replica],
) -> None:
    # Two publish_if racing for offset 2 (both admitted by the leader, in this order),
    # a group entry between them, a publish_if for a tail already gone, a fitting one.
    entries = [
        Entry(1, b"", start=True),
        batch(b"a", b"b"),
        batch(b"first", expected=2),
        Entry(1, encode_changes([GroupChange(Kind.CURSOR, "g", 1)])),
        batch(b"second", expected=2),
        batch(b"stale", expected=0),
        batch(b"fits", expected=3),
    ]
    for replica in replicas:
        # A guarded batch answers the tail it was checked at: its base when applied.
        assert await replica.applier.apply(entries) == [None, 0, 2, None, 3, 3, 3]
        assert replica.stream() == [b"a", b"b", b"first", b"fits"]
    # The restart walk counts a refused batch as no records.
    assert replicas[0].applier.applied_entries(entries, 0) == len(entries)
    batches = [entries[1], entries[2], *entries[4:]]  # the stream applier's own walk
    assert replicas[0].stream_applier.applied_entries(batches, 0) == len(batches)
    assert [records_at(e, t) for e, t in [(entries[4], 2), (entries[4], 3)]] == [1, 0]
    with pytest.raises(ValueError):
        replicas[0].stream_applier.applied_entries(batches[:3], 0)  # 3 records, not 4


async def test_the_compaction_weighing_keeps_its_own_running_tail(replicas: list[Replica]) -> None:
    replica = replicas[0]
    entries = [batch(b"a"), batch(b"x", expected=0), batch(b"b", expected=1), batch(b"c")]
    await replica.applier.apply(entries)
    assert replica.stream() == [b"a", b"b", b"c"]
    # The driver's walk at open (everything retained, nothing compacted yet).
    assert replica.applier.applied_entries(entries, 0) == len(entries)
    # Compaction weighs in log order, each entry once, across compactions.
    assert [replica.applier.records_of(e) for e in entries[:2]] == [1, 0]
    assert [replica.applier.records_of(e) for e in entries[2:]] == [1, 1]


async def test_a_commit_reaches_the_state_view_of_every_replica_and_a_refused_one_nothing(
    replicas: list[Replica],
) -> None:
    opened = CommitMark(b"acct", (StoredChange("balance", b"10"), StoredChange("gone", None)))
    moved = CommitMark(b"acct", (StoredChange("balance", b"7"),))
    refused = CommitMark(b"acct", (StoredChange("balance", b"0"),))
    assert commit_mark(replicated_commit(opened)) == opened
    entries = [
        batch(b"opened", commit=opened),
        batch(b"moved", expected=1, commit=moved),
        batch(b"refused", expected=1, commit=refused),
    ]
    for replica in replicas:
        assert await replica.applier.apply(entries) == [0, 1, 2]
        assert replica.stream() == [b"opened", b"moved"]
        state = replica.engine.shard(SPEC, 0).marks.state
        read = state.get(b"acct", "balance")
        assert (read.value, read.version, read.as_of) == (b"7", 1, 1)
        assert state.get(b"acct", "gone").value is None
        log = replica.engine.shard(SPEC, 0).log
        assert log is not None
        stored = [ext.commit for _offset, _count, ext in log.extensions()]
        assert stored == [opened, moved]
