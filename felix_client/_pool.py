"""Connection pools: one per concern (publish, cache and requests, events).

A `Pool` holds `size` QUIC connections (`Link`s), each with up to
`streams_per_conn` authenticated streams (`Channel`s). Both are created on
first use and reused after; a connection or stream found broken is replaced on
the next use, so one lost connection costs the requests it carried, not the
client. Event links also accept the unidirectional streams the broker opens
for subscriptions and cache watches and hand each to whoever waits for its
subscription id (`EventRouter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from felix_transport import (
    Connection,
    ConnectionClosedError,
    Stream,
    StreamClosedError,
    TransportConfig,
    connect,
)

from ._channel import Channel, TokenSource
from ._events import EventStreamDecoder, Hello, Item
from ._fleet import Fleet
from ._session import Offer
from .errors import (
    BrokerUnreachableError,
    ClientTimeoutError,
    ConnectionLostError,
    ProtocolViolationError,
)

__all__ = ["Dialer", "EventHandoff", "EventRouter", "Link", "Pool", "parse_addr"]

logger = logging.getLogger(__name__)

_connection_ids = itertools.count(1)
# How long an event stream nobody claimed is kept (its subscribe was abandoned).
_UNCLAIMED_TTL = 30.0


def parse_addr(addr: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) to a pair; ValueError naming the address otherwise."""
    host, sep, port = addr.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a broker address is HOST:PORT (e.g. 127.0.0.1:5000), not {addr!r}")
    return host, int(port)


@dataclass(frozen=True)
class Dialer:
    """Everything needed to open and authenticate connections and streams."""

    fleet: Fleet
    transport: TransportConfig
    tenant_id: str
    token: TokenSource
    offer: Offer
    connect_timeout: float
    auth_timeout: float
    max_inflight_bytes: int
    default_window: int
    # Called with the address of every pooled connection opened after the first
    # (a reconnect, or a pool growing: which one cannot be told apart, since the
    # connection that broke may sit in another slot), so the client asks
    # `topology` again.
    on_reconnect: list[Callable[[str], None]] = field(default_factory=list, compare=False)
    _turn: itertools.count[int] = field(default_factory=itertools.count, compare=False)

    async def connect(self, only: str | None = None) -> tuple[Connection, str, str]:
        """A new connection to the first address that answers, rotating the
        starting point over the seeds and the brokers `topology` named (so pools
        spread over the fleet, and a broker that is down is passed over), or to
        `only`. Returns the connection, its label and the address dialed."""
        addrs = [only] if only is not None else self.fleet.addrs
        start = next(self._turn)
        last: Exception | None = None
        for i in range(len(addrs)):
            addr = addrs[(start + i) % len(addrs)]
            host, port = parse_addr(addr)
            label = f"conn-{next(_connection_ids)}"
            try:
                async with asyncio.timeout(self.connect_timeout):
                    connection = await connect(self.transport, host, port)
            except TimeoutError:
                last = self._unreachable(host, port, self.connect_timeout)
            except ConnectionClosedError as exc:
                # A handshake nobody answers ends in the transport's idle timeout
                # when that is shorter than the connect timeout.
                if exc.error_code is None or "idle" in exc.reason_phrase.lower():
                    last = self._unreachable(host, port, self.transport.idle_timeout)
                else:
                    last = ConnectionLostError(f"{label}: cannot connect to {host}:{port}: {exc}")
            except OSError as exc:
                last = ConnectionLostError(f"{label}: cannot connect to {host}:{port}: {exc}")
            else:
                logger.debug("%s: connected to %s:%d (%s)", label, host, port, connection.impl)
                return connection, label, addr
            logger.info("%s", last)
        assert last is not None
        raise last

    @staticmethod
    def _unreachable(host: str, port: int, waited: float) -> BrokerUnreachableError:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return BrokerUnreachableError(
            f"no broker answered at {where} within {waited:.1f} s (is it running?)"
        )

    async def channel(self, connection: Connection, label: str) -> Channel:
        try:
            return await self._open_channel(connection, label)
        except ConnectionClosedError as exc:
            # Closed under us between the pool's check and the stream's opening.
            raise ConnectionLostError(f"{label}: connection closed ({exc})") from exc

    async def _open_channel(self, connection: Connection, label: str) -> Channel:
        return await Channel.open(
            connection,
            tenant_id=self.tenant_id,
            token=self.token,
            offer=self.offer,
            label=label,
            timeout=self.auth_timeout,
            max_inflight_bytes=self.max_inflight_bytes,
            default_window=self.default_window,
        )


