"""The scripted broker a client case plays against.

It reacts to what the client sends instead of fixing it: whatever flags,
features, request ids, keys and stream roles the client chooses are captured,
and answers are built from them. Every stream is served on its own, whatever
it turns out to be (control, publish, cache pool, or a pooled stream that only
ever authenticates); each request is handled in its own task, so a case can
hold one answer back and send a later one first.

While it serves, it checks the rules every client must keep and records each
breach as a violation: the first frame of a stream is `auth`; no request the
broker did not advertise (message gates, binary layout flags); frames that
decode. Discovery it advertised is answered as a standalone broker answers it;
any other request the script does not serve gets `unsupported` (or an error),
never silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from felix_transport import (
    CertKeyPair,
    Connection,
    ConnectionClosedError,
    Server,
    Stream,
    StreamClosedError,
    TransportConfig,
    generate_ca,
    generate_leaf,
    serve,
)
from felix_wire.binary import PublishBatchFrame
from felix_wire.codec import decode_payload, encode_frame
from felix_wire.features import Capabilities, Feature
from felix_wire.flags import ORIGINAL_V1_FLAGS
from felix_wire.frame import FrameReader
from felix_wire.gating import (
    MESSAGE_DIRECTIONS,
    auth_answer,
    check_sendable,
    client_capabilities,
)
from felix_wire.messages import (
    Auth,
    CacheShardsView,
    Error,
    Ok,
    ShardOwner,
    ShardOwnersView,
    StreamShardsView,
    TopologyView,
    Unknown,
    Unsupported,
)
from felix_wire.wire_errors import NotNegotiatedError, WireError

from ..wirelog import WireLog
from .link import SilentLink

__all__ = [
    "BINARY_PUBLISH",
    "DEFAULT_HANDLERS",
    "BrokerScript",
    "Exchange",
    "Handler",
    "ScriptedBroker",
    "Seen",
    "not_served",
]

# How long a stream the client ended waits for its pending answers before ending too.
ANSWER_GRACE = 5.0


# The name binary publish frames are seen and handled under (JSON publish_batch keeps its own).
BINARY_PUBLISH = "binary:publish_batch"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seen:
    """One frame the client sent, decoded."""

    conn: int
    stream_id: int
    name: str  # message type, BINARY_PUBLISH for the binary layout, "" if undecodable
    value: Any  # the decoded message or frame (None if undecodable)
    flags: int
    at: float = 0.0  # time.monotonic() when it arrived


class Exchange:
    """One request being answered: where it came from and how to answer it."""

    def __init__(
        self,
        broker: ScriptedBroker,
        connection: Connection,
        stream: Stream,
        conn: int,
        client: Capabilities,
    ) -> None:
        self.broker = broker
        self.connection = connection
        self.stream = stream
        self.conn = conn
        self.client = client  # what the client offered in this stream's auth

    async def reply(self, value: Any) -> None:
        """Send a message or binary frame on the request's stream."""
        data = encode_frame(value)
        self.broker.log.sent(f"c{self.conn}/s{self.stream.stream_id}", _describe(value))
        await self.stream.write(data)

    async def reply_raw(self, data: bytes, text: str) -> None:
        """Send bytes no catalogue class builds (an unknown message type, an unknown field)."""
        self.broker.log.sent(f"c{self.conn}/s{self.stream.stream_id}", text)
        await self.stream.write(data)

    async def open_events(self, *frames: Any) -> Stream:
        """Open a unidirectional stream to the client and send frames on it."""
        stream = await self.connection.open_uni_stream()
        for value in frames:
            self.broker.log.sent(f"c{self.conn}/e{stream.stream_id}", _describe(value))
            await stream.write(encode_frame(value))
        return stream


# (exchange, request) -> awaitable; answers through the exchange.
Handler = Callable[[Exchange, Any], Awaitable[None]]


@dataclass(frozen=True)
class BrokerScript:
    """What the scripted broker advertises and how it answers each request type."""

    flags: int
    features: int
    handlers: Mapping[str, Handler] = field(default_factory=dict)
    legacy: bool = False  # answer auth with a plain `ok`: an old broker that negotiates nothing
    publish_window: int = 64
    # The broker's QUIC idle timeout (None: the transport's default), e.g. short
    # enough that only a client sending keepalives keeps an idle connection.
    idle_timeout: float | None = None


