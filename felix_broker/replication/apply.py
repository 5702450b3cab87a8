"""Committed replicated batches into a stream shard's real storage.

A replicated stream shard keeps two logs: the replication log (`ReplicaDisk`,
what the core ships, truncates and counts toward the quorum mark) and the
shard's stream log (`felix_broker.storage`, what readers read). Every replica
applies the replication log's *committed* entries (below the quorum mark) to its
stream log, in log order, and nothing else. So:

- readers (subscriptions, `stream_read`, `offset_for_time`, `latest`, group
  polls), which read the stream log, stop at the quorum mark without knowing it;
- the stream log is never truncated (a committed entry is never undone; the
  replication log's uncommitted suffix is what a returning leader cuts);
- a follower's stream log is the leader's byte for byte: the same batches in the
  same order, each with the leader's append time, stored publisher and producer
  mark (`ReplicatedBatch`), so offsets assigned in that order are the same too.

Each entry's payload is one `ReplicatedBatch` (catalogued in spec/fleet.yaml),
msgpack-encoded. Generation-start entries carry no batch and take no stream
offset (the `generation_start` gap offsets are a fleet feature not enabled).

**Guarded batches** (`publish_if`, `commit`; decision `quorum-guarded-writes` in
spec/messages.yaml). A batch with `expected_offset` is applied only if the stream
log ends exactly there when its turn comes (the raw tail: generation-start entries
take no stream offset here). The check runs on every replica at the batch's place
in the log, against a stream log that is the same on every replica, so every
replica decides the same; a refused batch becomes no record anywhere (its entry
stays in the replication log as a no-op). `apply` answers, for a guarded batch,
the tail it was checked against: equal to `expected_offset` when applied (it is
then the batch's base offset), any other number is a refusal with that tail. A
batch with `commit` stores the commit mark with its record and applies it to the
shard's state view once durable, on every replica (so `state_get` on a promoted
leader answers what was committed).

How many stream records an entry becomes therefore depends on the tail before it
(`records_at`). The restart walk (`applied_entries`) knows that tail; the
compaction weighing (`records_of`, called by the disk's compaction in log order,
each entry once, from the records below the disk's base that the restart walk was
given) keeps its own running tail.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from felix_broker.storage.format import BatchExtension, CommitMark, ProducerMark, StoredChange
from felix_broker.streams.engine import Shard
from felix_wire.fleet import ReplicatedBatch, ReplicatedCommit, ReplicatedStateChange

from .core import Entry

__all__ = [
    "StreamApplier",
    "commit_mark",
    "decode_batch",
    "encode_batch",
    "records_at",
    "replicated_commit",
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplicatedBatch)


def encode_batch(batch: ReplicatedBatch) -> bytes:
    if not batch.payloads:
        raise ValueError("a replicated batch needs at least one payload")
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> ReplicatedBatch:
    return _decoder.decode(payload)


def replicated_commit(mark: CommitMark) -> ReplicatedCommit:
    changes = [ReplicatedStateChange(key=c.key, value=c.value) for c in mark.changes]
    return ReplicatedCommit(entity_key=mark.entity_key, changes=changes)


def commit_mark(commit: ReplicatedCommit) -> CommitMark:
    changes = tuple(StoredChange(c.key, c.value) for c in commit.changes)
    return CommitMark(commit.entity_key, changes)


def _admitted(batch: ReplicatedBatch, tail: int) -> bool:
    return batch.expected_offset is None or batch.expected_offset == tail


def records_at(entry: Entry, tail: int) -> int:
    """How many stream records an entry becomes once applied after `tail` records
    (a guarded batch whose condition fails at that tail becomes none)."""
    if entry.start:
        return 0
    batch = decode_batch(entry.payload)
    return len(batch.payloads) if _admitted(batch, tail) else 0


def _extension(batch: ReplicatedBatch) -> BatchExtension | None:
    producer = None
    if batch.producer_id is not None:
        producer = ProducerMark(batch.producer_id, batch.sequence or 0, batch.digest or 0)
    commit = commit_mark(batch.commit) if batch.commit is not None else None
    if producer is None and commit is None:
        return None
    return BatchExtension(producer=producer, commit=commit)


class StreamApplier:
    """Applies committed entries to one durable stream shard of the engine. The
    shard must take no other appends (its publishes go through replication)."""

    def __init__(self, shard: Shard) -> None:
        if shard.log is None:
            raise ValueError(f"stream {shard.spec.name!r} is not durable: nothing to apply to")
        self.shard = shard
        self._weighed = 0  # the compaction weighing's running tail (see the module docs)

    @property
    def records(self) -> int:
        """Stream records applied so far (the stream log's length)."""
        return self.shard.next_offset

    def records_of(self, entry: Entry) -> int:
        """The stream records `entry` became (the disk's weight of a record): called
        by compaction only, in log order, each entry once (see the module docs)."""
        size = records_at(entry, self._weighed)
        self._weighed += size
        return size

    def weigh_from(self, records_below: int) -> None:
        """Where the compaction weighing starts: the records below the disk's base."""
        self._weighed = records_below

    def applied_entries(self, entries: Sequence[Entry], records_below: int) -> int:
        """After a restart: how many of the replication log's `entries` the stream log
        already holds (they are applied in order, so it is a prefix), given that the
        records before `entries` (compacted away) made `records_below` stream records."""
        self.weigh_from(records_below)
        held = self.records
        count, at = records_below, 0
        for entry in entries:
            size = records_at(entry, count)
            if count + size > held:
                break
            count += size
            at += 1
        if count != held:
            raise ValueError(f"stream log holds {held} records, not a whole prefix of batches")
        return at

    async def apply(self, entries: Sequence[Entry]) -> list[int | None]:
        """Append the entries' batches, wait until durable, apply their commits to the
        state view, deliver them to live subscribers; the stream base offset of each
        entry (None for a start entry; for a guarded batch the tail it was checked
        against, which is its base when applied: see the module docs)."""
        bases: list[int | None] = []
        commits: list[tuple[int, CommitMark]] = []
        shard = self.shard
        for entry in entries:
            if entry.start:
                bases.append(None)
                continue
            batch = decode_batch(entry.payload)
            if not _admitted(batch, shard.next_offset):
                bases.append(shard.next_offset)  # refused here, as on every replica
                continue
            extension = _extension(batch)
            base = shard.append(
                list(batch.payloads), batch.publisher, batch.timestamp_us, extension
            )
            if extension is not None and extension.commit is not None:
                commits.append((base, extension.commit))
            bases.append(base)
        if shard.log is not None and shard.next_offset:
            await shard.log.wait_durable(shard.next_offset - 1)
        for offset, commit in commits:
            shard.marks.state.apply(offset, commit)
        for subscriber in shard.flush():
            await subscriber.wait_for_room()
        return bases
