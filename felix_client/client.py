"""The Felix client: `await connect(...)`, then publish, subscribe, read, cache.

`connect` dials the first connection and authenticates one stream, which tells
the client what the broker advertised; every later request is checked against
that before a stream is even chosen, so a request the broker cannot serve
raises `NotSupportedByBrokerError` without sending anything. Work is spread
over three pools (publishes, requests such as cache operations and lookups,
and subscriptions), each created lazily and repaired when a connection breaks.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar, overload

from felix_transport import TransportConfig
from felix_wire.binary import PublishAckFrame
from felix_wire.features import Capabilities, Feature
from felix_wire.frame import MAX_FRAME_BYTES
from felix_wire.messages import (
    AckMode,
    CacheShards,
    CacheShardsView,
    GroupPoll,
    Message,
    OffsetForTime,
    OffsetValue,
    PublishOk,
    ShardKind,
    ShardOwner,
    ShardOwners,
    ShardOwnersView,
    StartPosition,
    StreamRead,
    StreamRecords,
    StreamShards,
    StreamShardsView,
    Subscribe,
    Subscribed,
)
from felix_wire.routing import RoutingMode, shard_for_key

from ._channel import Channel
from ._order import Lanes
from ._pool import Dialer, EventHandoff, Link, Pool
from ._session import DEFAULT_OFFER, Offer, check_supported, message_type
from .cache import Cache
from .errors import (
    ClientTimeoutError,
    CursorError,
    PayloadTooLargeError,
    ProtocolViolationError,
)
from .groups import Consumer, Group
from .subscription import (
    Event,
    Feed,
    Start,
    StartVector,
    StreamSubscription,
    Subscription,
    shard_start,
    start_position,
)

__all__ = ["Client", "ClientConfig", "ReadPage", "StreamRecord", "connect", "parse_addr"]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
TokenProvider = Callable[[], Awaitable[str] | str]


@dataclass(frozen=True)
class ClientConfig:
    """Pool sizes, limits and timeouts. Connections and streams are opened on first
    use, so unused capacity costs nothing; raise a size after measuring, not before.

    Idle connections are kept alive with QUIC PINGs every `keepalive_interval`
    seconds (None: a third of `idle_timeout`), never more than a third of the
    idle timeout both ends agreed on (the broker's `max_idle_timeout_ms` when
    shorter), so a subscription or a pooled connection with no traffic stays
    up. `keepalive=False` lets idle connections close (they are reopened on
    next use; subscriptions end).
    """

    publish_conn_pool: int = 2
    publish_streams_per_conn: int = 2
    cache_conn_pool: int = 2
    cache_streams_per_conn: int = 4
    event_conn_pool: int = 2
    # Streams used one request at a time (consumer-group calls, whose answers
    # the broker may send out of order), at most this many at once.
    exclusive_streams: int = 32
    # Bound on acked publish payload bytes in flight per stream.
    max_inflight_publish_bytes: int = 4 * 1024 * 1024
    # Acked publishes in flight per stream when the broker grants no window.
    default_publish_window: int = 64
    request_timeout: float = 10.0
    # How long a QUIC handshake may take before the broker is reported unreachable.
    connect_timeout: float = 2.0
    idle_timeout: float = 6.0
    keepalive: bool = True
    keepalive_interval: float | None = None
    # Ask the broker to acknowledge publishes after the write (with offsets).
    ack_on_commit: bool = False
    max_datagram_size: int = 1350

    def __post_init__(self) -> None:
        for name in ("request_timeout", "connect_timeout", "idle_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ClientConfig.{name} must be positive")
        interval = self.keepalive_interval
        if interval is not None and not 0 < interval < self.idle_timeout:
            raise ValueError("ClientConfig.keepalive_interval must be within (0, idle_timeout)")
        if self.exclusive_streams < 1:
            raise ValueError("ClientConfig.exclusive_streams must be >= 1")

    @property
    def ping_interval(self) -> float | None:
        """Seconds between keepalive PINGs (None: no keepalive)."""
        if not self.keepalive:
            return None
        return self.keepalive_interval or self.idle_timeout / 3


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One record of a bounded read."""

    offset: int
    payload: bytes
    timestamp_micros: int
    publisher: str | None
    shard: int = 0


