"""Subscriptions: a stream shard's events as an async iterator.

`Feed` is what subscriptions and cache watches share: opened by awaiting it,
by `async with`, or by starting to iterate; read straight from the broker's
event stream (so a slow consumer holds the broker back through QUIC flow
control instead of growing a buffer here); closed with STOP_SENDING, which is
how the broker learns the subscriber left. `Subscription` adds offsets: gap
detection, and resuming from the right offset when the broker ends the stream
with `subscription_lagged` or `shard_moved`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Mapping
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar

import msgspec

from felix_transport import StreamClosedError
from felix_wire.messages import (
    CacheWatchLagged,
    ShardMoved,
    StartOffset,
    StartPosition,
    StreamDeleted,
    Subscribed,
    SubscriptionLagged,
)

from ._events import Item, OffsetTracker, Records, StreamEnd
from ._pool import EventHandoff
from .errors import (
    ClientTimeoutError,
    ConnectionLostError,
    ProtocolViolationError,
    ShardLostError,
)

__all__ = [
    "Event",
    "Feed",
    "OpenedByAwait",
    "ShardedFeed",
    "Start",
    "StreamSubscription",
    "Subscription",
    "start_position",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

Start = Literal["latest", "earliest"] | int
"""Where a subscription starts: the tail, the oldest retained record, or an offset."""


def start_position(start: Start) -> StartPosition:
    if start == "latest" or start == "earliest":
        return start
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return StartOffset(offset=start)
    raise ValueError(f"start must be 'latest', 'earliest' or an offset >= 0, not {start!r}")


class Event(msgspec.Struct, frozen=True, gc=False):
    """One delivered event (immutable; compared and printed field by field).

    `offset`, `timestamp_micros` and `publisher` are set when the broker sends
    them (offsets and times on durable streams; the publisher when recorded).
    `dropped_before` counts events lost right before this one, seen as a gap in
    the offsets (always 0 without offsets).

    A msgspec Struct rather than a frozen dataclass: one is built per event
    received, and a frozen dataclass's `__init__` sets each field through
    `object.__setattr__` (several times slower; `gc=False`: its fields hold no
    containers)."""

    payload: bytes
    offset: int | None
    timestamp_micros: int | None
    publisher: str | None
    shard: int
    dropped_before: int = 0


class OpenedByAwait(abc.ABC):
    """Opened by awaiting it or by `async with` (which closes it on the way out)."""

    @abc.abstractmethod
    async def open(self) -> Self:
        """Open it (once; opening again returns it as it is)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close it (once; closing again does nothing)."""

    def __await__(self) -> Generator[Any, None, Self]:
        return self.open().__await__()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Feed(OpenedByAwait, Generic[T]):
    """An event stream the broker opened for one subscription or watch."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._handoff: EventHandoff | None = None
        self._buffer: deque[T] = deque()
        self._finished = False  # the broker ended the feed for good
        self._closed = False  # the application closed it
        self._open_lock = asyncio.Lock()
        self._resume_pending = False
        # Told of a `shard_moved` before the feed reopens (the client keeps the
        # named owner as the shard's hint, so the reopen goes there first).
        self.on_moved: Callable[[ShardMoved], None] | None = None

    # -- what a kind of feed (subscription, cache watch) defines ------------------------

    @abc.abstractmethod
    async def _open_stream(self) -> EventHandoff:
        """Send the request that opens the feed and return its event stream."""

    @abc.abstractmethod
    def _accept(self, item: Item) -> None:
        """Take one decoded item: buffer what it delivers, or react to a last frame."""

    @property
    @abc.abstractmethod
    def position(self) -> int | None:
        """Where the feed would resume: the offset after the last item delivered
        (None before the first one, without offsets)."""

    # -- opening ---------------------------------------------------------------------

    async def open(self) -> Self:
        async with self._open_lock:
            if self._handoff is None and not self._closed:
                handoff = await self._open_stream()
                self._handoff = handoff
                for item in handoff.items:
                    self._accept(item)
                handoff.items = []
        return self

    def _restart(self) -> None:
        """End the current event stream; the next read opens a new one."""
        if self._handoff is not None:
            self._handoff.stream.stop_sending(0)
        self._handoff = None
        self._resume_pending = True

    # -- reading ---------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        return await self._next()

    async def next(self, timeout: float | None = None) -> T:
        """The next item; StopAsyncIteration once the feed has ended. With a
        `timeout` in seconds, ClientTimeoutError (a TimeoutError) when nothing came."""
        if timeout is None:
            return await self._next()
        try:
            async with asyncio.timeout(timeout):
                return await self._next()
        except TimeoutError as exc:
            if isinstance(exc, ClientTimeoutError):
                raise
            raise ClientTimeoutError(f"{self.label}: nothing within {timeout} s") from None

    async def _next(self) -> T:
        while not self._buffer:
            if self._closed or self._finished:
                raise StopAsyncIteration
            if self._handoff is None:
                await self.open()
                continue
            await self._read_once(self._handoff)
        return self._buffer.popleft()

    def take_buffered(self) -> T | None:
        """The next item if one was already read (no wait), else None."""
        return self._buffer.popleft() if self._buffer else None

    async def _read_once(self, handoff: EventHandoff) -> None:
        try:
            data = await handoff.stream.read()
        except StreamClosedError as exc:
            if self._closed:
                raise StopAsyncIteration from None
            raise ConnectionLostError(f"{self.label}: event stream failed: {exc}") from exc
        if not data:
            handoff.decoder.close()
            if handoff.decoder.ended is None:
                # A FIN without a last frame: the broker went away (or stopped
                # serving the feed without saying why).
                self._handoff = None
                raise ConnectionLostError(f"{self.label}: event stream ended unexpectedly")
            return
        for item in handoff.decoder.feed(data):
            self._accept(item)

    # -- closing ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed or self._finished

    async def aclose(self) -> None:
        """Stop the feed: the broker sees STOP_SENDING and drops the subscriber."""
        if self._closed:
            return
        self._closed = True
        if self._handoff is not None:
            self._handoff.stream.stop_sending(0)
            self._handoff = None
        self._buffer.clear()


