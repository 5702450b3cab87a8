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
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar

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
from .errors import ClientTimeoutError, ConnectionLostError, ProtocolViolationError

__all__ = ["Event", "Feed", "Start", "Subscription", "start_position"]

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


@dataclass(frozen=True, slots=True)
class Event:
    """One delivered event.

    `offset`, `timestamp_micros` and `publisher` are set when the broker sends
    them (offsets and times on durable streams; the publisher when recorded).
    `dropped_before` counts events lost right before this one, seen as a gap in
    the offsets (always 0 without offsets)."""

    payload: bytes
    offset: int | None
    timestamp_micros: int | None
    publisher: str | None
    shard: int
    dropped_before: int = 0


class Feed(abc.ABC, Generic[T]):
    """An event stream the broker opened for one subscription or watch."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._handoff: EventHandoff | None = None
        self._buffer: deque[T] = deque()
        self._finished = False  # the broker ended the feed for good
        self._closed = False  # the application closed it
        self._open_lock = asyncio.Lock()
        self._resume_pending = False

    # -- what a kind of feed (subscription, cache watch) defines ------------------------

    @abc.abstractmethod
    async def _open_stream(self) -> EventHandoff:
        """Send the request that opens the feed and return its event stream."""

    @abc.abstractmethod
    def _accept(self, item: Item) -> None:
        """Take one decoded item: buffer what it delivers, or react to a last frame."""

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
            for record in item.records:
                lost = self._tracker.observe(record.offset, record.skipped_before)
                if lost:
                    logger.warning(
                        "%s: %d event(s) lost before %s", self.label, lost, record.offset
                    )
                self._buffer.append(
                    Event(
                        payload=record.payload,
                        offset=record.offset,
                        timestamp_micros=record.timestamp_micros,
                        publisher=record.publisher,
                        shard=self.shard,
                        dropped_before=lost,
                    )
                )
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
