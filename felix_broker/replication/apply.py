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
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from felix_broker.storage.format import BatchExtension, ProducerMark
from felix_broker.streams.engine import Shard
from felix_wire.fleet import ReplicatedBatch

from .core import Entry

__all__ = ["StreamApplier", "decode_batch", "encode_batch", "records_in"]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplicatedBatch)


def encode_batch(batch: ReplicatedBatch) -> bytes:
    if not batch.payloads:
        raise ValueError("a replicated batch needs at least one payload")
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> ReplicatedBatch:
    return _decoder.decode(payload)


def records_in(entry: Entry) -> int:
    """How many stream records an entry becomes once applied."""
    return 0 if entry.start else len(decode_batch(entry.payload).payloads)


def _extension(batch: ReplicatedBatch) -> BatchExtension | None:
    if batch.producer_id is None:
        return None
    mark = ProducerMark(batch.producer_id, batch.sequence or 0, batch.digest or 0)
    return BatchExtension(producer=mark)


class StreamApplier:
    """Applies committed entries to one durable stream shard of the engine. The
    shard must take no other appends (its publishes go through replication)."""

    def __init__(self, shard: Shard) -> None:
        if shard.log is None:
            raise ValueError(f"stream {shard.spec.name!r} is not durable: nothing to apply to")
        self.shard = shard

    @property
    def records(self) -> int:
        """Stream records applied so far (the stream log's length)."""
        return self.shard.next_offset

    def records_of(self, entry: Entry) -> int:
        """The stream records `entry` becomes (the disk's weight of a record)."""
        return records_in(entry)

    def applied_entries(self, entries: Sequence[Entry], records_below: int) -> int:
        """After a restart: how many of the replication log's `entries` the stream log
        already holds (they are applied in order, so it is a prefix), given that the
        records before `entries` (compacted away) made `records_below` stream records."""
        held = self.records
        count, at = records_below, 0
        for entry in entries:
            size = records_in(entry)
            if count + size > held:
                break
            count += size
            at += 1
        if count != held:
            raise ValueError(f"stream log holds {held} records, not a whole prefix of batches")
        return at

    async def apply(self, entries: Sequence[Entry]) -> list[int | None]:
        """Append the entries' batches, wait until durable, deliver them to live
        subscribers; the stream base offset of each entry (None for a start entry)."""
        bases: list[int | None] = []
        shard = self.shard
        for entry in entries:
            if entry.start:
                bases.append(None)
                continue
            batch = decode_batch(entry.payload)
            base = shard.append(
                list(batch.payloads), batch.publisher, batch.timestamp_us, _extension(batch)
            )
            bases.append(base)
        if shard.log is not None and shard.next_offset:
            await shard.log.wait_durable(shard.next_offset - 1)
        for subscriber in shard.flush():
            await subscriber.wait_for_room()
        return bases