@dataclass(frozen=True, slots=True)
class ReadPage:
    """Records of one shard; read that shard's next page from `next_offset`."""

    records: list[StreamRecord]
    next_offset: int
    shard: int = 0


def parse_addr(addr: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) to a pair; ValueError naming the address otherwise."""
    host, sep, port = addr.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a broker address is HOST:PORT (e.g. 127.0.0.1:5000), not {addr!r}")
    return host, int(port)


def _platform_ca_pem() -> bytes:
    """The platform trust store as PEM (verification is never switched off)."""
    context = ssl.create_default_context()
    ders = context.get_ca_certs(binary_form=True)
    if not ders:
        paths = ssl.get_default_verify_paths()
        if paths.cafile and Path(paths.cafile).exists():
            return Path(paths.cafile).read_bytes()
        raise ValueError("no CA file given and the platform trust store is empty")
    return "".join(ssl.DER_cert_to_PEM_cert(der) for der in ders).encode()


def _token_source(
    token: str | None, provider: TokenProvider | None
) -> Callable[[], Awaitable[str]]:
    if (token is None) == (provider is None):
        raise ValueError("give exactly one of token and token_provider")
    if provider is None:
        fixed = token
        assert fixed is not None

        async def constant() -> str:
            return fixed

        return constant

    async def call() -> str:
        value = provider()
        if inspect.isawaitable(value):
            value = await value
        if not isinstance(value, str):
            raise TypeError("token_provider must return a str")
        return value

    return call


def _ack_mode(ack: AckMode | str) -> AckMode:
    return AckMode(ack)


async def connect(
    addrs: str | Sequence[str],
    *,
    tenant_id: str,
    token: str | None = None,
    token_provider: TokenProvider | None = None,
    namespace: str = "default",
    server_name: str = "localhost",
    ca_file: str | Path | None = None,
    offer_alpn: bool = False,
    config: ClientConfig | None = None,
) -> Client:
    """Connect to a broker (the first of `addrs` that answers) and authenticate.

    TLS verification is always on: the broker's certificate must chain to
    `ca_file`, or to the platform trust store without one. `token_provider`
    (sync or async) is asked for a token each time a stream authenticates.
    Raises the broker's refusal (e.g. `UnauthenticatedError`) for a bad token.
    """
    seeds = [addrs] if isinstance(addrs, str) else list(addrs)
    if not seeds:
        raise ValueError("at least one broker address is needed")
    config = config or ClientConfig()
    ca_pem = Path(ca_file).read_bytes() if ca_file is not None else _platform_ca_pem()
    transport = TransportConfig.client(
        ca_pem,
        server_name=server_name,
        offer_alpn=offer_alpn,
        max_datagram_size=config.max_datagram_size,
        idle_timeout=config.idle_timeout,
        keepalive_interval=config.ping_interval,
    )
    offer = DEFAULT_OFFER
    if config.ack_on_commit:
        offer = Offer(offer.flags, offer.features | int(Feature.FEATURE_ACK_ON_COMMIT))
    dialer = Dialer(
        addrs=tuple(parse_addr(a) for a in seeds),
        transport=transport,
        tenant_id=tenant_id,
        token=_token_source(token, token_provider),
        offer=offer,
        connect_timeout=config.connect_timeout,
        # A broker that completed the handshake is there: its auth answer gets
        # the request timeout, as any answer does.
        auth_timeout=config.request_timeout,
        max_inflight_bytes=config.max_inflight_publish_bytes,
        default_window=config.default_publish_window,
    )
    client = Client(dialer, namespace=namespace, config=config)
    try:
        await client._start()
    except BaseException:
        await client.aclose()
        raise
    return client


class Client:
    """A connected client; create with `await felix_client.connect(...)`."""

    def __init__(self, dialer: Dialer, *, namespace: str, config: ClientConfig) -> None:
        self.tenant_id = dialer.tenant_id
        self.namespace = namespace
        self.config = config
        self._dialer = dialer
        self._publish = Pool(
            "publish",
            dialer,
            size=config.publish_conn_pool,
            streams_per_conn=config.publish_streams_per_conn,
        )
        self._requests = Pool(
            "cache",
            dialer,
            size=config.cache_conn_pool,
            streams_per_conn=config.cache_streams_per_conn,
        )
        self._events = Pool(
            "event", dialer, size=config.event_conn_pool, streams_per_conn=1, events=True
        )
        self._capabilities: Capabilities | None = None
        self._turn = 0
        self._shards: dict[tuple[str, str], tuple[int, RoutingMode]] = {}
        self._lanes = Lanes()
        # Streams that carry one request at a time (group calls), idle ones kept.
        self._exclusive_slots = asyncio.Semaphore(config.exclusive_streams)
        self._exclusive_idle: list[Channel] = []
        self._closed = False

    async def _start(self) -> None:
        # The first request link doubles as the negotiation probe: its first stream
        # tells the client what the broker advertised.
        connection, label = await self._dialer.connect()
        link = Link(self._dialer, connection, label, self._requests.streams_per_conn, events=False)
        self._requests.adopt(0, link)
        channel = await link.channel(0)
        self._capabilities = channel.capabilities

    # -- life cycle ------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """What the broker advertised (frame flags and features)."""
        assert self._capabilities is not None
        return self._capabilities

    def supports(self, feature: Feature) -> bool:
        return self.capabilities.has_feature(feature)

    async def aclose(self) -> None:
        """Close every pooled connection; pending requests fail with ConnectionLostError."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(self._publish.aclose(), self._requests.aclose(), self._events.aclose())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- plumbing --------------------------------------------------------------------

    def _ns(self, namespace: str | None) -> str:
        return self.namespace if namespace is None else namespace

    def _require(self, message: Message) -> None:
        """Raise NotSupportedByBrokerError before any stream is chosen."""
        check_supported(message, self.capabilities)

    def _next_turn(self) -> int:
        self._turn += 1
        return self._turn

    async def _call(
        self,
        build: Callable[[int], Message],
        answer_type: type[M],
        *,
        hint: int | None = None,
        timeout: float | None = None,
    ) -> M:
        """One request on the request pool, its answer checked to be `answer_type`."""
        self._require(build(0))
        channel = await self._request_channel(hint)
        answer = await channel.call(build, timeout or self.config.request_timeout)
        if not isinstance(answer, answer_type):
            raise ProtocolViolationError(
                f"{message_type(build(0))} answered with {type(answer).__name__}"
            )
        return answer

    async def _exclusive_call(
        self,
        build: Callable[[int], Message],
        answer_type: type[M],
        *,
        timeout: float | None = None,
    ) -> M:
        """One request on a stream of its own while it is in flight (for requests
        the broker answers out of order, refusing with an `error` that names no
        request). Idle streams are reused; one whose request was given up on is
        retired, since its late answer would meet the next request."""
        self._require(build(0))
        async with self._exclusive_slots:
            channel = None
            while self._exclusive_idle and channel is None:
                candidate = self._exclusive_idle.pop()
                channel = None if candidate.closed else candidate
            if channel is None:
                link = await self._requests.link(self._next_turn())
                channel = await self._dialer.channel(
                    link.connection, f"{link.label}/x{self._next_turn()}"
                )
            try:
                answer = await channel.call(build, timeout or self.config.request_timeout)
            except BaseException as exc:
                if isinstance(exc, ClientTimeoutError | asyncio.CancelledError):
                    channel.abandon()
                elif not channel.closed:
                    self._exclusive_idle.append(channel)
                raise
            self._exclusive_idle.append(channel)
        if not isinstance(answer, answer_type):
            raise ProtocolViolationError(
                f"{message_type(build(0))} answered with {type(answer).__name__}"
            )
        return answer

    async def _request_channel(self, hint: int | None) -> Channel:
        return await self._requests.channel(self._next_turn() if hint is None else hint)

    # -- publishing ------------------------------------------------------------------

    async def publish(
        self,
        stream: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        ack: AckMode | str = AckMode.PER_MESSAGE,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> int | None:
        """Publish one record. Returns its offset when the broker reports one (an
        ack after the write), else None; raises the broker's refusal when acked."""
        return await self._send_publish(
            stream,
            [payload],
            key=key,
            ack=_ack_mode(ack),
            namespace=namespace,
            timeout=timeout,
            single=True,
        )

    async def publish_batch(
        self,
        stream: str,
        payloads: Sequence[bytes],
        *,
        key: bytes | None = None,
        ack: AckMode | str = AckMode.PER_BATCH,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> int | None:
        """Publish records as one batch (one shard, one answer). Returns the first
        record's offset when the broker reports one (record i is at offset + i)."""
        if not payloads:
            raise ValueError("a batch needs at least one payload")
        return await self._send_publish(
            stream,
            list(payloads),
            key=key,
            ack=_ack_mode(ack),
            namespace=namespace,
            timeout=timeout,
            single=False,
        )

    async def _send_publish(
        self,
        stream: str,
        payloads: list[bytes],
        *,
        key: bytes | None,
        ack: AckMode,
        namespace: str | None,
        timeout: float | None,
        single: bool,
    ) -> int | None:
        ns = self._ns(namespace)
        size = sum(len(p) for p in payloads)
        if size > MAX_FRAME_BYTES:
            raise PayloadTooLargeError("a publish payload", size, MAX_FRAME_BYTES)
        # One ordered lane per stream and key (the key None is the stream's own
        # lane): its publishes are written in call order, on one pooled stream,
        # so the broker sees them in that order (per-key order, §10).
        ticket = self._lanes.ticket((ns, stream, key))
        await ticket.turn()
        try:
            hint = zlib.crc32(b"%s\0%s\0%s" % (ns.encode(), stream.encode(), key or b""))
            channel = await self._publish.channel(hint)
        except BaseException:
            ticket.leave()
            raise
        answer = await channel.publish(
            namespace=ns,
            stream=stream,
            payloads=payloads,
            key=key,
            ack=ack,
            single=single,
            timeout=timeout or self.config.request_timeout,
            on_sent=ticket.leave,
        )
        if answer is None:
            return None
        if isinstance(answer, PublishAckFrame | PublishOk):
            return answer.offset
        raise ProtocolViolationError(f"publish answered with {type(answer).__name__}")

    # -- subscribing -----------------------------------------------------------------

    @overload
    def subscribe(
        self,
        stream: str,
        *,
        start: Start = "latest",
        shard: int,
        namespace: str | None = None,
        queue_capacity: int | None = None,
    ) -> Subscription: ...

    @overload
    def subscribe(
        self,
        stream: str,
        *,
        start: StartVector = "latest",
        shard: None = None,
        namespace: str | None = None,
        queue_capacity: int | None = None,
    ) -> StreamSubscription: ...

    def subscribe(
        self,
        stream: str,
        *,
        start: StartVector = "latest",
        shard: int | None = None,
        namespace: str | None = None,
        queue_capacity: int | None = None,
    ) -> Subscription | StreamSubscription:
        """A subscription to `stream` from `start` ("latest", "earliest" or an
        offset). Await it, use it with `async with`, or iterate.

        Without `shard`, every shard of the stream (one subscription per shard,
        per-shard order; `start` may be a vector of positions, one per shard, as
        `positions` returns). With `shard`, that shard only (a `Subscription`)."""
        ns = self._ns(namespace)
        if shard is not None:
            if isinstance(start, Mapping):
                raise ValueError("a start vector needs shard=None (every shard)")
            return self._shard_subscription(ns, stream, shard, start, queue_capacity)
        self._require(
            Subscribe(
                tenant_id=self.tenant_id,
                namespace=ns,
                stream=stream,
                queue_capacity=queue_capacity,
            )
        )
        for value in start.values() if isinstance(start, Mapping) else [start]:
            start_position(value)  # a bad start fails now, not on first read

        async def open_parts() -> dict[int, Feed[Event]]:
            count = await self._shard_count(ns, stream)
            if isinstance(start, Mapping) and any(s >= count for s in start):
                raise ValueError(f"the start vector names a shard {stream} does not have")
            return {
                index: self._shard_subscription(
                    ns, stream, index, shard_start(start, index), queue_capacity
                )
                for index in range(count)
            }

        def reopen(index: int, position: int | None) -> Feed[Event]:
            again: Start = "latest" if position is None else position
            return self._shard_subscription(ns, stream, index, again, queue_capacity)

        return StreamSubscription(stream, open_parts, reopen)

    async def _shard_count(self, ns: str, stream: str) -> int:
        """The stream's shard count for reading every shard: 1 for a broker that
        cannot say (it has then one shard as far as this client can tell) and for
        an unknown stream (whose shard 0 the broker refuses with its reason)."""
        if not self.supports(Feature.FEATURE_STREAM_SHARDS):
            return 1
        shards, _mode = await self._stream_layout(ns, stream)
        return max(1, shards)

    def _shard_subscription(
        self, ns: str, stream: str, shard: int, start: Start, queue_capacity: int | None
    ) -> Subscription:
        probe = Subscribe(
            tenant_id=self.tenant_id,
            namespace=ns,
            stream=stream,
            shard=shard,
            queue_capacity=queue_capacity,
        )
        self._require(probe)

        async def opener(position: StartPosition) -> tuple[Subscribed, EventHandoff]:
            def build(_request_id: int) -> Subscribe:
                return Subscribe(
                    tenant_id=self.tenant_id,
                    namespace=ns,
                    stream=stream,
                    start=position,
                    shard=shard,
                    queue_capacity=queue_capacity,
                )

            return await self._open_event_stream(build, Subscribed)

        return Subscription(opener, stream=stream, shard=shard, start=start)

    async def _open_event_stream(
        self, build: Callable[[int], Message], started: type[M]
    ) -> tuple[M, EventHandoff]:
        """Send a subscribe-like request on an event link and take the event stream
        the broker opens for it on the same connection."""
        self._require(build(0))
        link = await self._events.link(self._next_turn())
        channel = await link.channel(0)
        timeout = self.config.request_timeout
        answer = await channel.call(build, timeout)
        if not isinstance(answer, started):
            raise ProtocolViolationError(
                f"expected {started.__name__}, got {type(answer).__name__}"
            )
        subscription_id = getattr(answer, "subscription_id")  # noqa: B009 - both answers carry it
        assert link.router is not None
        handoff = await link.router.take(int(subscription_id), timeout)
        return answer, handoff

    # -- bounded reads and lookups ---------------------------------------------------

    def stream_read(
        self,
        stream: str,
        *,
        start: int | Mapping[int, int],
        end: int | None = None,
        shard: int | None = None,
        max_records: int | None = None,
        max_bytes: int | None = None,
        namespace: str | None = None,
    ) -> AsyncIterator[ReadPage]:
        """Pages of records from `start` up to `end` (exclusive; the committed tail
        when None), as an async iterator; ends at `end`, or at the first empty page
        when reading to the tail. Needs FEATURE_STREAM_READ (checked now).

        Without `shard`, every shard in turn (each page names its shard; `start`
        is then the first offset on every shard, or a vector of one per shard; a
        shard whose tail is below `start` has nothing to read and is skipped)."""
        ns = self._ns(namespace)

        def build_at(index: int, offset: int) -> Callable[[int], StreamRead]:
            def build(request_id: int) -> StreamRead:
                return StreamRead(
                    tenant_id=self.tenant_id,
                    namespace=ns,
                    stream=stream,
                    shard=index,
                    from_=offset,
                    end=end,
                    max_records=max_records,
                    max_bytes=max_bytes,
                    request_id=request_id,
                )

            return build

        if shard is not None and isinstance(start, Mapping):
            raise ValueError("a start vector needs shard=None (every shard)")
        self._require(build_at(shard or 0, 0)(0))
        return self._read_shards(ns, stream, build_at, start, end, shard)

    async def _read_shards(
        self,
        ns: str,
        stream: str,
        build_at: Callable[[int, int], Callable[[int], StreamRead]],
        start: int | Mapping[int, int],
        end: int | None,
        shard: int | None,
    ) -> AsyncIterator[ReadPage]:
        if shard is not None:
            assert isinstance(start, int)
            async for page in self._read_pages(build_at, shard, start, end):
                yield page
            return
        for index in range(await self._shard_count(ns, stream)):
            first = start.get(index, 0) if isinstance(start, Mapping) else start
            try:
                async for page in self._read_pages(build_at, index, first, end):
                    yield page
            except CursorError as exc:
                if exc.reason != "in_future":
                    raise

    async def _read_pages(
        self,
        build_at: Callable[[int, int], Callable[[int], StreamRead]],
        shard: int,
        start: int,
        end: int | None,
    ) -> AsyncIterator[ReadPage]:
        offset = start
        while end is None or offset < end:
            page = await self._call(build_at(shard, offset), StreamRecords)
            records = [
                StreamRecord(r.offset, r.payload, r.timestamp_micros, r.publisher, shard)
                for r in page.records
            ]
            yield ReadPage(records, page.next_offset, shard)
            if not records and (end is None or page.next_offset == offset):
                return  # nothing more is committed yet
            offset = page.next_offset

    async def offset_for_time(
        self,
        stream: str,
        at: datetime | int,
        *,
        shard: int = 0,
        namespace: str | None = None,
    ) -> int | None:
        """The first offset on the shard appended at or after `at` (a datetime, or
        microseconds since the epoch); None when nothing that recent is committed."""
        micros = at if isinstance(at, int) else int(at.timestamp() * 1_000_000)
        ns = self._ns(namespace)
        answer = await self._call(
            lambda rid: OffsetForTime(
                tenant_id=self.tenant_id,
                namespace=ns,
                stream=stream,
                shard=shard,
                at_micros=micros,
                request_id=rid,
            ),
            OffsetValue,
        )
        return answer.offset

    async def stream_shards(self, stream: str, *, namespace: str | None = None) -> int:
        """How many shards `stream` has (0: the broker knows no such stream)."""
        shards, _mode = await self._stream_layout(self._ns(namespace), stream)
        return shards

    async def _stream_layout(self, ns: str, stream: str) -> tuple[int, RoutingMode]:
        answer = await self._call(
            lambda rid: StreamShards(
                tenant_id=self.tenant_id, namespace=ns, stream=stream, request_id=rid
            ),
            StreamShardsView,
        )
        mode: RoutingMode = "jump_hash" if answer.routing == "jump_hash" else "modulo"
        self._shards[(ns, stream)] = (answer.shards, mode)
        return answer.shards, mode

    async def shard_for_key(self, stream: str, key: bytes, *, namespace: str | None = None) -> int:
        """The shard a publish with `key` lands on, by the stream's own routing."""
        ns = self._ns(namespace)
        layout = self._shards.get((ns, stream)) or await self._stream_layout(ns, stream)
        return shard_for_key(key, layout[0], layout[1])

    async def cache_shards(self, cache: str, *, namespace: str | None = None) -> int:
        """How many shards `cache` has (0: the broker knows no such cache)."""
        ns = self._ns(namespace)
        answer = await self._call(
            lambda rid: CacheShards(
                tenant_id=self.tenant_id, namespace=ns, cache=cache, request_id=rid
            ),
            CacheShardsView,
        )
        return answer.shards

    async def shard_owners(
        self, name: str, *, kind: ShardKind | str = ShardKind.STREAM, namespace: str | None = None
    ) -> list[ShardOwner]:
        """Which broker owns each shard of a stream or cache."""
        ns = self._ns(namespace)
        answer = await self._call(
            lambda rid: ShardOwners(
                tenant_id=self.tenant_id,
                namespace=ns,
                name=name,
                kind=ShardKind(kind),
                request_id=rid,
            ),
            ShardOwnersView,
        )
        return list(answer.owners)

    # -- cache -----------------------------------------------------------------------

    def cache(self, name: str, *, namespace: str | None = None) -> Cache:
        """A handle on one cache: get, put, delete, conditional writes, watches, counters."""
        return Cache(self, name, self._ns(namespace))

    # -- consumer groups ---------------------------------------------------------------

    def group(self, stream: str, name: str, *, namespace: str | None = None) -> Group:
        """A handle on consumer group `name` of `stream`: poll, ack, nack, extend,
        dead letters, seek, describe, delete (each call names its shard)."""
        return Group(self, stream, name, self._ns(namespace))

    def consumer(
        self,
        stream: str,
        *,
        group: str,
        consumer: str | None = None,
        max_in_flight: int = 256,
        batch: int = 64,
        wait: float = 1.0,
        visibility: float | None = 30.0,
        shards: Sequence[int] | None = None,
        namespace: str | None = None,
    ) -> Consumer:
        """A consumer of every shard of `stream` (or of `shards`) for `group`:
        `async with client.consumer("jobs", group="fulfilment") as consumer:
        async for record in consumer: ...; await record.ack()`. See `Consumer`."""
        self._require(
            GroupPoll(
                tenant_id=self.tenant_id,
                namespace=self._ns(namespace),
                stream=stream,
                shard=0,
                group=group,
                max_records=1,
                request_id=0,
            )
        )
        return Consumer(
            self,
            self.group(stream, group, namespace=namespace),
            consumer=consumer,
            max_in_flight=max_in_flight,
            batch=batch,
            wait=wait,
            visibility=visibility,
            shards=None if shards is None else list(shards),
        )
