"""Ordered lanes: publishes of one key (or of one stream without a key) leave in
the order they were called, however many are in flight.

A publish takes a ticket when it is called (synchronously, so call order is
ticket order), waits until its ticket is first, writes its frame, then hands
the lane on; it waits for its answer outside the lane, so acked publishes stay
pipelined. Lanes exist only while someone is in them, so the table is bounded
by the publishes in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from types import TracebackType

__all__ = ["Lanes", "Ticket"]


class Ticket:
    """One caller's place in a lane; `await ticket.turn()`, then `ticket.leave()`."""

    def __init__(self, lanes: Lanes, key: Hashable) -> None:
        self._lanes = lanes
        self._key = key
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._left = False

    async def turn(self) -> None:
        """Wait until every earlier ticket of the lane has left it."""
        if self._ready.done():
            return  # first in its lane: no wait, no shield
        try:
            await asyncio.shield(self._ready)
        except asyncio.CancelledError:
            self.leave()
            raise

    def leave(self) -> None:
        """Hand the lane on (idempotent; also how a cancelled waiter drops out)."""
        if self._left:
            return
        self._left = True
        self._lanes._leave(self._key, self)

    async def __aenter__(self) -> Ticket:
        await self.turn()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.leave()


class Lanes:
    """FIFO lanes by key."""

    def __init__(self) -> None:
        self._lanes: dict[Hashable, deque[Ticket]] = {}

    def __len__(self) -> int:
        return len(self._lanes)

    def ticket(self, key: Hashable) -> Ticket:
        """A place at the end of `key`'s lane, taken now."""
        ticket = Ticket(self, key)
        lane = self._lanes.setdefault(key, deque())
        lane.append(ticket)
        if len(lane) == 1:
            ticket._ready.set_result(None)
        return ticket

    def _leave(self, key: Hashable, ticket: Ticket) -> None:
        lane = self._lanes.get(key)
        if lane is None:
            return
        head = lane[0] is ticket
        lane.remove(ticket)
        if not lane:
            del self._lanes[key]
        elif head and not lane[0]._ready.done():
            lane[0]._ready.set_result(None)