def _describe(value: Any) -> str:
    text = msgspec.json.encode(msgspec.to_builtins(value)).decode()
    name = type(value).__name__
    return f"{name} {text}" if len(text) <= 300 else f"{name} {text[:297]}..."


class ScriptedBroker:
    """A QUIC server with its own CA, playing one `BrokerScript`."""

    def __init__(self, script: BrokerScript, *, ca: CertKeyPair | None = None) -> None:
        self.script = script
        # Brokers of one case share a CA, so a client redirected between them trusts both.
        ca = ca or generate_ca("Felix conformance client-tester CA")
        self.ca = ca
        leaf = generate_leaf(ca, dns_names=("localhost",), ip_addresses=("127.0.0.1", "::1"))
        self.ca_pem = ca.cert_pem
        idle = {} if script.idle_timeout is None else {"idle_timeout": script.idle_timeout}
        self._config = TransportConfig.server(leaf.cert_pem + ca.cert_pem, leaf.key_pem, **idle)
        self._server: Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections = 0
        self.log = WireLog()
        self.seen: list[Seen] = []
        self.auths: list[Auth] = []
        self.violations: list[str] = []
        self.peers: list[ScriptedBroker] = []  # the case's other brokers (redirect targets)
        self.link: SilentLink | None = None  # the link the client reaches us through, if any
        self.connections: dict[int, Connection] = {}  # by number, as Seen.conn names them
        # What a case's handlers keep for its judge (e.g. the most unanswered publishes).
        self.notes: dict[str, Any] = {}
        # A legacy broker's client may assume the original v1 layouts, nothing more.
        self.advertised = (
            Capabilities(int(ORIGINAL_V1_FLAGS), 0)
            if script.legacy
            else Capabilities(script.flags, script.features)
        )

    async def start(self) -> tuple[str, int]:
        self._server = await serve(self._config, "127.0.0.1", 0, self._on_connection)
        host, port = self._server.address[:2]
        return str(host), int(port)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def requests(self, name: str) -> list[Any]:
        """Every decoded frame of that type or layout the client sent."""
        return [s.value for s in self.seen if s.name == name]

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        async def run() -> None:
            with contextlib.suppress(StreamClosedError, ConnectionClosedError):
                await coro

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _handler(self, name: str) -> Handler:
        handler = self.script.handlers.get(name)
        if handler is not None:
            return handler
        default = DEFAULT_HANDLERS.get(name)
        if default is not None and self.advertised.has_feature(default[0]):
            return default[1]
        return not_served

    async def _on_connection(self, connection: Connection) -> None:
        self._connections += 1
        conn = self._connections
        self.connections[conn] = connection
        self.log.note(f"c{conn}", "client connected")
        with contextlib.suppress(ConnectionClosedError):
            while not connection.closed:
                stream = await connection.accept_stream()
                self._spawn(self._serve_stream(connection, stream, conn))

    async def _serve_stream(self, connection: Connection, stream: Stream, conn: int) -> None:
        where = f"c{conn}/s{stream.stream_id}"
        reader = FrameReader()
        authed = False
        client = Capabilities()
        pending: list[asyncio.Task[None]] = []
        with contextlib.suppress(StreamClosedError, ConnectionClosedError):
            while True:
                data = await stream.read()
                if not data:
                    self.log.received(where, "[FIN]")
                    if not stream.is_unidirectional:
                        # Requests before the FIN are still owed their answers.
                        owed = [t for t in pending if not t.done()]
                        if owed:
                            await asyncio.wait(owed, timeout=ANSWER_GRACE)
                        with contextlib.suppress(StreamClosedError):
                            await stream.finish()
                    return
                try:
                    frames = reader.feed(data)
                except WireError as exc:
                    self.violations.append(f"{where}: a frame that cannot be framed: {exc}")
                    stream.reset(1)
                    return
                for frame in frames:
                    try:
                        value = decode_payload(frame.flags, frame.payload)
                    except WireError as exc:
                        self.violations.append(f"{where}: an undecodable frame: {exc}")
                        self.seen.append(
                            Seen(conn, stream.stream_id, "", None, frame.flags, time.monotonic())
                        )
                        continue
                    name = _name_of(value)
                    self.log.received(where, _describe(value))
                    self.seen.append(
                        Seen(conn, stream.stream_id, name, value, frame.flags, time.monotonic())
                    )
                    if not authed:
                        if not isinstance(value, Auth):
                            self.violations.append(f"{where}: {name} before auth")
                            continue
                        authed = True
                        # Nothing is negotiated with a legacy broker, whatever was offered.
                        if not self.script.legacy:
                            client = client_capabilities(value)
                        await self._answer_auth(
                            Exchange(self, connection, stream, conn, client), value
                        )
                        continue
                    exchange = Exchange(self, connection, stream, conn, client)
                    self._check_gate(where, name, frame.flags)
                    pending.append(self._spawn(self._handler(name)(exchange, value)))

    async def _answer_auth(self, exchange: Exchange, auth: Auth) -> None:
        self.auths.append(auth)
        if self.script.legacy:
            await exchange.reply(Ok())
            return
        await exchange.reply(
            auth_answer(
                auth,
                server_flags=self.script.flags,
                server_features=self.script.features,
                publish_window=self.script.publish_window,
            )
        )

    def _check_gate(self, where: str, name: str, flags: int) -> None:
        if flags:
            unadvertised = flags & ~self.advertised.flags
            if unadvertised:
                self.violations.append(
                    f"{where}: binary {name} with flags {unadvertised:#06x} "
                    "the broker did not advertise"
                )
            return
        if MESSAGE_DIRECTIONS.get(name) == "broker_to_client":
            self.violations.append(f"{where}: the client sent {name}, a broker's message")
            return
        try:
            check_sendable(name, self.advertised)
        except NotNegotiatedError as exc:
            self.violations.append(f"{where}: the client sent {name} ungated: {exc}")


