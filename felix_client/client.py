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
import itertools
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
    ShardInspection,
    ShardKind,
    ShardMoved,
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
    SubscriptionCursor,
    SubscriptionFilter,
    SubscriptionsList,
    Topology,
    TopologyView,
)
from felix_wire.routing import RoutingMode, shard_for_key

from . import guarded
from . import inspect as inspection
from ._channel import Channel
from ._fleet import ENTRY, MAX_HOPS, Attempt, Fleet, Owner, ShardRef
from ._order import Lanes
from ._pool import Dialer, EventHandoff, Link, Pool, parse_addr
from ._session import DEFAULT_OFFER, Offer, check_supported, message_type
from .cache import Cache
from .errors import (
    BrokerError,
    BrokerUnreachableError,
    ClientTimeoutError,
    ConnectionLostError,
    CursorError,
    DrainingError,
    NotLeaderError,
    PayloadTooLargeError,
    ProtocolViolationError,
    RetryClass,
    ShardUnavailableError,
)
from .groups import Consumer, Group
from .guarded import StateEntry
from .inspect import SubscriptionsPage
from .producer import MAX_IN_FLIGHT, Producer
from .retry import backoff_delay, should_retry
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

# Requests that change nothing: a lost answer may be resent (to another broker).
_READS = frozenset(
    {
        "topology",
        "stream_shards",
        "cache_shards",
        "shard_owners",
        "stream_read",
        "offset_for_time",
        "cache_get",
        "counter_get",
        "group_describe",
        "group_dead_letters",
        "subscribe",
        "cache_watch",
    }
)
# How long a feed whose shard moved keeps trying to reopen.
_MOVE_RESUME_DEADLINE = 30.0


class _BackToEntry(Exception):
    """A publish sent straight to a hinted owner was refused with nothing applied."""


def _redirect_owner(error: NotLeaderError) -> Owner | None:
    """The owner a `not_leader` names (None for the error code, which names none)."""
    node_id = error.detail.get("node_id")
    addr = error.detail.get("addr")
    generation = error.detail.get("generation")
    if not isinstance(node_id, str) or not isinstance(generation, int):
        return None
    return Owner(node_id, addr if isinstance(addr, str) and addr else None, generation)


def _shard_ref(message: Message) -> ShardRef | None:
    """The shard a request is about, from its fields (None: not about one shard)."""
    ns = getattr(message, "namespace", None)
    if not isinstance(ns, str):
        return None
    stream = getattr(message, "stream", None)
    shard = getattr(message, "shard", None)
    if isinstance(stream, str):
        return ("stream", ns, stream, shard if isinstance(shard, int) else 0)
    cache = getattr(message, "cache", None)
    if not isinstance(cache, str):
        return None
    if isinstance(shard, int):
        return ("cache", ns, cache, shard)
    key = getattr(message, "key", None)
    return ("cache", ns, cache, f"key:{key}") if isinstance(key, str) else None


