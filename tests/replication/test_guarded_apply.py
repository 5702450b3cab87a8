"""Guarded batches (publish_if, commit) of a Quorum stream applied at their place in
the log (replication/apply.py): a condition is checked against the stream log's
tail when the batch's turn comes, the same on every replica; a refused batch writes
nothing; a commit's state changes reach the state view; the restart walk and the
compaction weighing count a refused batch as no records."""

from __future__ import annotations

import pytest

from felix_broker.groups.records import GroupChange, Kind
from felix_broker.replication.apply import (
    commit_mark,
    records_at,
    replicated_commit,
)
from felix_broker.replication.core import Entry
from felix_broker.replication.groups import encode_changes
from felix_broker.storage.format import CommitMark, StoredChange

from .apply_support import SPEC, Replica, batch, replicas

__all__ = ["replicas"]  # the fixture

pytestmark = pytest.mark.timeout(30)


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