async def _topology(ex: Exchange, request: Any) -> None:
    await ex.reply(TopologyView(brokers=[]))  # a single node: nothing beyond the seeds (D1)


async def _stream_shards(ex: Exchange, request: Any) -> None:
    await ex.reply(StreamShardsView(shards=1, request_id=request.request_id))


async def _cache_shards(ex: Exchange, request: Any) -> None:
    await ex.reply(CacheShardsView(shards=1, request_id=request.request_id))


async def _shard_owners(ex: Exchange, request: Any) -> None:
    # A broker outside a cluster: one shard, no node id, generation 0 (D3).
    owners = [ShardOwner(shard=0, generation=0)]
    await ex.reply(ShardOwnersView(owners=owners, request_id=request.request_id))


# Discovery a scripted broker answers as a standalone broker would, when it advertised it.
DEFAULT_HANDLERS: Mapping[str, tuple[int, Handler]] = {
    "topology": (int(Feature.FEATURE_TOPOLOGY), _topology),
    "stream_shards": (int(Feature.FEATURE_STREAM_SHARDS), _stream_shards),
    "cache_shards": (int(Feature.FEATURE_CACHE_SHARDS), _cache_shards),
    "shard_owners": (int(Feature.FEATURE_SHARD_OWNERS), _shard_owners),
}


async def not_served(ex: Exchange, request: Any) -> None:
    """The answer to a request the script does not serve: `unsupported` to a client
    that offered FEATURE_UNSUPPORTED, else an error; never silence."""
    name = _name_of(request)
    request_id = getattr(request, "request_id", None)
    if ex.client.has_feature(int(Feature.FEATURE_UNSUPPORTED)) and not ex.broker.script.legacy:
        await ex.reply(Unsupported(request_type=name, request_id=request_id))
    else:
        await ex.reply(Error(message=f"{name} is not served by this scripted broker"))


def _name_of(value: Any) -> str:
    if isinstance(value, PublishBatchFrame):
        return BINARY_PUBLISH
    if isinstance(value, Unknown):
        return value.type
    config = getattr(type(value), "__struct_config__", None)
    tag = getattr(config, "tag", None)
    return str(tag) if tag is not None else type(value).__name__
