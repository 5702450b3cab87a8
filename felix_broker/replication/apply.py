"""Committed replicated batches into a stream shard's real storage.

A replicated stream shard keeps two logs: the replication log (`ReplicaDisk`,
what the core ships, truncates and counts toward the quorum mark) and the
shard's stream log (`felix_broker.storage`, what readers read). Every replica
applies the replication log's *committed* entries (below the quorum mark) to its
stream log, in log order, and nothing else (a Leader-consistency leader also what it
acknowledged: its own durable mark; decision `leader-consistency-replication`). So:

- readers (subscriptions, `stream_read`, `offset_for_time`, `latest`, group
  polls), which read the stream log, stop at the quorum mark without knowing it
  (at a Leader-consistency leader, at what it acknowledged);
- the stream log of a Quorum shard is never truncated (a committed entry is never
  undone; the replication log's uncommitted suffix is what a returning leader
  cuts); only a former Leader-consistency leader cuts its stream log (`cut`), back
  to the first entry a new leader's log contradicts;
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

**Idempotent batches** (`publish_idempotent`, binary 0x0100; decision
`quorum-idempotent-producers`). A batch with `producer_id` is judged against the
shard's producer table (`ShardMarks.producers`, a pure function of the stream
log) when its turn comes, on every replica, so every replica decides the same and
the table is replicated with the log: appended (its producer mark stored and
recorded), or no record anywhere (a duplicate, a gap, an unknown producer, an
expired or reused sequence). `apply` answers the verdict as one number
(`encode_verdict`: the base offset when appended, a negative code otherwise), and
the leader turns it into the client's answer (`decode_verdict`): a duplicate gets
the original offset, a refusal the protocol's `publish_refused`.

How many stream records an entry becomes therefore depends on the tail before it
(`records_at`) and, for an idempotent batch, on the producer table. The restart
walk (`applied_entries`) knows the tail, and tells an applied idempotent batch
from a refused one by the stream log (an applied one is the batch with its mark
at that offset); the compaction weighing (`records_of`, called by the disk's
compaction in log order, each entry once, from the records below the disk's base
that the restart walk was given) keeps its own running tail and the judged sizes
of idempotent batches, in log order.

**Retention cuts** (decision `quorum-retention-cut`). The producer table of a
replicated shard forgets batches only where its replication log says so: the
leader, when its retention policy would move its stream log's start past the last
cut (`proposed_cut`), appends a `ReplicatedRetention` entry (spec/fleet.yaml) with
that start; every replica applies it in log order (`ShardMarks.cut_producers`),
so every replica forgets the same producers at the same place and judges an idle
producer's next batch alike. The table ignores its own log's start
(`ShardMarks.producers_follow_log` off), and the log's local retention never
removes a segment holding a record at or above the last cut applied
(`Log.retention_floor`), so a restarted replica's table, rebuilt from its log and
trimmed at the cut it kept (`cut_file`, replaced atomically once what was applied
before the cut is durable), is the same as a live one's. A retention entry is a
one-field msgpack map like a group entry (first byte 0x81); the field name after
it tells them apart (`is_retention_entry`). It takes no stream records.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import msgspec

from felix_broker.storage.format import BatchExtension, CommitMark, ProducerMark, StoredChange
from felix_broker.storage.retention import Retention
from felix_broker.streams.engine import Shard
from felix_broker.streams.guards import ShardMarks
from felix_broker.streams.producers import Append, Decision, Duplicate, Refusal, RefusalReason
from felix_wire.fleet import (
    ReplicatedBatch,
    ReplicatedCommit,
    ReplicatedRetention,
    ReplicatedStateChange,
)

from .core import Entry

__all__ = [
    "StreamApplier",
    "commit_mark",
    "decode_batch",
    "decode_retention",
    "decode_verdict",
    "encode_batch",
    "encode_retention",
    "encode_verdict",
    "is_retention_entry",
    "records_at",
    "replicated_commit",
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplicatedBatch)
_retention_decoder = msgspec.msgpack.Decoder(ReplicatedRetention)
# The first bytes of every encoded ReplicatedRetention: a one-field map and its key
# (0 encodes as one byte, the value, which is what [:-1] leaves out).
_RETENTION_MARK = _encoder.encode(ReplicatedRetention(retain_from=0))[:-1]


def encode_batch(batch: ReplicatedBatch) -> bytes:
    if not batch.payloads:
        raise ValueError("a replicated batch needs at least one payload")
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> ReplicatedBatch:
    return _decoder.decode(payload)


def encode_retention(retain_from: int) -> bytes:
    return _encoder.encode(ReplicatedRetention(retain_from=retain_from))


def decode_retention(payload: bytes) -> int:
    return _retention_decoder.decode(payload).retain_from


def is_retention_entry(entry: Entry) -> bool:
    return not entry.start and entry.payload.startswith(_RETENTION_MARK)


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
    (a guarded batch whose condition fails at that tail becomes none; an idempotent
    batch is counted whole: only the applier knows its verdict)."""
    if entry.start or is_retention_entry(entry):
        return 0
    batch = decode_batch(entry.payload)
    return len(batch.payloads) if _admitted(batch, tail) else 0


