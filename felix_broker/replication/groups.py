"""Consumer groups of Quorum streams: group changes replicated with their shard.

A consumer group's durable state on a stream shard (cursor, acknowledgements
above it, dead letters, redriven records: `felix_broker.groups.records`) is a
sequence of `GroupChange`s. On a Quorum stream (RF > 1) in a fleet those changes
**ride the shard's own replication log**: a settle's changes become one entry
(`ReplicatedGroupChanges`, spec/fleet.yaml) appended by the leader through the
shard's `ReplicaDriver`, next to the publish batches. So:

- **Acknowledgement** (`GroupReplication.write`, the group service's hook where a
  settle is made durable): once a majority of the replica set holds the entry
  durably and this replica applied it, exactly like a Quorum publish. No majority
  within FELIX_PUBLISH_QUORUM_TIMEOUT_MS: `quorum_timeout` (outcome unknown: the
  change may still commit); deposed or fenced meanwhile: `leadership_lost`. Any
  failed write makes the shard's in-memory group states stale: the group service
  rebuilds them from the committed state once no write is in flight (a resent
  ack is replicated again, never answered from memory alone).
- **Application** (`GroupStreamApplier`, the shard's applier around the stream's
  `StreamApplier`): every replica applies committed entries in log order: batches
  to the stream log, group changes to the shard's group log (through
  `GroupService.append_replicated`, waiting until it is durable before the next
  entry), so a group change is always applied after the records it settles, and
  everything below the driver's applied count is durable in both logs (which is
  what lets the replication log be compacted below it).
- **Failover**: promotion is the stream's own (one log, one ballot, one caught-up
  check): a replica the placer may promote holds every committed group change,
  because it holds every committed entry. Every replica drops the in-memory
  group states of the shard when it applies a generation-start entry (a new
  generation), so a promoted leader rebuilds its groups from its group log,
  i.e. from the committed changes, and a deposed one forgets what it had ahead
  of its majority. Group requests are refused until the leader is open and has
  applied up to its mark (the engine's read gate: `not_ready` while settling).
  What a rebuilt group cannot know is who held which claim: it redelivers only
  unacknowledged records (claims are not durable, as after a restart).
- **Restart**: the driver asks which retained entries are applied; the answer
  stops right after the last batch the stream log holds. Group entries before
  it are durable in the group log (applied in order, each durable before the
  next entry); those after it are applied again once committed. Every group
  change is a plain "set" of state, so applying a suffix of the changes a
  second time gives the same state.

The entry payloads are told apart by their first bytes: a msgpack map of one
field (0x81) whose key is `group_changes` is a `ReplicatedGroupChanges`; a
`ReplicatedBatch` has two required fields, so its map never starts with 0x81; a
`ReplicatedRetention` (a retention cut, replication/apply.py) is a one-field map
too, with the key `retain_from`.

- **Compaction** of a Quorum shard's group log copies only committed state: the
  group service keeps, beside its in-memory states (which on a leader run ahead of
  the mark), the state its group log holds (`_ShardGroups.committed`, updated by
  `append_replicated` alone), and its compaction writes that one to the log's tail
  (no await between taking it and appending it, so it is the state at that place in
  the log), then deletes the segments wholly before it. A restart's suffix
  re-application (above) lands after the copy, which holds that suffix's effect
  already: applying it again gives the same state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from felix_broker.fleet.routing import RoutingSnapshot, ShardId, ShardKind
from felix_broker.groups.records import GroupChange, Kind
from felix_broker.storage import Log
from felix_common.catalog import StreamSpec
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.fleet import GroupChangeKind, ReplicatedGroupChange, ReplicatedGroupChanges

from .apply import StreamApplier
from .core import Entry
from .driver import ReplicaDriver, ReplicationRefusedError

__all__ = [
    "GroupLogs",
    "GroupReplication",
    "GroupStreamApplier",
    "decode_changes",
    "encode_changes",
    "is_group_entry",
]

_TO_WIRE: dict[Kind, GroupChangeKind] = {kind: GroupChangeKind(kind.name.lower()) for kind in Kind}
_FROM_WIRE: dict[GroupChangeKind, Kind] = {wire: kind for kind, wire in _TO_WIRE.items()}
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplicatedGroupChanges)
# The first bytes of every encoded ReplicatedGroupChanges: a one-field map and its
# key (an empty list encodes as one byte, which [:-1] leaves out).
_MARK = _encoder.encode(ReplicatedGroupChanges(group_changes=[]))[:-1]


def encode_changes(changes: Sequence[GroupChange]) -> bytes:
    if not changes:
        raise ValueError("a replicated group entry needs at least one change")
    entry = ReplicatedGroupChanges(
        group_changes=[
            ReplicatedGroupChange(kind=_TO_WIRE[c.kind], group=c.group, offset=c.offset)
            for c in changes
        ]
    )
    payload = _encoder.encode(entry)
    assert payload.startswith(_MARK)
    return payload


def decode_changes(payload: bytes) -> list[GroupChange]:
    entry = _decoder.decode(payload)
    return [GroupChange(_FROM_WIRE[c.kind], c.group, c.offset) for c in entry.group_changes]


def is_group_entry(entry: Entry) -> bool:
    return not entry.start and entry.payload.startswith(_MARK)


class GroupLogs(Protocol):
    """What the group service gives replication (felix_broker/groups/service.py)."""

    def append_replicated(
        self, spec: StreamSpec, index: int, changes: list[GroupChange]
    ) -> tuple[Log, int]: ...

    async def release_shard(
        self, tenant_id: str, namespace: str, stream: str, index: int
    ) -> None: ...


class GroupStreamApplier:
    """The applier of a Quorum stream shard whose log also carries group changes:
    batches go to the stream (`StreamApplier`), group changes to the group log."""

    def __init__(self, stream: StreamApplier, groups: GroupLogs) -> None:
        self.stream = stream
        self._groups = groups
        self._spec = stream.shard.spec
        self._index = stream.shard.index

    def records_of(self, entry: Entry) -> int:
        return 0 if is_group_entry(entry) else self.stream.records_of(entry)

    async def cut(self, records: int) -> None:
        await self.stream.cut(records)

    def applied_entries(
        self, entries: Sequence[Entry], records_below: int, tails: list[int] | None = None
    ) -> int:
        """The retained entries already applied: up to the last batch the stream log
        holds, and no further (a group entry after it is applied again once committed)."""
        self.stream.weigh_from(records_below)
        held = self.stream.records
        marked = self.stream.stream_marks(records_below)
        count, at = records_below, 0
        for entry in entries:
            if count == held:
                break
            size = 0 if is_group_entry(entry) else self.stream.walk_size(entry, count, marked)
            if size is None or count + size > held:
                break
            if tails is not None:
                tails.append(count)
            count += size
            at += 1
        if count != held:
            raise ValueError(f"stream log holds {held} records, not a whole prefix of batches")
        return at

    async def apply(
        self, entries: Sequence[Entry], tails: list[int] | None = None
    ) -> list[int | None]:
        """Apply in log order; each group entry durable before the next entry."""
        out: list[int | None] = []
        run: list[Entry] = []
        new_generation = False
        for entry in entries:
            new_generation = new_generation or entry.start
            if not is_group_entry(entry):
                run.append(entry)
                continue
            if run:
                out.extend(await self.stream.apply(run, tails))
                run = []
            if tails is not None:
                tails.append(self.stream.records)
            log, last = self._groups.append_replicated(
                self._spec, self._index, decode_changes(entry.payload)
            )
            await log.wait_durable(last)
            out.append(None)
        if run:
            out.extend(await self.stream.apply(run, tails))
        if new_generation:
            # A new leader: rebuild the groups from the committed changes (see above).
            spec = self._spec
            await self._groups.release_shard(spec.tenant_id, spec.namespace, spec.name, self._index)
        return out


class GroupReplication:
    """The group service's hook for Quorum shards (`GroupService.replication`)."""

    def __init__(
        self,
        driver: Callable[[ShardId], ReplicaDriver | None],
        snapshot: Callable[[], RoutingSnapshot],
    ) -> None:
        self._driver = driver
        self._snapshot = snapshot

    async def write(self, spec: StreamSpec, index: int, changes: list[GroupChange]) -> None:
        """Append one settle's changes; returns once a majority holds them and they are
        applied here; raises ReplicationRefusedError (not_leader, not_ready, fenced,
        quorum_timeout, leadership_lost)."""
        shard = ShardId(ShardKind.STREAM, spec.tenant_id, spec.namespace, spec.name, index)
        driver = self._driver(shard)
        if driver is None:
            raise ReplicationRefusedError(ErrorCode.NOT_LEADER, RetryClass.REDIRECT)
        try:
            await driver.append([encode_changes(changes)])
        except ReplicationRefusedError as exc:
            snapshot = self._snapshot()
            route = snapshot.route(shard)
            if exc.code is ErrorCode.NOT_LEADER and route and route.leader == snapshot.node_id:
                # Named leader but not open yet: nothing written, retry here soon.
                raise ReplicationRefusedError(
                    ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY, "not_ready"
                ) from None
            raise