Opener = Callable[[StartPosition], Awaitable[tuple[Subscribed, EventHandoff]]]


class Subscription(Feed[Event]):
    """Events of one stream shard, from `start` on.

    Use as `async with client.subscribe(...) as sub: async for event in sub`,
    or `sub = await client.subscribe(...)` then `await sub.next(timeout=1)`.
    """

    def __init__(self, opener: Opener, *, stream: str, shard: int, start: Start) -> None:
        super().__init__(f"subscription {stream}/{shard}")
        self.stream = stream
        self.shard = shard
        self._opener = opener
        self._start: StartPosition = start_position(start)
        self.subscription_id: int | None = None
        self.start_offset: int | None = None
        self.live_offset: int | None = None
        self.resumes = 0
        self._tracker = OffsetTracker()

    @property
    def dropped(self) -> int:
        """Events lost so far, from gaps in the offsets."""
        return self._tracker.dropped

    @property
    def next_offset(self) -> int | None:
        """The offset after the last event delivered (None without offsets)."""
        return self._tracker.next_offset

    @property
    def position(self) -> int | None:
        return self._tracker.next_offset

    async def _open_stream(self) -> EventHandoff:
        subscribed, handoff = await self._opener(self._start)
        self.subscription_id = subscribed.subscription_id
        if self.start_offset is None:
            self.start_offset = subscribed.start_offset
        self.live_offset = subscribed.live_offset
        if self._tracker.next_offset is None and subscribed.start_offset is not None:
            self._tracker.next_offset = subscribed.start_offset
        logger.debug("%s: subscribed as %d", self.label, subscribed.subscription_id)
        return handoff

    def _accept(self, item: Item) -> None:
        if isinstance(item, Records):
            # One run of consecutive offsets: only its first event can follow a gap
            # (the tracker's rule applied to each event gives 0 for the rest).
            payloads = item.payloads
            if not payloads:
                return
            base, stamps, publisher, shard = (
                item.base_offset,
                item.timestamps,
                item.publisher,
                self.shard,
            )
            lost = self._tracker.observe(base, item.skipped_before)
            if base is None:
                events = [Event(p, None, None, publisher, shard) for p in payloads]
            else:
                if lost:
                    logger.warning("%s: %d event(s) lost before %s", self.label, lost, base)
                self._tracker.next_offset = base + len(payloads)
                if stamps is None:
                    events = [
                        Event(p, base + i, None, publisher, shard) for i, p in enumerate(payloads)
                    ]
                else:
                    events = [
                        Event(p, base + i, stamps[i], publisher, shard)
                        for i, p in enumerate(payloads)
                    ]
                if lost:
                    first = events[0]
                    events[0] = Event(
                        first.payload, base, first.timestamp_micros, publisher, shard, lost
                    )
            self._buffer.extend(events)
        elif isinstance(item, StreamEnd):
            self._end(item.terminal)
        else:
            raise ProtocolViolationError(f"{self.label}: {type(item).__name__} on a subscription")

    def _end(
        self, terminal: SubscriptionLagged | ShardMoved | StreamDeleted | CacheWatchLagged
    ) -> None:
        if isinstance(terminal, SubscriptionLagged):
            # The broker dropped records for us; resume exactly where they start.
            logger.info("%s: lagged, resuming from %d", self.label, terminal.resume_from)
            self._resume_at(terminal.resume_from)
        elif isinstance(terminal, ShardMoved):
            # Resume at max(last delivered + 1, resume_from) (S11).
            candidates = [
                o for o in (self._tracker.next_offset, terminal.resume_from) if o is not None
            ]
            logger.info("%s: shard moved (generation %d)", self.label, terminal.generation)
            if self.on_moved is not None:
                self.on_moved(terminal)
            if candidates:
                self._resume_at(max(candidates))
            else:
                self._start = "latest"
                self.resumes += 1
                self._restart()
        elif isinstance(terminal, StreamDeleted):
            logger.info("%s: the stream was deleted", self.label)
            self._finished = True
        else:
            raise ProtocolViolationError(f"{self.label}: cache_watch_lagged on a subscription")

    def _resume_at(self, offset: int) -> None:
        self._start = StartOffset(offset=offset)
        self._tracker.next_offset = offset
        self.resumes += 1
        self._restart()


