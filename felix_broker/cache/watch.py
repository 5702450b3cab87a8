"""One cache watch's queue of changes, between the shard that makes them and the writer.

The shard offers every change to the watches that match it, synchronously and
in offset order, at the moment it appends the change to its log. A watch holds
at most `capacity` changes: the first change that finds the queue full is not
queued, its offset becomes `lagged_from`, and nothing more is taken. The
writer then sends what is queued, `cache_watch_lagged{resume_from=lagged_from}`
and ends the event stream (K7), so a re-watch from there has no gap.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

__all__ = ["Change", "Watcher"]


@dataclass(frozen=True, slots=True)
class Change:
    """One change as a watch delivers it: no value means the key was deleted."""

    key: str
    value: bytes | None
    offset: int
    expires_at_ms: int = 0


class Watcher:
    """A key watch (`key` set) or a prefix watch (`prefix` set) on one shard."""

    def __init__(self, *, key: str | None, prefix: str | None, capacity: int) -> None:
        assert (key is None) != (prefix is None)
        self.key = key
        self.prefix = prefix
        self.capacity = max(1, capacity)
        self.lagged_from: int | None = None
        self.closed = False
        # Its shard moved away: (node_id, addr, generation, resume_from); the queued
        # changes go out, then shard_moved.
        self.moved: tuple[str | None, str | None, int, int | None] | None = None
        self._queue: deque[Change] = deque()
        self._wake = asyncio.Event()

    def matches(self, key: str) -> bool:
        if self.key is not None:
            return key == self.key
        assert self.prefix is not None
        return key.startswith(self.prefix)

    def offer(self, change: Change) -> None:
        """Queue a change, or mark the watch lagged when the queue is full."""
        if self.closed or self.lagged_from is not None or self.moved is not None:
            return
        if len(self._queue) >= self.capacity:
            self.lagged_from = change.offset
        else:
            self._queue.append(change)
        self._wake.set()

    def end_moved(
        self, node_id: str | None, addr: str | None, generation: int, resume_from: int | None
    ) -> None:
        """End after the changes already queued (its shard moved)."""
        if self.moved is None and not self.closed:
            self.moved = (node_id, addr, generation, resume_from)
            self._wake.set()

    def close(self) -> None:
        """Stop the watch (the client stopped it, or the broker is closing)."""
        self.closed = True
        self._wake.set()

    async def take(self, max_changes: int) -> list[Change]:
        """Up to `max_changes` queued changes, waiting for one; [] once nothing
        more will come (closed, or lagged with the queue drained)."""
        while not self._queue:
            if self.closed or self.lagged_from is not None or self.moved is not None:
                return []
            self._wake.clear()
            await self._wake.wait()
        if self.closed:
            return []
        count = min(max_changes, len(self._queue))
        return [self._queue.popleft() for _ in range(count)]

    @property
    def queued(self) -> int:
        return len(self._queue)
