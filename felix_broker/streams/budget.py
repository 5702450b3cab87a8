"""Byte budgets for publishes in flight (PL5).

A publish holds its payload bytes from the moment the broker reads it until the
tenant's worker has appended it (its `done` future settles): in three budgets,
taken in this order and released together:

1. `pub_conn_inflight_bytes` per connection and identity (the token's tenant and
   subject);
2. `effective_pub_conn_total_inflight_bytes` per connection across identities;
3. `pub_inflight_bytes` for the whole broker.

A publish that does not fit waits, and since publishes run inline on their
stream's reader, the stream is not read meanwhile: QUIC flow control holds the
client back (excess waits in flow control, it is never refused). A publish
bigger than a whole budget is admitted once that budget is otherwise empty, so
every publish makes progress. Waiters are served in arrival order.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["ByteBudget"]


class ByteBudget:
    """At most `limit` bytes held at once (one oversized holder alone may exceed it)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a byte budget needs a limit of at least 1")
        self.limit = limit
        self.held = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.limit

    async def acquire(self, size: int) -> None:
        """Hold `size` bytes, waiting (first come, first served) until they fit."""
        if not self._waiters and self._fits(size):
            self.held += size
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(size)  # granted as we were cancelled: hand it on
            else:
                self._waiters.remove(entry)
                self._wake()
            raise

    def release(self, size: int) -> None:
        self.held -= size
        assert self.held >= 0, "released more than was held"
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            size, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._fits(size):
                return
            self._waiters.popleft()
            self.held += size
            waiter.set_result(None)