M = TypeVar("M", bound=Message)
T = TypeVar("T")
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
    # 1 x 1 costs 10-25% less client and broker CPU per cache op at 32 in flight
    # (docs/performance.md), but with one connection a silently dropped link stalls
    # every request until its timeout, where a second link reconnects at once.
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
    seeds = [a.strip() for a in ([addrs] if isinstance(addrs, str) else list(addrs))]
    if not seeds:
        raise ValueError("at least one broker address is needed")
    for seed in seeds:
        parse_addr(seed)  # a bad address fails now, naming it
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
        fleet=Fleet(seeds=tuple(dict.fromkeys(seeds))),
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
        self._exclusive_idle: dict[str | None, list[Channel]] = {}
        # The fleet: seeds, brokers `topology` named, per-shard owners.
        self._fleet = dialer.fleet
        self._owner_pools: dict[str, tuple[Pool, Pool, Pool]] = {}
        # Per publish lane: the route its publishes in flight took, and how many.
        self._lane_routes: dict[tuple[str, str, bytes | None], tuple[str | None, int]] = {}
        self._topology_task: asyncio.Task[None] | None = None
        self._topology_again = False
        dialer.on_reconnect.append(self._reconnected)
        self._closed = False

    async def _start(self) -> None:
        # The first request link doubles as the negotiation probe: its first stream
        # tells the client what the broker advertised.
        connection, label, addr = await self._dialer.connect()
        link = Link(self._dialer, connection, label, self._requests.streams_per_conn, False, addr)
        self._requests.adopt(0, link)
        channel = await link.channel(0)
        self._capabilities = channel.capabilities
        if self.supports(Feature.FEATURE_TOPOLOGY):
            await self.refresh_topology()

    # -- the fleet -------------------------------------------------------------------

    @property
    def brokers(self) -> list[str]:
        """Every broker address the client may dial: the seeds, then the brokers
        `topology` named (additive: a seed is never dropped)."""
        return self._fleet.addrs

    async def refresh_topology(self) -> list[str]:
        """Ask `topology` now (a broker that advertised FEATURE_TOPOLOGY; others
        raise NotSupportedByBrokerError) and add the brokers it lists; returns
        every address known afterwards. Asked on connect and after every
        reconnect too."""
        answer = await self._call(lambda _rid: Topology(), TopologyView)
        self._fleet.learn(list(answer.brokers))
        return self._fleet.addrs

    def _reconnected(self, addr: str) -> None:
        """A pooled connection was opened (a reconnect among them): ask `topology`
        again, one request at a time."""
        if self._closed or self._capabilities is None:
            return
        if not self.supports(Feature.FEATURE_TOPOLOGY):
            return
        if self._topology_task is not None and not self._topology_task.done():
            # One in flight may have been sent before this connection: ask again
            # once it is done.
            self._topology_again = True
            return
        self._topology_task = asyncio.get_running_loop().create_task(
            self._refresh_quietly(), name="felix-topology"
        )

    async def _refresh_quietly(self) -> None:
        for _ in range(3):  # bounded: a fleet that keeps reconnecting asks again later
            self._topology_again = False
            try:
                await self.refresh_topology()
            except BrokerError as exc:
                logger.info("topology after a reconnect was refused: %s", exc)
            except (ConnectionLostError, ClientTimeoutError) as exc:
                # It met another connection that broke too: ask again (the pool
                # replaces that one now).
                logger.info("topology after a reconnect failed: %s", exc)
                self._topology_again = True
            if not self._topology_again:
                return

    def _pools(self, target: str | None) -> tuple[Pool, Pool, Pool]:
        """(publish, requests, events) pools for `target`: the entry pools for
        ENTRY, else one connection per concern pinned to that broker (bounded by
        the brokers the client heard of; at most 64 kept, the oldest closed)."""
        if target is ENTRY:
            return self._publish, self._requests, self._events
        pools = self._owner_pools.pop(target, None)
        if pools is None:
            config = self.config
            pools = (
                Pool(
                    "publish@" + target,
                    self._dialer,
                    size=1,
                    streams_per_conn=config.publish_streams_per_conn,
                    pinned=target,
                ),
                Pool(
                    "cache@" + target,
                    self._dialer,
                    size=1,
                    streams_per_conn=config.cache_streams_per_conn,
                    pinned=target,
                ),
                Pool(
                    "event@" + target,
                    self._dialer,
                    size=1,
                    streams_per_conn=1,
                    events=True,
                    pinned=target,
                ),
            )
            while len(self._owner_pools) >= 64:
                oldest = next(iter(self._owner_pools))
                old = self._owner_pools.pop(oldest)
                for pool in old:
                    self._closing(pool.aclose())
        self._owner_pools[target] = pools
        return pools

    def _closing(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _follow(
        self,
        ref: ShardRef | None,
        run: Callable[[str | None, Attempt], Awaitable[T]],
        *,
        resend_on_loss: bool,
    ) -> T:
        """Run one request where its shard lives: at the owner held for `ref`
        if one is known, else through the entry broker; follow `not_leader` (at
        most MAX_HOPS hops, never the same broker twice, a redirect older than
        the generation held ignored); a redirect target that answers
        `shard_unavailable` or `draining`, or cannot be reached, sends the
        request back to the entry broker once. A lost answer is resent only
        when `resend_on_loss` (a read; once more through the entry, i.e. to
        another broker when the entry's broker went away) or nothing was sent
        (unreachable)."""
        owner = self._fleet.owner(ref) if ref is not None else None
        attempt = Attempt(self._fleet, ref, owner.addr if owner is not None else ENTRY)
        # What sent the request back to the entry: when the entry then names a
        # broker already tried, that refusal (not the redirect) is the answer.
        bounced: BaseException | None = None
        entry_resent = False
        for _ in range(2 * MAX_HOPS + 3):
            target = attempt.target
            try:
                return await run(target, attempt)
            except NotLeaderError as exc:
                redirect = _redirect_owner(exc)
                if redirect is None and ref is not None:
                    redirect = await self._lookup_owner(ref)
                if redirect is None or attempt.redirected(redirect) is False:
                    if bounced is not None:
                        raise bounced from exc
                    raise
                logger.debug("redirected to %s (%s)", redirect.addr, redirect.node_id)
            except (ShardUnavailableError, DrainingError) as exc:
                if exc.retry not in (RetryClass.RETRY, RetryClass.RETRY_AFTER, None):
                    raise
                if attempt.refused_here() is False:
                    raise
                bounced = exc
            except BrokerUnreachableError as exc:
                if attempt.refused_here() is False:
                    raise
                bounced = exc
            except (ConnectionLostError, ClientTimeoutError) as exc:
                if not resend_on_loss:
                    raise
                if target is ENTRY and not entry_resent:
                    # A read whose entry connection failed: once more through the
                    # entry pools, whose replacement connection dials the next
                    # broker of the fleet that answers.
                    entry_resent = True
                    continue
                if attempt.refused_here() is False:
                    raise
                bounced = exc
        raise NotLeaderError(f"no owner found within {MAX_HOPS} redirects")

    async def _lookup_owner(self, ref: ShardRef) -> Owner | None:
        """The owner of `ref` from `shard_owners`, for a `not_leader` that named no
        address (an error code from a broker that could not send the redirect)."""
        kind, ns, name, shard = ref
        if not isinstance(shard, int) or not self.supports(Feature.FEATURE_SHARD_OWNERS):
            return None
        try:
            owners = await self.shard_owners(name, kind=kind, namespace=ns)
        except (BrokerError, ConnectionLostError, ClientTimeoutError):
            return None
        for entry in owners:
            if entry.shard == shard and entry.node_id and entry.addr:
                return Owner(entry.node_id, entry.addr, entry.generation or 0)
        return None

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
        if self._topology_task is not None:
            self._topology_task.cancel()
            await asyncio.gather(self._topology_task, return_exceptions=True)
        owned = [pool for pools in self._owner_pools.values() for pool in pools]
        self._owner_pools.clear()
        await asyncio.gather(
            self._publish.aclose(),
            self._requests.aclose(),
            self._events.aclose(),
            *(pool.aclose() for pool in owned),
        )

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
        """One request on the request pool, its answer checked to be `answer_type`,
        sent where its shard lives (see `_follow`)."""
        probe = build(0)
        self._require(probe)
        turn = self._next_turn() if hint is None else hint

        async def run(target: str | None, attempt: Attempt) -> Message:
            _pub, requests, _ev = self._pools(target)
            # The common case (connection and stream already open) without an
            # await each: a request then costs one suspension, its answer's.
            index = turn % requests.size
            link = requests.ready_link(index) or await requests.link(index)
            attempt.at(link.addr)
            slot = (turn // requests.size) % requests.streams_per_conn
            channel = link.ready_channel(slot) or await link.channel(slot)
            return await channel.call(build, timeout or self.config.request_timeout)

        answer = await self._follow(
            _shard_ref(probe), run, resend_on_loss=message_type(probe) in _READS
        )
        if not isinstance(answer, answer_type):
            raise ProtocolViolationError(
                f"{message_type(probe)} answered with {type(answer).__name__}"
            )
        return answer

    async def _exclusive_call(
        self,
        build: Callable[[int], Message],
        answer_type: type[M],
        *,
        timeout: float | None = None,
        ref: ShardRef | None = None,
    ) -> M:
        """One request on a stream of its own while it is in flight (for requests
        the broker answers out of order, refusing with an `error` that names no
        request), sent where its shard lives (see `_follow`): `ref` when given (a
        request routed by a key), else the shard its fields name. Idle streams are
        reused; one whose request was given up on is retired, since its late
        answer would meet the next request."""
        answer = await self._exclusive_raw(build, timeout=timeout, ref=ref)
        if not isinstance(answer, answer_type):
            raise ProtocolViolationError(
                f"{message_type(build(0))} answered with {type(answer).__name__}"
            )
        return answer

    def _owner_target(self, ref: ShardRef) -> str | None:
        """Where a request about shard `ref` goes first: the owner held for it (see
        `_follow`), else the entry broker (ENTRY)."""
        owner = self._fleet.owner(ref)
        return owner.addr if owner is not None else ENTRY

    async def _side_channel(self, target: str | None, name: str) -> Channel:
        """A stream of the caller's own on the request connection to `target`
        (ENTRY: the entry broker); the caller closes it."""
        _pub, requests, _ev = self._pools(target)
        link = await requests.link(self._next_turn())
        channel = await self._dialer.channel(
            link.connection, f"{link.label}/{name}{self._next_turn()}"
        )
        channel.addr = link.addr
        return channel

    async def _exclusive_raw(
        self,
        build: Callable[[int], Message],
        *,
        timeout: float | None = None,
        ref: ShardRef | None = None,
    ) -> Message:
        """`_exclusive_call` for a request with several kinds of answer."""
        probe = build(0)
        self._require(probe)
        if ref is None:
            ref = _shard_ref(probe)

        async def run(target: str | None, attempt: Attempt) -> Message:
            idle = self._exclusive_idle.setdefault(target, [])
            channel = None
            while idle and channel is None:
                candidate = idle.pop()
                channel = None if candidate.closed else candidate
            if channel is None:
                _pub, requests, _ev = self._pools(target)
                link = await requests.link(self._next_turn())
                channel = await self._dialer.channel(
                    link.connection, f"{link.label}/x{self._next_turn()}"
                )
                channel.addr = link.addr
            attempt.at(channel.addr)
            try:
                answer = await channel.call(build, timeout or self.config.request_timeout)
            except BaseException as exc:
                if isinstance(exc, ClientTimeoutError | asyncio.CancelledError):
                    channel.abandon()
                elif not channel.closed:
                    idle.append(channel)
                raise
            idle.append(channel)
            return answer

        async with self._exclusive_slots:
            answer = await self._follow(ref, run, resend_on_loss=message_type(probe) in _READS)
        return answer

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
        args = (ns, stream, payloads, key, ack, timeout or self.config.request_timeout, single)
        try:
            return await self._publish_once(*args, direct=True)
        except _BackToEntry as back:
            # The owner named by a hint said "nothing applied, not here": the hint
            # is forgotten and the publish goes through the entry broker (forwarded).
            logger.debug("publish to %s refused (%s); resending via the entry", stream, back)
            return await self._publish_once(*args, direct=False)

    async def _publish_once(
        self,
        ns: str,
        stream: str,
        payloads: list[bytes],
        key: bytes | None,
        ack: AckMode,
        timeout: float,
        single: bool,
        *,
        direct: bool,
    ) -> int | None:
        # One ordered lane per stream and key (the key None is the stream's own
        # lane): its publishes are written in call order, on one pooled stream,
        # so the broker sees them in that order (per-key order, §10).
        lane = (ns, stream, key)
        ticket = self._lanes.ticket(lane)
        await ticket.turn()
        target: str | None = ENTRY
        ref: ShardRef | None = None
        try:
            ref = await self._publish_ref(ns, stream, key)
            if direct:
                target = self._publish_route(lane, ref)
            hint = zlib.crc32(b"%s\0%s\0%s" % (ns.encode(), stream.encode(), key or b""))
            try:
                channel = await self._pools(target)[0].channel(hint)
            except ConnectionLostError:
                if target is ENTRY or ref is None:
                    raise
                # The cached owner cannot be reached (nothing was sent): forward.
                self._fleet.forget(ref)
                target = ENTRY
                channel = await self._publish.channel(hint)
        except BaseException:
            ticket.leave()
            raise
        self._lane_enter(lane, target)
        try:
            answer = await channel.publish(
                namespace=ns,
                stream=stream,
                payloads=payloads,
                key=key,
                ack=ack,
                single=single,
                timeout=timeout,
                on_sent=ticket.leave,
            )
        except BrokerError as exc:
            if target is not ENTRY and ref is not None:
                self._fleet.forget(ref)
                if exc.retry in (RetryClass.RETRY, RetryClass.REDIRECT):
                    raise _BackToEntry(str(exc)) from exc
            raise
        except (ConnectionLostError, ClientTimeoutError):
            # Sent or not, the outcome is unknown: never resent; the hint goes.
            if target is not ENTRY and ref is not None:
                self._fleet.forget(ref)
            raise
        finally:
            self._lane_exit(lane)
        if answer is None:
            return None
        if isinstance(answer, PublishAckFrame):
            if answer.node_id and ref is not None:
                # Forwarded: the ack names the owner; the next batch goes straight there.
                owner = Owner(answer.node_id, answer.addr or None, answer.generation or 0)
                self._fleet.note(ref, owner)
            return answer.offset
        if isinstance(answer, PublishOk):
            return answer.offset
        raise ProtocolViolationError(f"publish answered with {type(answer).__name__}")

    async def _publish_ref(self, ns: str, stream: str, key: bytes | None) -> ShardRef | None:
        """The shard a publish lands on, when the client can tell: shard 0 without
        a key; by the stream's routing with one, once its width is known (asked
        once per stream, and only of a fleet member: a standalone broker never
        forwards, so there is no owner to learn)."""
        if key is None:
            return ("stream", ns, stream, 0)
        layout = self._shards.get((ns, stream))
        if layout is None:
            if not (
                self.supports(Feature.FEATURE_TOPOLOGY)
                and self.supports(Feature.FEATURE_STREAM_SHARDS)
            ):
                return None
            try:
                layout = await self._stream_layout(ns, stream)
            except (BrokerError, ConnectionLostError, ClientTimeoutError):
                return None
        if layout[0] <= 0:
            return None
        return ("stream", ns, stream, shard_for_key(key, layout[0], layout[1]))

    def _publish_route(
        self, lane: tuple[str, str, bytes | None], ref: ShardRef | None
    ) -> str | None:
        """Where a lane's next publish goes: where its publishes in flight went
        (so they stay in order on one stream), else the owner the last forwarded
        ack named, else the entry broker."""
        held = self._lane_routes.get(lane)
        if held is not None:
            return held[0]
        owner = self._fleet.owner(ref) if ref is not None else None
        return owner.addr if owner is not None else ENTRY

    def _lane_enter(self, lane: tuple[str, str, bytes | None], target: str | None) -> None:
        held = self._lane_routes.get(lane)
        count = 0 if held is None else held[1]
        self._lane_routes[lane] = (target, count + 1)

    def _lane_exit(self, lane: tuple[str, str, bytes | None]) -> None:
        held = self._lane_routes.get(lane)
        if held is None:
            return
        if held[1] <= 1:
            del self._lane_routes[lane]
        else:
            self._lane_routes[lane] = (held[0], held[1] - 1)

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

            return await self._open_event_stream(build, Subscribed, resuming=sub.resumes > 0)

        sub = Subscription(opener, stream=stream, shard=shard, start=start)
        sub.on_moved = self._moved_hook(_shard_ref(probe))
        return sub

    def _moved_hook(self, ref: ShardRef | None) -> Callable[[ShardMoved], None]:
        """What a feed calls when its shard moved: the frame's node_id/addr become
        the shard's owner hint (its generation checked), so the feed reopens there
        first; without a named owner, the shard is found again via the entry."""

        def moved(frame: ShardMoved) -> None:
            if ref is None:
                return
            if frame.node_id:
                self._fleet.note(ref, Owner(frame.node_id, frame.addr, frame.generation))
            else:
                self._fleet.forget(ref)

        return moved

    async def _open_event_stream(
        self, build: Callable[[int], Message], started: type[M], *, resuming: bool = False
    ) -> tuple[M, EventHandoff]:
        """Send a subscribe-like request on an event link and take the event stream
        the broker opens for it on the same connection, where the shard lives (see
        `_follow`). A feed `resuming` after its shard moved retries what says
        "nothing applied" (the shard is between owners) with backoff for up to
        `_MOVE_RESUME_DEADLINE` seconds."""
        probe = build(0)
        self._require(probe)
        ref = _shard_ref(probe)
        timeout = self.config.request_timeout

        async def run(target: str | None, attempt: Attempt) -> tuple[M, EventHandoff]:
            _pub, _req, events = self._pools(target)
            link = await events.link(self._next_turn())
            attempt.at(link.addr)
            channel = await link.channel(0)
            answer = await channel.call(build, timeout)
            if not isinstance(answer, started):
                raise ProtocolViolationError(
                    f"expected {started.__name__}, got {type(answer).__name__}"
                )
            subscription_id = getattr(answer, "subscription_id")  # noqa: B009 - both carry it
            assert link.router is not None
            handoff = await link.router.take(int(subscription_id), timeout)
            return answer, handoff

        deadline = asyncio.get_running_loop().time() + _MOVE_RESUME_DEADLINE
        for tries in itertools.count():
            try:
                return await self._follow(ref, run, resend_on_loss=True)
            except (BrokerError, ConnectionLostError, ClientTimeoutError) as exc:
                wait = backoff_delay(exc, tries, 0.05, 1.0)
                now = asyncio.get_running_loop().time()
                if not resuming or not should_retry(exc, idempotent=True) or now + wait > deadline:
                    raise
                logger.info("reopening a moved feed: %s; again in %.2f s", exc, wait)
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

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

    # -- idempotent producers, conditional writes, commits, inspection ---------------
    # (the work is in producer.py, guarded.py and inspect.py)

    def producer(
        self,
        stream: str,
        *,
        producer_id: int | None = None,
        next_sequences: Mapping[int, int] | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        resend_timeout: float = 30.0,
        timeout: float | None = None,
        namespace: str | None = None,
    ) -> Producer:
        """An idempotent producer of `stream`: `async with client.producer("orders")
        as producer: await producer.publish(b"...", key=b"k")`. Each batch lands
        exactly once, resent after a failure under its own sequence. See `Producer`."""
        return Producer(
            self,
            stream,
            self._ns(namespace),
            producer_id=producer_id,
            next_sequences=next_sequences,
            max_in_flight=max_in_flight,
            resend_timeout=resend_timeout,
            timeout=timeout,
        )

    async def publish_if(
        self,
        stream: str,
        payloads: bytes | Sequence[bytes],
        *,
        expected_offset: int,
        key: bytes | None = None,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Append only if the batch would start at `expected_offset` (the tail of the
        shard `key` routes to); returns its first offset once durable. Raises
        `OffsetMismatchError` (with the `tail`) and writes nothing otherwise."""
        batch = [payloads] if isinstance(payloads, bytes) else list(payloads)
        return await guarded.publish_if(
            self,
            self._ns(namespace),
            stream,
            batch,
            expected_offset=expected_offset,
            key=key,
            timeout=timeout,
        )

    async def commit(
        self,
        stream: str,
        entity_key: bytes,
        event: bytes,
        *,
        changes: Mapping[str, bytes | None] | None = None,
        expected_offset: int | None = None,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Append `event` and apply `changes` to `entity_key`'s state (a value puts
        the key, None deletes it) as one record; returns its offset, which is the
        version of every key written. With `expected_offset`, only at that tail
        (else `OffsetMismatchError`). Durable streams only."""
        return await guarded.commit(
            self,
            self._ns(namespace),
            stream,
            entity_key,
            event,
            changes=changes or {},
            expected_offset=expected_offset,
            timeout=timeout,
        )

    async def state_get(
        self,
        stream: str,
        entity_key: bytes,
        key: str,
        *,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> StateEntry:
        """One key of `entity_key`'s committed state (value None: never written or deleted)."""
        return await guarded.state_get(
            self, self._ns(namespace), stream, entity_key, key, timeout=timeout
        )

    async def shard_inspect(
        self,
        name: str,
        *,
        shard: int = 0,
        kind: ShardKind | str = ShardKind.STREAM,
        namespace: str | None = None,
        timeout: float | None = None,
    ) -> ShardInspection:
        """What the broker knows of one shard of a stream or cache (needs
        `node.view:cluster:*`, else `ForbiddenError`)."""
        return await inspection.shard_inspect(
            self, self._ns(namespace), name, shard, ShardKind(kind), timeout
        )

    def subscriptions_list(
        self,
        *,
        tenant_id: str | None = None,
        namespace: str | None = None,
        stream: str | None = None,
        shard: int | None = None,
        principal: str | None = None,
        dropping: bool = False,
        limit: int | None = None,
        cursor: SubscriptionCursor | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[SubscriptionsPage]:
        """Pages of the broker's subscriptions matching the filter (every field
        optional; `limit` entries per page, broker default 100, at most 1,000),
        from `cursor` or the start; needs `node.view:cluster:*`. Each page's
        `next_cursor` resumes the listing later."""
        if limit is not None and not 1 <= limit <= inspection.MAX_PAGE:
            raise ValueError(f"limit must be within 1..{inspection.MAX_PAGE}")
        self._require(SubscriptionsList(request_id=0))
        flt = SubscriptionFilter(
            tenant_id=tenant_id,
            namespace=namespace,
            stream=stream,
            shard=shard,
            principal=principal,
            dropping=dropping,
        )
        return inspection.subscriptions_pages(
            self, flt, limit=limit, cursor=cursor, timeout=timeout
        )