class ShardedFeed(OpenedByAwait, Generic[T]):
    """One feed per shard, read as one async iterator (the protocol's
    `subscribe_sharded`): items keep their order within a shard, shards
    interleave as their items arrive.

    Opening opens every shard's feed, and fails if any shard cannot be opened.
    `positions` is the vector to resume from, one position per shard. When one
    shard's feed fails, the next read raises `ShardLostError` naming it once;
    reading again goes on with the other shards (`lost` keeps what failed), and
    `await recover(shard)` opens that shard again from its position.
    Nothing is buffered beyond what each shard's feed holds: a pending read per
    shard, so a slow reader holds every shard back through flow control.
    """

    def __init__(
        self,
        label: str,
        open_parts: Callable[[], Awaitable[dict[int, Feed[T]]]],
        reopen: Callable[[int, int | None], Feed[T]],
    ) -> None:
        self.label = label
        self._open_parts = open_parts
        self._reopen = reopen
        self.parts: dict[int, Feed[T]] = {}
        self.lost: dict[int, BaseException] = {}
        self._positions: dict[int, int | None] = {}
        self._pending: dict[int, asyncio.Task[T]] = {}
        self._ready: deque[tuple[int, asyncio.Task[T]]] = deque()
        self._closing: set[asyncio.Task[None]] = set()
        self._opened = False
        self._closed = False
        self._open_lock = asyncio.Lock()

    async def open(self) -> Self:
        async with self._open_lock:
            if self._opened or self._closed:
                return self
            parts = await self._open_parts()
            try:
                await asyncio.gather(*(part.open() for part in parts.values()))
            except BaseException:
                await asyncio.gather(*(part.aclose() for part in parts.values()))
                raise
            self.parts = parts
            self._opened = True
        return self

    @property
    def shards(self) -> list[int]:
        """The shards read (lost ones included)."""
        return sorted({*self.parts, *self.lost})

    @property
    def positions(self) -> dict[int, int | None]:
        """Per shard, where it would resume (pass it back as the start vector)."""
        out: dict[int, int | None] = dict(self._positions)
        for shard, part in self.parts.items():
            out[shard] = part.position
        return dict(sorted(out.items()))

    @property
    def closed(self) -> bool:
        return self._closed or (self._opened and not self.parts and not self._ready)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        if self._opened and not self._closed and not self._pending and not self._ready:
            # `_next`'s first step when no read is pending, without its frame: most
            # items of a busy feed are the rest of a read a shard already made.
            for part in self.parts.values():
                item = part.take_buffered()
                if item is not None:
                    return item
        return await self._next()

    async def next(self, timeout: float | None = None) -> T:
        """The next item of any shard; StopAsyncIteration once every shard ended;
        ClientTimeoutError when nothing came within `timeout` seconds (the reads
        stay pending, nothing is lost)."""
        if timeout is None:
            return await self._next()
        try:
            async with asyncio.timeout(timeout):
                return await self._next()
        except TimeoutError as exc:
            if isinstance(exc, ClientTimeoutError):
                raise
            raise ClientTimeoutError(f"{self.label}: nothing within {timeout} s") from None

    async def _next(self) -> T:
        if not self._opened:
            await self.open()
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._pending:
                # Reads that finished meanwhile go first, in shard order.
                for shard, task in sorted(self._pending.items()):
                    if task.done():
                        del self._pending[shard]
                        self._ready.append((shard, task))
            if self._ready:
                shard, task = self._ready.popleft()
                error = task.exception()
                if error is None:
                    return task.result()
                self._retire(shard, error)
                continue
            # What a shard's feed already holds (the rest of its last read) needs no
            # task and no wait: a task per item was most of a subscriber's cost.
            for shard, part in self.parts.items():
                if shard not in self._pending:
                    item = part.take_buffered()
                    if item is not None:
                        return item
            loop = asyncio.get_running_loop()
            for shard, part in self.parts.items():
                if shard not in self._pending:
                    self._pending[shard] = loop.create_task(
                        part.__anext__(), name=f"felix-{self.label}-{shard}"
                    )
            if not self._pending:
                raise StopAsyncIteration
            done, _ = await asyncio.wait(
                self._pending.values(), return_when=asyncio.FIRST_COMPLETED
            )
            for shard, task in sorted(self._pending.items()):
                if task in done:
                    del self._pending[shard]
                    self._ready.append((shard, task))

    def _retire(self, shard: int, error: BaseException) -> None:
        """A shard's feed ended (quietly when the broker ended it for good) or
        failed (ShardLostError, raised once)."""
        part = self.parts.pop(shard)
        self._positions[shard] = part.position
        if isinstance(error, StopAsyncIteration):
            return
        self.lost[shard] = error
        logger.warning("%s: shard %d lost: %s", self.label, shard, error)
        self._closing.add(asyncio.get_running_loop().create_task(part.aclose()))
        raise ShardLostError(shard, part.position, error) from error

    async def recover(self, shard: int) -> None:
        """Open a lost shard again, from where it stopped (its position; the
        tail when it had none). Raises what opening raises; the shard then
        stays lost."""
        if shard not in self.lost:
            raise ValueError(f"shard {shard} is not lost")
        if self._closed:
            raise ConnectionLostError(f"{self.label} is closed")
        part = self._reopen(shard, self._positions.get(shard))
        await part.open()
        del self.lost[shard]
        self._positions.pop(shard, None)
        self.parts[shard] = part
        logger.info("%s: shard %d recovered", self.label, shard)

    async def aclose(self) -> None:
        """Stop every shard's feed."""
        if self._closed:
            return
        self._closed = True
        for task in self._pending.values():
            task.cancel()
        await asyncio.gather(*self._pending.values(), return_exceptions=True)
        self._pending.clear()
        for _shard, task in self._ready:
            if not task.cancelled():
                task.exception()  # retrieved: nobody will read it now
        self._ready.clear()
        await asyncio.gather(*(part.aclose() for part in self.parts.values()))
        await asyncio.gather(*self._closing, return_exceptions=True)


