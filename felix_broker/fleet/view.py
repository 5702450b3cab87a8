"""The routing view a fleet member serves by: one `RoutingSnapshot`, swapped in one step.

Readers (placement at the dispatch seam, discovery, the owner side of the peer
listener) take `view.snapshot` and never see a half-applied change. Two inputs
move it: the assignment watcher (`update`, with what etcd says) and the
membership (`fence` while the broker's lease is lost: the snapshot served is
then etcd's with every shard led here unavailable, reason ``fenced``, whatever
the watch brings meanwhile; `unfence` once the broker holds a lease again).

Listeners are called with (previous, current) after every swap; `wait_changed`
is the same notification for a task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from felix_broker.fleet.routing import RoutingSnapshot

__all__ = ["FleetView", "Listener"]

_log = logging.getLogger(__name__)

Listener = Callable[[RoutingSnapshot, RoutingSnapshot], None]


class FleetView:
    """This broker's routing snapshot: what etcd says, fenced while the lease is lost."""

    def __init__(self, snapshot: RoutingSnapshot) -> None:
        self._raw = snapshot
        self._served = snapshot
        self._fenced = False
        self.revision = 0  # the newest etcd revision applied
        self._listeners: list[Listener] = []
        self._changed = asyncio.Event()

    @property
    def snapshot(self) -> RoutingSnapshot:
        """What this broker serves and routes by now."""
        return self._served

    @property
    def raw(self) -> RoutingSnapshot:
        """What etcd says, without the fence."""
        return self._raw

    @property
    def fenced(self) -> bool:
        return self._fenced

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def wait_changed(self) -> RoutingSnapshot:
        """Wait for the next swap; the snapshot it swapped in."""
        await self._changed.wait()
        return self._served

    def fence(self) -> None:
        """Stop serving every shard led here, at once, until `unfence`."""
        self._fenced = True
        self._publish(self._raw)

    def unfence(self) -> None:
        self._fenced = False
        self._publish(self._raw)

    def update(self, raw: RoutingSnapshot) -> None:
        """Swap in what etcd says now (served fenced while the lease is lost)."""
        if raw is not self._raw:
            self._publish(raw)

    def _publish(self, raw: RoutingSnapshot) -> None:
        self._raw = raw
        served = raw.fenced() if self._fenced else raw
        if served is self._served:
            return
        previous, self._served = self._served, served
        for listener in self._listeners:
            try:
                listener(previous, served)
            except Exception:
                _log.exception("fleet view listener failed")
        event, self._changed = self._changed, asyncio.Event()
        event.set()
