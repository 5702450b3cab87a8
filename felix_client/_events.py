"""Decoding a broker-opened event stream, without I/O (sans-IO).

A subscription's (or cache watch's) events arrive on a unidirectional stream
the broker opens; its first frame is `event_stream_hello` naming the
subscription. `EventStreamDecoder` is fed the stream's bytes and returns typed
items: the hello, decoded records (binary batches or the JSON compatibility
forms), cache changes, and the terminal frames that say why a stream ends and
where to resume. `OffsetTracker` turns offsets into gap counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from felix_wire.binary import EventBatchLegacyFrame, EventBatchSharedFrame
from felix_wire.codec import decode_payload
from felix_wire.frame import MAX_FRAME_BYTES, FrameReader
from felix_wire.messages import (
    CacheEvent,
    CacheWatchLagged,
    Event,
    EventBatch,
    EventStreamHello,
    ShardMoved,
    StreamDeleted,
    SubscriptionLagged,
)
from felix_wire.wire_errors import WireError

from .errors import ProtocolViolationError

__all__ = [
    "CacheChange",
    "EventStreamDecoder",
    "Hello",
    "OffsetTracker",
    "Record",
    "Records",
    "StreamEnd",
    "Terminal",
]


@dataclass(frozen=True, slots=True)
class Record:
    """One delivered event, before the subscription stamps its shard and gap."""

    payload: bytes
    offset: int | None
    timestamp_micros: int | None
    publisher: str | None
    skipped_before: int  # offsets right below this one that hold no event


@dataclass(frozen=True, slots=True)
class Hello:
    subscription_id: int


@dataclass(frozen=True, slots=True)
class Records:
    """A run of events with consecutive offsets, as one frame carried them: the
    payloads, the first one's offset (None: the stream has none), one timestamp
    per payload (or None), the publisher of all of them, and how many offsets
    right below the first hold no event. Kept as the frame's columns so that a
    subscriber builds one object per event, not two; `records` builds them."""

    payloads: list[bytes]
    base_offset: int | None
    timestamps: list[int] | None
    publisher: str | None
    skipped_before: int

    @property
    def records(self) -> list[Record]:
        base = self.base_offset
        stamps = self.timestamps
        return [
            Record(
                payload=payload,
                offset=None if base is None else base + index,
                timestamp_micros=None if stamps is None else stamps[index],
                publisher=self.publisher,
                # skipped_before counts offsets below the run's first event only.
                skipped_before=self.skipped_before if index == 0 else 0,
            )
            for index, payload in enumerate(self.payloads)
        ]


@dataclass(frozen=True, slots=True)
class CacheChange:
    """One change seen by a cache watch; `value` None means the key was deleted."""

    key: str
    value: bytes | None
    offset: int
    expires_at_millis: int


Terminal = SubscriptionLagged | ShardMoved | StreamDeleted | CacheWatchLagged


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The stream's last frame, when it says why it ends."""

    terminal: Terminal


Item = Hello | Records | CacheChange | StreamEnd


class EventStreamDecoder:
    """Frames of one event stream to items. Raises ProtocolViolationError on a
    frame that cannot be decoded or has no place on an event stream."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._reader = FrameReader(max_payload=max_frame_bytes)
        self.subscription_id: int | None = None
        self.ended: Terminal | None = None

    def feed(self, data: bytes) -> list[Item]:
        items: list[Item] = []
        try:
            frames = self._reader.feed(data)
            for frame in frames:
                items.append(self._item(decode_payload(frame.flags, frame.payload)))
        except WireError as exc:
            raise ProtocolViolationError(f"undecodable event frame: {exc}") from exc
        return items

    def close(self) -> None:
        try:
            self._reader.close()
        except WireError as exc:
            raise ProtocolViolationError(f"event stream ended inside a frame: {exc}") from exc

    def _item(self, value: object) -> Item:
        if self.subscription_id is None:
            if not isinstance(value, EventStreamHello):
                raise ProtocolViolationError("event stream did not start with event_stream_hello")
            self.subscription_id = value.subscription_id
            return Hello(value.subscription_id)
        if self.ended is not None:
            raise ProtocolViolationError("frame after the event stream's last frame")
        if isinstance(value, EventBatchSharedFrame | EventBatchLegacyFrame):
            return Records(
                value.payloads,
                value.base_offset,
                value.timestamps,
                value.publisher,
                value.skipped_before or 0,
            )
        if isinstance(value, EventBatch):
            return Records(list(value.payloads), value.base_offset, None, None, 0)
        if isinstance(value, Event):
            return Records([value.payload], value.offset, None, None, 0)
        if isinstance(value, CacheEvent):
            return CacheChange(value.key, value.value, value.offset, value.expires_at_millis)
        if isinstance(value, SubscriptionLagged | ShardMoved | StreamDeleted | CacheWatchLagged):
            self.ended = value
            return StreamEnd(value)
        raise ProtocolViolationError(f"{type(value).__name__} has no place on an event stream")


class OffsetTracker:
    """Gap detection from offsets (S8): the events lost between the last one
    delivered at `prev` and one at `offset` are `offset - prev - 1 - skipped_before`."""

    def __init__(self, expected: int | None = None) -> None:
        self.next_offset = expected  # the offset the next event should carry
        self.dropped = 0

    def observe(self, offset: int | None, skipped_before: int) -> int:
        """Record an event's offset; return how many events were lost right before it."""
        if offset is None:
            return 0
        lost = 0
        if self.next_offset is not None:
            lost = max(0, offset - self.next_offset - skipped_before)
        self.dropped += lost
        self.next_offset = offset + 1
        return lost