StartVector = Start | Mapping[int, Start]
"""A start for every shard, or one per shard (a `positions` vector; a shard it
does not name, or names with None, starts at `latest`)."""


class StreamSubscription(ShardedFeed[Event]):
    """Every shard of one stream: one subscription per shard (`parts`), events in
    order within a shard, each `Event` naming its `shard`. Created by
    `client.subscribe(stream)`; see `ShardedFeed` for positions and lost shards."""

    def __init__(
        self,
        stream: str,
        open_parts: Callable[[], Awaitable[dict[int, Feed[Event]]]],
        reopen: Callable[[int, int | None], Feed[Event]],
    ) -> None:
        super().__init__(f"subscription {stream}", open_parts, reopen)
        self.stream = stream

    @property
    def dropped(self) -> int:
        """Events lost so far on every shard, from gaps in the offsets."""
        return sum(p.dropped for p in self.parts.values() if isinstance(p, Subscription))

    @property
    def subscription_ids(self) -> dict[int, int | None]:
        return {
            shard: p.subscription_id
            for shard, p in self.parts.items()
            if isinstance(p, Subscription)
        }


def shard_start(start: StartVector | Mapping[int, int | None], shard: int) -> Start:
    """The start of one shard from a start for all or a vector of positions."""
    if isinstance(start, Mapping):
        value = start.get(shard)
        return "latest" if value is None else value
    return start