# An idempotent batch's verdict as one number (what `apply` answers for it):
# >= 0: appended at that base offset; < 0: -1 - (argument * 8 + kind).
_DUPLICATE, _UNKNOWN, _GAP, _EXPIRED, _REUSED = range(5)
_REFUSED_KIND = {
    RefusalReason.UNKNOWN_PRODUCER: _UNKNOWN,
    RefusalReason.SEQUENCE_GAP: _GAP,
    RefusalReason.SEQUENCE_EXPIRED: _EXPIRED,
}


def encode_verdict(decision: Decision, at: int) -> int:
    """`decision` on a batch judged at stream offset `at` (a reused sequence is
    encoded with its original offset by the applier)."""
    if isinstance(decision, Append):
        return at
    if isinstance(decision, Duplicate):
        return -1 - (decision.offset * 8 + _DUPLICATE)
    kind = _REFUSED_KIND[decision.reason]
    return -1 - ((decision.expected or 0) * 8 + kind)


def _reused(original: int) -> int:
    return -1 - (original * 8 + _REUSED)


def decode_verdict(value: int, *, reused_refusal: bool) -> Append | Duplicate | Refusal:
    """The client's answer to an idempotent batch whose `apply` answered `value`:
    `Append` (the batch is at `value`), `Duplicate` (answer its original offset) or
    a `Refusal`. A reused sequence (other payloads) is refused `sequence_reused` to a
    client that offered FEATURE_SEQUENCE_REUSED, else a duplicate of the original."""
    if value >= 0:
        return Append()
    code = -1 - value
    kind, argument = code % 8, code // 8
    if kind == _DUPLICATE:
        return Duplicate(argument)
    if kind == _REUSED:
        return Refusal(RefusalReason.SEQUENCE_REUSED) if reused_refusal else Duplicate(argument)
    if kind == _GAP:
        return Refusal(RefusalReason.SEQUENCE_GAP, argument)
    if kind == _EXPIRED:
        return Refusal(RefusalReason.SEQUENCE_EXPIRED)
    if kind == _UNKNOWN:
        return Refusal(RefusalReason.UNKNOWN_PRODUCER)
    raise ValueError(f"not an idempotent verdict: {value}")


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
    shard must take no other appends (its publishes go through replication).
    `cut_file` keeps the last retention cut applied (None: in memory only, a test's
    choice); `retention` is the shard's policy, which the leader's cuts follow."""

    def __init__(
        self, shard: Shard, *, cut_file: Path | None = None, retention: Retention | None = None
    ) -> None:
        if shard.log is None:
            raise ValueError(f"stream {shard.spec.name!r} is not durable: nothing to apply to")
        self.shard = shard
        self.cut_file = cut_file
        self.retention = retention
        self.retained_from = _read_cut(cut_file) if cut_file is not None else 0
        self._follow_cut()
        self._weighed = 0  # the compaction weighing's running tail (see the module docs)
        # Records each judged idempotent batch became, in log order, from the disk's
        # base: what the compaction weighing takes (each once) instead of a guess.
        self._judged: deque[int] = deque()

    @property
    def records(self) -> int:
        """Stream records applied so far (the stream log's length)."""
        return self.shard.next_offset

    def _follow_cut(self) -> None:
        """The shard's table and log follow the cut (after opening or a rebuild)."""
        log = self.shard.log
        assert log is not None
        log.retention_floor = self.retained_from
        self.shard.marks.producers_follow_log = False
        self.shard.marks.cut_producers(self.retained_from)

    def proposed_cut(self, now_us: int) -> int | None:
        """The cut a leader appends now: the start its retention policy would leave its
        stream log, when that is past the last cut applied; else None."""
        log = self.shard.log
        assert log is not None
        if self.retention is None or log.closed:
            return None
        start = log.retention_start(self.retention, now_us=now_us)
        return start if start > self.retained_from else None

    async def _apply_cut(self, retain_from: int) -> None:
        if retain_from <= self.retained_from:
            return  # applied already (a restart applies the tail's cuts again)
        shard = self.shard
        log = shard.log
        assert log is not None
        if shard.next_offset:
            # What was applied before the cut is durable before the cut is kept, so a
            # restart never judges those entries again against the cut table.
            await log.wait_durable(shard.next_offset - 1)
        if self.cut_file is not None:
            await asyncio.to_thread(_write_cut, self.cut_file, retain_from)
        self.retained_from = retain_from
        self._follow_cut()

    def records_of(self, entry: Entry) -> int:
        """The stream records `entry` became (the disk's weight of a record): called
        by compaction only, in log order, each entry once (see the module docs)."""
        size = records_at(entry, self._weighed)
        if size and self._judged and decode_batch(entry.payload).producer_id is not None:
            size = self._judged.popleft()
        self._weighed += size
        return size

    def judge(self, batch: ReplicatedBatch) -> Decision:
        """An idempotent batch's verdict against the shard's producer table now (the
        same on every replica: the table is a function of the stream log). Not
        trimmed to this replica's retention first: retention runs on each replica
        at its own time, so a verdict depending on it could differ between replicas
        (the table's own bounds, per producer and in producers, are the same
        everywhere)."""
        marks = self.shard.marks
        assert batch.producer_id is not None
        sequence, digest = batch.sequence or 0, batch.digest or 0
        return marks.producers.check(batch.producer_id, sequence, digest, reused_refusal=True)

    def walk_size(
        self, entry: Entry, tail: int, marked: dict[int, tuple[int, int, int, int]]
    ) -> int | None:
        """The restart walk's size of `entry` after `tail` records, None when it is not
        applied yet (stop the walk). An idempotent batch was applied iff the stream log
        holds a batch with its mark at `tail` (`marked`: `stream_marks`); one at the
        stream log's end is not applied yet (a refused one is judged again, the same way:
        nothing was appended since)."""
        if is_retention_entry(entry):
            return None if tail >= self.records else 0  # at the end: applied again
        size = records_at(entry, tail)
        if not size or entry.start:
            return size
        batch = decode_batch(entry.payload)
        if batch.producer_id is None:
            return size
        if tail >= self.records:
            return None
        mark = (batch.producer_id, batch.sequence or 0, batch.digest or 0, size)
        size = size if marked.get(tail) == mark else 0
        self._judged.append(size)
        return size

    def stream_marks(self, records_below: int) -> dict[int, tuple[int, int, int, int]]:
        """Offset -> producer mark of the stream log's idempotent batches at or above
        `records_below` (for the restart walk; reads heads and extensions only)."""
        log = self.shard.log
        assert log is not None
        marked: dict[int, tuple[int, int, int, int]] = {}
        for offset, count, extension in log.extensions():
            mark = extension.producer
            if offset >= records_below and mark is not None:
                marked[offset] = (mark.producer_id, mark.sequence, mark.digest, count)
        return marked

    def weigh_from(self, records_below: int) -> None:
        """Where the compaction weighing starts: the records below the disk's base."""
        self._weighed = records_below
        self._judged.clear()

    def applied_entries(
        self, entries: Sequence[Entry], records_below: int, tails: list[int] | None = None
    ) -> int:
        """After a restart: how many of the replication log's `entries` the stream log
        already holds (they are applied in order, so it is a prefix), given that the
        records before `entries` (compacted away) made `records_below` stream records;
        `tails` gets the stream tail before each applied entry."""
        self.weigh_from(records_below)
        held = self.records
        marked = self.stream_marks(records_below)
        count, at = records_below, 0
        for entry in entries:
            size = self.walk_size(entry, count, marked)
            if size is None or count + size > held:
                break
            if tails is not None:
                tails.append(count)
            count += size
            at += 1
        if count != held:
            raise ValueError(f"stream log holds {held} records, not a whole prefix of batches")
        return at

    async def cut(self, records: int) -> None:
        """Cut the stream log back to its first `records` records (a batch boundary:
        where an entry's records started), durably, and rebuild the shard's marks
        (producer table, commit state) from what is left. Only a replica that applied
        entries above the commit mark (a former Leader-consistency leader) ever cuts."""
        shard = self.shard
        log = shard.log
        assert log is not None
        if records >= log.next_offset:
            return
        await log.truncate(records)
        shard.next_offset = log.next_offset
        shard.marks = await asyncio.to_thread(ShardMarks.rebuild, log)
        self._follow_cut()
        self._judged.clear()
        self._weighed = min(self._weighed, records)

    async def apply(
        self, entries: Sequence[Entry], tails: list[int] | None = None
    ) -> list[int | None]:
        """Append the entries' batches, wait until durable, apply their commits to the
        state view, deliver them to live subscribers; the stream base offset of each
        entry (None for a start entry; for a guarded batch the tail it was checked
        against, which is its base when applied; for an idempotent batch its verdict,
        `encode_verdict`: see the module docs). `tails` gets the stream tail before
        each entry (where a cut back to it would start)."""
        bases: list[int | None] = []
        commits: list[tuple[int, CommitMark]] = []
        shard = self.shard
        for entry in entries:
            if tails is not None:
                tails.append(shard.next_offset)
            if entry.start:
                bases.append(None)
                continue
            if is_retention_entry(entry):
                await self._apply_cut(decode_retention(entry.payload))
                bases.append(None)
                continue
            batch = decode_batch(entry.payload)
            if not _admitted(batch, shard.next_offset):
                bases.append(shard.next_offset)  # refused here, as on every replica
                continue
            if batch.producer_id is not None:
                decision = self.judge(batch)
                if not isinstance(decision, Append):  # no record, as on every replica
                    self._judged.append(0)
                    bases.append(self._verdict(batch, decision, shard.next_offset))
                    continue
            extension = _extension(batch)
            base = shard.append(
                list(batch.payloads), batch.publisher, batch.timestamp_us, extension
            )
            if batch.producer_id is not None:
                self._judged.append(len(batch.payloads))
                sequence, digest = batch.sequence or 0, batch.digest or 0
                shard.marks.producers.record(batch.producer_id, sequence, digest, base)
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

    def _verdict(self, batch: ReplicatedBatch, decision: Decision, at: int) -> int:
        if isinstance(decision, Refusal) and decision.reason is RefusalReason.SEQUENCE_REUSED:
            assert batch.producer_id is not None  # same sequence, other payloads
            original = self.shard.marks.producers.check(
                batch.producer_id, batch.sequence or 0, batch.digest or 0, reused_refusal=False
            )
            assert isinstance(original, Duplicate)
            return _reused(original.offset)
        return encode_verdict(decision, at)


def _read_cut(path: Path) -> int:
    """The cut kept in `path` (0 when there is none yet)."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return 0
    return int(text)


def _write_cut(path: Path, retain_from: int) -> None:
    """Replace `path` atomically: temp file, fsync, rename, folder fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    with temp.open("w", encoding="ascii") as file:
        file.write(str(retain_from))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