@dataclass
class EventHandoff:
    """A broker-opened event stream, read up to and including its hello."""

    stream: Stream
    decoder: EventStreamDecoder
    items: list[Item]  # what followed the hello in the same reads


class EventRouter:
    """Accepts the broker's unidirectional streams on one connection and hands
    each to the subscription its `event_stream_hello` names. The hello and the
    `subscribed` answer travel on different streams, so either may come first."""

    def __init__(self, connection: Connection, label: str) -> None:
        self._connection = connection
        self._label = label
        self._arrived: dict[int, EventHandoff] = {}
        self._waiting: dict[int, asyncio.Future[EventHandoff]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.get_running_loop().create_task(
            self._accept_loop(), name=f"felix-{label}-accept"
        )

    async def take(self, subscription_id: int, timeout: float) -> EventHandoff:
        arrived = self._arrived.pop(subscription_id, None)
        if arrived is not None:
            return arrived
        future: asyncio.Future[EventHandoff] = asyncio.get_running_loop().create_future()
        self._waiting[subscription_id] = future
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise ClientTimeoutError(
                f"{self._label}: no event stream for subscription {subscription_id}"
            ) from None
        finally:
            self._waiting.pop(subscription_id, None)

    async def _accept_loop(self) -> None:
        while True:
            try:
                stream = await self._connection.accept_stream()
            except ConnectionClosedError:
                break
            if not stream.is_unidirectional:
                # Brokers never open bidirectional streams to clients.
                stream.stop_sending(0)
                stream.reset(0)
                continue
            task = asyncio.get_running_loop().create_task(self._read_hello(stream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        error = ConnectionLostError(f"{self._label}: connection closed")
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)

    async def _read_hello(self, stream: Stream) -> None:
        decoder = EventStreamDecoder()
        items: list[Item] = []
        try:
            while decoder.subscription_id is None:
                data = await stream.read()
                if not data:
                    return
                items.extend(decoder.feed(data))
        except (StreamClosedError, ProtocolViolationError) as exc:
            logger.warning("%s: dropped an event stream: %s", self._label, exc)
            stream.stop_sending(0)
            return
        subscription_id = decoder.subscription_id
        handoff = EventHandoff(stream, decoder, [i for i in items if not isinstance(i, Hello)])
        future = self._waiting.pop(subscription_id, None)
        if future is not None and not future.done():
            future.set_result(handoff)
            return
        self._arrived[subscription_id] = handoff
        asyncio.get_running_loop().call_later(_UNCLAIMED_TTL, self._expire, subscription_id)

    def _expire(self, subscription_id: int) -> None:
        handoff = self._arrived.pop(subscription_id, None)
        if handoff is not None:
            logger.debug("%s: stopping unclaimed subscription %d", self._label, subscription_id)
            handoff.stream.stop_sending(0)

    def close(self) -> None:
        self._accepting.cancel()
        for task in self._tasks:
            task.cancel()
        for handoff in self._arrived.values():
            handoff.stream.stop_sending(0)
        self._arrived.clear()


class Link:
    """One pooled QUIC connection (to broker `addr`) and its lazily authenticated streams."""

    def __init__(
        self,
        dialer: Dialer,
        connection: Connection,
        label: str,
        streams: int,
        events: bool,
        addr: str,
    ) -> None:
        self.dialer = dialer
        self.connection = connection
        self.label = label
        self.addr = addr
        self._channels: list[Channel | None] = [None] * streams
        self._locks = [asyncio.Lock() for _ in range(streams)]
        self.router = EventRouter(connection, label) if events else None

    @property
    def broken(self) -> bool:
        return self.connection.closed

    def ready_channel(self, slot: int) -> Channel | None:
        """The open stream at `slot` without waiting, or None (then `channel`)."""
        current = self._channels[slot % len(self._channels)]
        return current if current is not None and not current.closed else None

    async def channel(self, slot: int) -> Channel:
        slot %= len(self._channels)
        current = self._channels[slot]
        if current is not None and not current.closed:
            return current
        async with self._locks[slot]:
            current = self._channels[slot]
            if current is None or current.closed:
                if self.broken:
                    raise ConnectionLostError(f"{self.label}: connection closed")
                current = await self.dialer.channel(self.connection, f"{self.label}/s{slot}")
                current.addr = self.addr
                self._channels[slot] = current
            return current

    def open_channels(self) -> list[Channel]:
        return [c for c in self._channels if c is not None and not c.closed]

    async def aclose(self) -> None:
        for channel in self.open_channels():
            with contextlib.suppress(Exception):
                await channel.aclose()
        if self.router is not None:
            self.router.close()
        self.connection.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await self.connection.wait_closed()


class Pool:
    """`size` links with `streams_per_conn` streams each, all created on first use;
    to any broker of the fleet, or only to `pinned` (a shard owner's address)."""

    def __init__(
        self,
        name: str,
        dialer: Dialer,
        *,
        size: int,
        streams_per_conn: int,
        events: bool = False,
        pinned: str | None = None,
    ) -> None:
        if size < 1 or streams_per_conn < 1:
            raise ValueError(f"{name} pool: size and streams per connection must be >= 1")
        self.name = name
        self.dialer = dialer
        self.size = size
        self.streams_per_conn = streams_per_conn
        self._events = events
        self.pinned = pinned
        self._links: list[Link | None] = [None] * size
        self._locks = [asyncio.Lock() for _ in range(size)]
        self._closed = False

    @property
    def width(self) -> int:
        """How many streams the pool spreads work over."""
        return self.size * self.streams_per_conn

    def adopt(self, index: int, link: Link) -> None:
        """Take a link opened elsewhere (the one `connect` authenticates first)."""
        self._links[index % self.size] = link

    def ready_link(self, index: int) -> Link | None:
        """The working connection at `index` without waiting, or None (then `link`)."""
        current = self._links[index % self.size]
        return current if current is not None and not current.broken else None

    async def link(self, index: int) -> Link:
        index %= self.size
        current = self._links[index]
        if current is not None and not current.broken:
            return current
        async with self._locks[index]:
            if self._closed:
                raise ConnectionLostError(f"{self.name} pool is closed")
            current = self._links[index]
            if current is None or current.broken:
                if current is not None:
                    logger.info("%s: replacing broken %s", self.name, current.label)
                    await current.aclose()
                connection, label, addr = await self.dialer.connect(self.pinned)
                current = Link(
                    self.dialer, connection, label, self.streams_per_conn, self._events, addr
                )
                for listener in self.dialer.on_reconnect:
                    listener(addr)
                self._links[index] = current
            return current

    async def channel(self, hint: int) -> Channel:
        """The stream for `hint`: the same hint always maps to the same stream, which
        keeps per-key order for publishes that are not awaited one by one."""
        link = await self.link(hint % self.size)
        return await link.channel((hint // self.size) % self.streams_per_conn)

    async def aclose(self) -> None:
        self._closed = True
        links = [link for link in self._links if link is not None]
        self._links = [None] * self.size
        await asyncio.gather(*(link.aclose() for link in links), return_exceptions=True)
