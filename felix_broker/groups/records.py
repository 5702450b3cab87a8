"""The records a stream shard's group log holds: cursors and dead letters, durably.

One group log per stream shard, under
`<durable_storage_dir>/@groups/<tenant>/<namespace>/<stream>/<shard>/` ("@" is
outside the catalog's name alphabet, so no stream log lands there). Every
record payload is a fixed 11-byte head, then the group name (big-endian, like
the storage format):

| bytes | field        | type | meaning                                   |
|-------|--------------|------|-------------------------------------------|
| 0     | kind         | u8   | one of `Kind` (below)                     |
| 1-8   | offset       | u64  | a stream offset; 0 for DELETE             |
| 9-10  | group_length | u16  | bytes of the UTF-8 group name that follows |

- CURSOR: the group's cursor is now `offset` (everything below is finished).
- DEAD: `offset` is a dead letter (and no longer redriven).
- DISCARD: `offset` left the dead-letter list.
- REDRIVE: `offset` left the dead-letter list and is owed again.
- SETTLED: a redriven `offset` was finished.
- DELETE: the group is gone (cursor, dead letters, redriven records).
- SEEK: the cursor is now `offset` and no acknowledgement above it stands.
- ACKED: `offset`, above the cursor, is acknowledged (so a restart does not
  redeliver it while a record below it holds the cursor back).

Every kind is a plain "set" of state, not a delta, so replaying a log after a
compaction copied the live state forward gives the same answer as replaying
the whole history.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "GroupChange",
    "GroupDurable",
    "Kind",
    "apply_change",
    "decode_change",
    "encode_change",
    "snapshot_changes",
]

_HEAD = struct.Struct(">BQH")
MAX_GROUP_BYTES = 0xFFFF


class Kind(enum.IntEnum):
    CURSOR = 1
    DEAD = 2
    DISCARD = 3
    REDRIVE = 4
    SETTLED = 5
    DELETE = 6
    SEEK = 7
    ACKED = 8


@dataclass(frozen=True, slots=True)
class GroupChange:
    """One durable change of one group's state."""

    kind: Kind
    group: str
    offset: int = 0


@dataclass(slots=True)
class GroupDurable:
    """What of a group survives a restart: its cursor, dead letters and redriven records."""

    cursor: int | None = None
    dead: set[int] = field(default_factory=set)
    redriven: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)  # above the cursor

    @property
    def exists(self) -> bool:
        return self.cursor is not None or bool(self.dead) or bool(self.redriven)

    def move_cursor(self, offset: int) -> None:
        self.cursor = offset
        if self.acked:
            self.acked = {o for o in self.acked if o >= offset}


def encode_change(change: GroupChange) -> bytes:
    name = change.group.encode()
    if len(name) > MAX_GROUP_BYTES:
        raise ValueError(f"group name of {len(name)} bytes is longer than {MAX_GROUP_BYTES}")
    return _HEAD.pack(change.kind, change.offset, len(name)) + name


def decode_change(payload: bytes) -> GroupChange:
    """The change in a log payload; ValueError when it is not one of ours."""
    if len(payload) < _HEAD.size:
        raise ValueError(f"group record of {len(payload)} bytes is shorter than its head")
    kind, offset, length = _HEAD.unpack_from(payload)
    if _HEAD.size + length != len(payload):
        raise ValueError("group record name length does not match its payload")
    return GroupChange(Kind(kind), payload[_HEAD.size :].decode(), offset)


def apply_change(groups: dict[str, GroupDurable], change: GroupChange) -> None:
    """Replay one change into the durable state of a shard's groups."""
    if change.kind is Kind.DELETE:
        groups.pop(change.group, None)
        return
    state = groups.setdefault(change.group, GroupDurable())
    offset = change.offset
    if change.kind is Kind.CURSOR:
        state.move_cursor(offset)
    elif change.kind is Kind.SEEK:
        state.cursor = offset
        state.acked = set()
    elif change.kind is Kind.ACKED:
        state.acked.add(offset)
    elif change.kind is Kind.DEAD:
        state.dead.add(offset)
        state.redriven.discard(offset)
    elif change.kind is Kind.DISCARD:
        state.dead.discard(offset)
    elif change.kind is Kind.REDRIVE:
        state.dead.discard(offset)
        state.redriven.add(offset)
    else:
        state.redriven.discard(offset)


def snapshot_changes(groups: Iterable[tuple[str, GroupDurable]]) -> list[GroupChange]:
    """The changes that rebuild `groups` from nothing (what compaction writes)."""
    out: list[GroupChange] = []
    for name, state in groups:
        if state.cursor is not None:
            out.append(GroupChange(Kind.CURSOR, name, state.cursor))
        out.extend(GroupChange(Kind.DEAD, name, o) for o in sorted(state.dead))
        out.extend(GroupChange(Kind.REDRIVE, name, o) for o in sorted(state.redriven))
        out.extend(GroupChange(Kind.ACKED, name, o) for o in sorted(state.acked))
    return out
