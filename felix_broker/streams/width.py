"""Publish widths a client announced on one QUIC stream (decision ``publish-width``).

``publish_width {tenant_id, namespace, stream, shards}`` tells the broker the
shard count a client routed the keyed batches that follow on the same QUIC
stream by. It is never answered. A keyed batch for that stream is then
refused with ``stale_width`` (retry class ``retry``: nothing was written; the
client re-reads the width and resends) whenever the announced width is not
the stream's: its key may have been routed to the wrong shard. Unkeyed
batches always go to shard 0 and are never refused for width.

Bound: one stream holds at most :data:`MAX_ANNOUNCED` announcements; past
that the oldest is forgotten, and keyed batches for a forgotten name are
routed as if nothing had been announced (the protocol's behaviour for a
client that never sends ``publish_width``).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

from felix_broker.metrics import BrokerMetrics

__all__ = ["MAX_ANNOUNCED", "AnnouncedWidths", "StreamWidths"]

MAX_ANNOUNCED = 256


class AnnouncedWidths:
    """The widths announced on one QUIC stream, per (tenant, namespace, stream)."""

    def __init__(self, bound: int = MAX_ANNOUNCED) -> None:
        if bound < 1:
            raise ValueError("bound must be at least 1")
        self._bound = bound
        self._widths: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._widths)

    def announce(self, tenant_id: str, namespace: str, stream: str, shards: int) -> None:
        """Record the width the client routes this stream's keyed batches by from now on."""
        name = (tenant_id, namespace, stream)
        self._widths[name] = shards
        self._widths.move_to_end(name)
        while len(self._widths) > self._bound:
            self._widths.popitem(last=False)

    def stale(
        self, tenant_id: str, namespace: str, stream: str, *, keyed: bool, actual: int
    ) -> int | None:
        """The announced width when a batch must be refused ``stale_width``, else None."""
        if not keyed:
            return None
        announced = self._widths.get((tenant_id, namespace, stream))
        if announced is None or announced == actual:
            return None
        return announced


class StreamWidths:
    """The announcements of every live QUIC stream, keyed by the stream object.

    Held weakly: a stream's announcements go with the stream.
    """

    def __init__(self, metrics: BrokerMetrics | None = None) -> None:
        self._metrics = metrics
        self._streams: weakref.WeakKeyDictionary[object, AnnouncedWidths] = (
            weakref.WeakKeyDictionary()
        )

    def announce(
        self, stream: object, tenant_id: str, namespace: str, name: str, shards: int
    ) -> None:
        widths = self._streams.get(stream)
        if widths is None:
            widths = self._streams[stream] = AnnouncedWidths()
        widths.announce(tenant_id, namespace, name, shards)
        if self._metrics is not None:
            self._metrics.publish_widths.inc()

    def stale(
        self, stream: object, tenant_id: str, namespace: str, name: str, *, keyed: bool, actual: int
    ) -> int | None:
        """The announced width when a batch on ``stream`` must be refused ``stale_width``."""
        widths = self._streams.get(stream)
        if widths is None:
            return None
        announced = widths.stale(tenant_id, namespace, name, keyed=keyed, actual=actual)
        if announced is not None and self._metrics is not None:
            self._metrics.stale_width_refusals.inc()
        return announced
