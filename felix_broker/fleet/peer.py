"""Broker to broker: the peer listener and the dialer, over QUIC with mutual TLS.

Both ride `felix_transport` on their own ALPN (`felix_wire.fleet.PEER_ALPN`,
required both ways). Each broker's peer certificate is signed by the fleet CA
and names the broker's node id as a DNS SAN (`PeerTls.issue`): the dialer checks
the listener's certificate against the node id it dials (TLS server name), the
listener checks the dialer's during the handshake (`client_ca_pem`) and then
against the `hello` that opens every peer stream.

A bidirectional stream carries `hello`, then one request (`PeerDialer.request`)
or an ordered run of them (`PeerPipe`: a client stream's forwarded publishes to
one owner). The listener answers `hello_ok` (or `hello_refused` and the stream
ends), admits the stream's requests in order (the handler returns once a request
is admitted, e.g. queued on its shard) and writes exactly one terminal answer per
request, in the same order, then finishes the stream after the dialer's FIN.
Frames reuse the client protocol's envelope with JSON payloads of
`felix_wire.fleet` messages.

Bounds (`PeerLimits`), and what happens at each:

- connections: the listener refuses a connection past `max_connections` during
  the handshake (CONNECTION_REFUSED); the dialer keeps one connection per peer;
- in-flight requests: at most `max_inflight` streams per connection on the
  listener (the next stream is not read until one finishes, so QUIC flow control
  holds the dialer back), at most `stream_window` unanswered requests per stream
  (the listener stops reading the stream; a pipe's `send` waits), and at most
  `max_inflight` single requests per peer on the dialer (a caller waits for a
  slot, at most `request_timeout`);
- frame sizes: `PEER_HELLO_MAX_FRAME_BYTES` for the hello, then
  `max_frame_bytes` (also for a request that came in the hello's read); a larger
  frame ends the stream;
- time: a peer that does not complete a handshake within `connect_timeout`, or
  a request it does not answer within `request_timeout`, fails with
  `PeerUnavailableError` (`sent` says whether the outcome is unknown).

Test mode only, both take a `LinkFaults` (the broker's fault file,
`felix_broker.chaos.faults`): a directional partition of peer messages. A message
this broker sends to a node it ``blocks_out`` is lost: a request fails unsent
(`PeerUnavailableError`, ``sent=False``), an answer is never written (the request
took effect; the stream is reset, so the dialer's outcome is unknown). A message
from a node it ``blocks_in`` is lost: a request is dropped unseen (the stream is
reset), an answer is dropped once read (the request took effect there; the
caller gets ``PeerUnavailableError(sent=True)``). Hello and hello_ok are the
stream's setup, not messages: the cut applies to requests and answers. Each is
checked per message, so a partition starts and heals mid-connection.

The listener runs on aioquic: qh3 2.1 cannot request client certificates
(felix_transport.config). The dialer runs on the configured stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509

from felix_transport import (
    CertKeyPair,
    Connection,
    ConnectionClosedError,
    Impl,
    Server,
    Stream,
    StreamClosedError,
    TransportConfig,
    connect,
    default_impl,
    generate_leaf,
    serve,
)
from felix_wire.fleet import (
    PEER_ALPN,
    PEER_HELLO_MAX_FRAME_BYTES,
    PEER_MAX_FRAME_BYTES,
    Hello,
    HelloOk,
    HelloRefused,
    PeerMessage,
    PeerUnsupported,
    decode_peer_message,
    encode_peer_message,
)
from felix_wire.frame import HEADER_SIZE, Frame, FrameReader, decode_header, frame_bytes
from felix_wire.messages import Unknown
from felix_wire.wire_errors import FrameError, WireError

__all__ = [
    "LinkFaults",
    "PeerDialer",
    "PeerHandler",
    "PeerLimits",
    "PeerListener",
    "PeerOrigin",
    "PeerPipe",
    "PeerProtocolError",
    "PeerTable",
    "PeerTls",
    "PeerUnavailableError",
    "certificate_node_ids",
]

_log = logging.getLogger(__name__)

# Application close code for a peer connection whose certificate names no node.
_CLOSE_UNIDENTIFIED = 0x10
_FRAME_FLAGS_JSON = 0
# Stream reset code of a message lost to a test-mode partition (LinkFaults).
_RESET_LOST = 0x11


class LinkFaults(Protocol):
    """Test mode: which peers' messages are lost, per direction (see the module)."""

    def blocks_out(self, node_id: str) -> bool:
        """Messages from this broker to `node_id` are lost."""
        ...

    def blocks_in(self, node_id: str) -> bool:
        """Messages from `node_id` to this broker are lost."""
        ...


def _cut(stream: Stream) -> None:
    """End a stream both ways at once (a message on it was lost)."""
    with contextlib.suppress(StreamClosedError):
        stream.reset(_RESET_LOST)
    with contextlib.suppress(StreamClosedError):
        stream.stop_sending(_RESET_LOST)


@dataclass(frozen=True, slots=True)
class PeerOrigin:
    """Where a peer request came from: the dialer's node id (checked against its
    certificate), its connection and the request's stream."""

    node_id: str
    connection: Connection
    stream: Stream


PeerHandler = Callable[[PeerMessage, PeerOrigin], Awaitable[PeerMessage | Awaitable[PeerMessage]]]
"""Admits one peer request and returns its answer, or an awaitable of it: the stream's
next request is read once the handler returns (so an owner can admit publishes in the
order they came and let their writes settle together)."""


class PeerTable:
    """Peer request type -> its handler: the listener's one dispatch table. A type
    with no handler is answered `peer_unsupported`."""

    def __init__(self) -> None:
        self._handlers: dict[type[PeerMessage], PeerHandler] = {}

    def register(self, kind: type[PeerMessage], handler: PeerHandler) -> None:
        if kind in self._handlers:
            raise ValueError(f"{kind.__name__} already has a peer handler")
        self._handlers[kind] = handler

    async def handle(
        self, message: PeerMessage, origin: PeerOrigin
    ) -> PeerMessage | Awaitable[PeerMessage]:
        handler = self._handlers.get(type(message))
        if handler is None:
            tag = str(type(message).__struct_config__.tag)
            return PeerUnsupported(
                request_type=tag, request_id=getattr(message, "request_id", None)
            )
        return await handler(message, origin)


class PeerUnavailableError(Exception):
    """The peer could not be reached, or did not answer in time. `sent` says whether
    the request may have reached it (its outcome is then unknown)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class PeerProtocolError(Exception):
    """The peer answered something the peer protocol does not allow."""


@dataclass(frozen=True, slots=True)
class PeerTls:
    """One broker's peer identity: its certificate chain (leaf + fleet CA), key, and
    the fleet CA every peer certificate must be signed by."""

    node_id: str
    chain_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    @classmethod
    def from_files(cls, node_id: str | None, cert: Path, key: Path, ca: Path) -> PeerTls:
        """An operator's peer certificate (PEM leaf, optionally followed by its chain),
        key and fleet CA. The certificate must name `node_id` as a DNS SAN; without
        `node_id` it must name exactly one, which is the node id."""
        chain = cert.read_bytes()
        names = certificate_node_ids(x509.load_pem_x509_certificate(chain))
        if node_id is None:
            if len(names) != 1:
                raise ValueError(f"{cert} must name one node id (DNS name), not {sorted(names)}")
            (node_id,) = names
        if node_id not in names:
            raise ValueError(f"{cert} names {sorted(names)}, not the node id {node_id!r}")
        ca_pem = ca.read_bytes()
        if ca_pem not in chain:
            chain = chain.rstrip(b"\n") + b"\n" + ca_pem
        return cls(node_id, chain, key.read_bytes(), ca_pem)

    @classmethod
    def issue(cls, ca: CertKeyPair, node_id: str) -> PeerTls:
        """A peer certificate for `node_id` signed by the fleet CA `ca`: the node id
        is its one DNS SAN, valid for server and client authentication."""
        leaf = generate_leaf(ca, dns_names=(node_id,), ip_addresses=(), client_auth=True)
        return cls(node_id, leaf.cert_pem + ca.cert_pem, leaf.key_pem, ca.cert_pem)


@dataclass(frozen=True, slots=True)
class PeerLimits:
    max_connections: int = 64
    max_inflight: int = 256
    stream_window: int = 64
    max_frame_bytes: int = PEER_MAX_FRAME_BYTES
    request_timeout: float = 10.0
    connect_timeout: float = 2.0
    idle_timeout: float = 30.0

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_inflight, self.stream_window) < 1:
            raise ValueError("max_connections, max_inflight and stream_window must be >= 1")
        if not PEER_HELLO_MAX_FRAME_BYTES <= self.max_frame_bytes <= PEER_MAX_FRAME_BYTES:
            low, high = PEER_HELLO_MAX_FRAME_BYTES, PEER_MAX_FRAME_BYTES
            raise ValueError(f"max_frame_bytes must be within {low}..{high}")
        if min(self.request_timeout, self.connect_timeout, self.idle_timeout) <= 0:
            raise ValueError("request_timeout, connect_timeout and idle_timeout must be positive")


def certificate_node_ids(cert: x509.Certificate | None) -> frozenset[str]:
    """The DNS SANs of a peer certificate: the node ids it may speak for."""
    if cert is None:
        return frozenset()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(san.get_values_for_type(x509.DNSName))


def _frame(message: PeerMessage) -> bytes:
    return frame_bytes(_FRAME_FLAGS_JSON, encode_peer_message(message))


class _FrameStream:
    """Reads whole peer frames off one QUIC stream, within a payload cap.

    With `then`, only the first frame (the hello) is held to `max_payload`: the
    bytes after it in the same read (a dialer sends hello and request together)
    are parsed under `then`, the cap after hello_ok."""

    def __init__(self, stream: Stream, max_payload: int, *, then: int | None = None) -> None:
        self.stream = stream
        self.reader = FrameReader(max_payload=max_payload)
        self._ready: list[PeerMessage | Unknown] = []
        self._then = then
        self._head = bytearray()  # bytes of the first frame while `then` waits

    def _feed(self, data: bytes) -> list[Frame]:
        if self._then is None:
            return self.reader.feed(data)
        self._head += data
        if len(self._head) < HEADER_SIZE:
            return []
        size = HEADER_SIZE + decode_header(self._head, self.reader.max_payload).length
        if len(self._head) < size:
            return []
        first = self.reader.feed(bytes(self._head[:size]))
        rest = bytes(self._head[size:])
        self.reader.max_payload, self._then, self._head = self._then, None, bytearray()
        return [*first, *self.reader.feed(rest)]

    async def next(self) -> PeerMessage | Unknown | None:
        """The next message; None at the end of the stream."""
        while not self._ready:
            data = await self.stream.read(65536)
            if not data:
                if self._head:
                    self.reader.feed(bytes(self._head))
                self.reader.close()  # raises on a truncated frame
                return None
            for frame in self._feed(data):
                if frame.flags != _FRAME_FLAGS_JSON:
                    raise PeerProtocolError(f"peer frame with flags {frame.flags:#06x}")
                self._ready.append(decode_peer_message(frame.payload))
        return self._ready.pop(0)


class PeerListener:
    """Serves peer requests: one request per stream, after a hello matching the
    dialer's certificate."""

    def __init__(
        self,
        tls: PeerTls,
        handler: PeerHandler,
        limits: PeerLimits | None = None,
        *,
        faults: LinkFaults | None = None,
    ) -> None:
        self._tls = tls
        self._handler = handler
        self._limits = limits or PeerLimits()
        self._faults = faults  # test mode: a partition (see the module)
        self._server: Server | None = None
        self._connections: set[Connection] = set()

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "not started"
        host, port = self._server.address[:2]
        return str(host), int(port)

    async def start(self, host: str, port: int) -> None:
        config = TransportConfig.server(
            self._tls.chain_pem,
            self._tls.key_pem,
            impl="aioquic",
            client_ca_pem=self._tls.ca_pem,
            alpn_protocols=(PEER_ALPN,),
            require_alpn=True,
            idle_timeout=self._limits.idle_timeout,
        )
        self._server = await serve(
            config, host, port, self._on_connection, max_connections=self._limits.max_connections
        )

    async def close(self) -> None:
        for conn in list(self._connections):
            conn.close(0, "broker stopping")
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _on_connection(self, conn: Connection) -> None:
        names = certificate_node_ids(conn.peer_certificate)
        if not names:  # the handshake verified the chain; an unnamed leaf speaks for nobody
            conn.close(_CLOSE_UNIDENTIFIED, "peer certificate names no node id")
            return
        self._connections.add(conn)
        slots = asyncio.Semaphore(self._limits.max_inflight)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    stream = await conn.accept_stream()
                except ConnectionClosedError:
                    return
                await slots.acquire()  # at the bound, the next stream waits unread
                serving = self._serve_stream(conn, stream, names)
                task = asyncio.get_running_loop().create_task(serving)
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(lambda _t: slots.release())
        finally:
            self._connections.discard(conn)
            for task in tasks:
                task.cancel()

    async def _write_answers(
        self, stream: Stream, node_id: str, answers: asyncio.Queue[Awaitable[PeerMessage] | None]
    ) -> None:
        lost = False
        while (answer := await answers.get()) is not None:
            message = await answer
            if not lost and self._faults is not None and self._faults.blocks_out(node_id):
                lost = True  # this answer and the stream's later ones never arrive
                _cut(stream)
            if not lost:
                await stream.write(_frame(message))
        if not lost:
            await stream.finish()

    async def _serve_stream(self, conn: Connection, stream: Stream, names: frozenset[str]) -> None:
        frames = _FrameStream(stream, PEER_HELLO_MAX_FRAME_BYTES, then=self._limits.max_frame_bytes)
        try:
            hello = await frames.next()
            if not isinstance(hello, Hello):
                await stream.write(_frame(HelloRefused(message="hello first")), end_stream=True)
                return
            if hello.node_id not in names:
                text = f"hello names {hello.node_id!r}; the certificate is for {sorted(names)}"
                _log.warning("peer refused: %s", text)
                await stream.write(_frame(HelloRefused(message=text)), end_stream=True)
                return
            await stream.write(_frame(HelloOk(node_id=self._tls.node_id, features=[])))
            origin = PeerOrigin(hello.node_id, conn, stream)
            faults = self._faults
            # Requests of one stream are admitted in order; their answers are written in
            # that order as they settle, at most `stream_window` pending.
            answers: asyncio.Queue[Awaitable[PeerMessage] | None]
            answers = asyncio.Queue(maxsize=self._limits.stream_window)
            writer = asyncio.get_running_loop().create_task(
                self._write_answers(stream, hello.node_id, answers)
            )
            try:
                while (request := await frames.next()) is not None:
                    if faults is not None and faults.blocks_in(hello.node_id):
                        _cut(stream)  # the request is lost unseen, and the stream with it
                        return
                    if isinstance(request, Unknown):
                        unsupported = PeerUnsupported(
                            request_type=request.type, request_id=request.request_id
                        )
                        await answers.put(_settled(unsupported))
                        continue
                    result = await self._handler(request, origin)
                    await answers.put(result if inspect.isawaitable(result) else _settled(result))
                await answers.put(None)
                await writer
            finally:
                writer.cancel()
        except (WireError, FrameError, PeerProtocolError) as exc:
            _log.warning("peer stream ended: %s", exc)
            stream.reset(1)
        except (StreamClosedError, ConnectionClosedError):
            return
        except Exception:  # a bug in a handler: the dialer sees the stream reset
            _log.exception("peer request failed")
            stream.reset(1)


class PeerPipe:
    """An ordered run of requests to one peer on one stream: each `send` is written
    after the previous one, and answers come back in the same order (the listener
    admits a stream's requests in order). At most `stream_window` are unanswered; a
    `send` beyond waits. Once nothing is pending the stream is finished (`idle`):
    the next run opens a new pipe, after every earlier request was answered, so
    order holds across pipes too. A broken pipe fails everything pending with
    PeerUnavailableError(sent=True)."""

    def __init__(
        self,
        stream: Stream,
        node_id: str,
        limits: PeerLimits,
        faults: LinkFaults | None = None,
    ) -> None:
        self._stream = stream
        self._node_id = node_id
        self._faults = faults
        self._timeout = limits.request_timeout
        self._slots = asyncio.Semaphore(limits.stream_window)
        self._pending: deque[asyncio.Future[PeerMessage]] = deque()
        self._frames = _FrameStream(stream, limits.max_frame_bytes)
        self._error: Exception | None = None
        self._closed = False
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def usable(self) -> bool:
        return self._error is None and not self._closed

    async def send(self, message: PeerMessage) -> asyncio.Future[PeerMessage]:
        """Write `message`; the returned future resolves to its answer (or fails with
        PeerUnavailableError / PeerProtocolError)."""
        await self._slots.acquire()
        if not self.usable:
            self._slots.release()
            raise self._error or PeerUnavailableError("pipe closed", sent=False)
        if self._faults is not None and self._faults.blocks_out(self._node_id):
            self._slots.release()
            lost = f"{self._node_id}: message lost (test fault)"
            self._fail(PeerUnavailableError(lost, sent=True))  # the stream breaks
            _cut(self._stream)
            raise PeerUnavailableError(lost, sent=False)
        future: asyncio.Future[PeerMessage] = asyncio.get_running_loop().create_future()
        self._pending.append(future)
        try:
            await self._stream.write(_frame(message))
        except (StreamClosedError, ConnectionClosedError) as exc:
            self._fail(PeerUnavailableError(f"{self._node_id}: {exc}", sent=True))
        return future

    async def answer(self, future: asyncio.Future[PeerMessage]) -> PeerMessage:
        """The answer, within `request_timeout` (the pipe breaks otherwise)."""
        try:
            async with asyncio.timeout(self._timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            self._fail(PeerUnavailableError(f"{self._node_id} did not answer in time", sent=True))
            self._stream.reset(1)
            return await future

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if not self._pending and self._error is None:
                with contextlib.suppress(StreamClosedError):
                    self._stream.reset(0)  # nothing pending: nothing is lost
            self._reader.cancel()

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_exception(self._error)
            self._slots.release()

    async def _read(self) -> None:
        try:
            first = await self._frames.next()
            if isinstance(first, HelloRefused):
                raise PeerProtocolError(f"hello refused: {first.message}")
            if not isinstance(first, HelloOk):
                raise PeerProtocolError(f"expected hello_ok, got {type(first).__name__}")
            while (answer := await self._frames.next()) is not None:
                if isinstance(answer, Unknown):
                    raise PeerProtocolError(f"unknown answer type {answer.type!r}")
                if not self._pending:
                    raise PeerProtocolError("an answer nobody asked for")
                if self._faults is not None and self._faults.blocks_in(self._node_id):
                    _cut(self._stream)
                    lost = f"{self._node_id}: answer lost (test fault)"
                    raise PeerUnavailableError(lost, sent=True)
                future = self._pending.popleft()
                self._slots.release()
                if not future.done():
                    future.set_result(answer)
                if not self._pending:  # idle: this run is over
                    self._closed = True
                    with contextlib.suppress(StreamClosedError):
                        await self._stream.finish()
            if self._pending:
                raise PeerUnavailableError(f"{self._node_id} ended the stream", sent=True)
        except (PeerProtocolError, PeerUnavailableError) as exc:
            self._fail(exc)
        except (StreamClosedError, ConnectionClosedError, WireError, FrameError) as exc:
            self._fail(PeerUnavailableError(f"{self._node_id}: {exc}", sent=True))
        finally:
            self._closed = True


def _settled(message: PeerMessage) -> asyncio.Future[PeerMessage]:
    future: asyncio.Future[PeerMessage] = asyncio.get_running_loop().create_future()
    future.set_result(message)
    return future


class PeerDialer:
    """Sends peer requests: one connection per peer node, one stream per request."""

    def __init__(
        self,
        tls: PeerTls,
        limits: PeerLimits | None = None,
        impl: Impl | None = None,
        *,
        faults: LinkFaults | None = None,
    ) -> None:
        self._tls = tls
        self._limits = limits or PeerLimits()
        self._faults = faults  # test mode: a partition (see the module)
        self._impl: Impl = impl or default_impl()
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def close(self) -> None:
        for conn in self._connections.values():
            conn.close(0, "broker stopping")
        for conn in list(self._connections.values()):
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await conn.wait_closed()
        self._connections.clear()

    async def request(self, node_id: str, peer_addr: str, message: PeerMessage) -> PeerMessage:
        """Send `message` to `node_id` at `peer_addr` (host:port) and return its answer.

        Raises PeerUnavailableError when the peer cannot be reached or does not
        answer within `request_timeout`, PeerProtocolError for an answer the peer
        protocol does not allow."""
        if self._faults is not None and self._faults.blocks_out(node_id):
            raise PeerUnavailableError(f"{node_id}: request lost (test fault)", sent=False)
        slots = self._slots.setdefault(node_id, asyncio.Semaphore(self._limits.max_inflight))
        sent = [False]
        try:
            async with asyncio.timeout(self._limits.request_timeout):
                async with slots:
                    conn = await self._connection(node_id, peer_addr)
                    answer = await self._exchange(conn, message, sent)
        except TimeoutError:
            raise PeerUnavailableError(f"{node_id} did not answer in time", sent=sent[0]) from None
        except (ConnectionClosedError, StreamClosedError, OSError) as exc:
            self._forget(node_id)
            raise PeerUnavailableError(f"{node_id} at {peer_addr}: {exc}", sent=sent[0]) from None
        except (WireError, FrameError) as exc:
            raise PeerProtocolError(f"{node_id} answered badly: {exc}") from None
        if self._faults is not None and self._faults.blocks_in(node_id):
            raise PeerUnavailableError(f"{node_id}: answer lost (test fault)", sent=True)
        return answer

    async def pipe(self, node_id: str, peer_addr: str) -> PeerPipe:
        """A new ordered pipe to `node_id` (hello sent). Raises PeerUnavailableError
        (nothing sent) when the peer cannot be reached."""
        if self._faults is not None and self._faults.blocks_out(node_id):
            raise PeerUnavailableError(f"{node_id}: stream lost (test fault)", sent=False)
        try:
            async with asyncio.timeout(self._limits.request_timeout):
                conn = await self._connection(node_id, peer_addr)
                stream = await conn.open_bidi_stream()
                await stream.write(_frame(Hello(node_id=self._tls.node_id, features=[])))
        except TimeoutError:
            raise PeerUnavailableError(f"{node_id}: no stream in time", sent=False) from None
        except (ConnectionClosedError, StreamClosedError, OSError) as exc:
            self._forget(node_id)
            raise PeerUnavailableError(f"{node_id} at {peer_addr}: {exc}", sent=False) from None
        return PeerPipe(stream, node_id, self._limits, self._faults)

    def forget(self, node_id: str) -> None:
        """Drop the connection to `node_id` (it stopped answering: a peer that restarted
        on the same address never answers the old connection, which would otherwise
        linger until its idle timeout); the next request dials again."""
        self._forget(node_id)

    def _forget(self, node_id: str) -> None:
        conn = self._connections.pop(node_id, None)
        if conn is not None:
            conn.close(0, "")

    async def _connection(self, node_id: str, peer_addr: str) -> Connection:
        conn = self._connections.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        lock = self._connecting.setdefault(node_id, asyncio.Lock())
        async with lock:
            conn = self._connections.get(node_id)
            if conn is not None and not conn.closed:
                return conn
            host, _, port = peer_addr.rpartition(":")
            config = TransportConfig.client(
                self._tls.ca_pem,
                impl=self._impl,
                server_name=node_id,  # the listener's certificate must name the node dialled
                certificate_chain_pem=self._tls.chain_pem,
                private_key_pem=self._tls.key_pem,
                alpn_protocols=(PEER_ALPN,),
                offer_alpn=True,
                idle_timeout=self._limits.idle_timeout,
            )
            try:
                async with asyncio.timeout(self._limits.connect_timeout):
                    conn = await connect(config, host.strip("[]"), int(port))
            except TimeoutError:
                raise PeerUnavailableError(
                    f"{node_id} at {peer_addr}: no handshake", sent=False
                ) from None
            self._connections[node_id] = conn
            return conn

    async def _exchange(
        self, conn: Connection, message: PeerMessage, sent: list[bool]
    ) -> PeerMessage:
        stream = await conn.open_bidi_stream()
        hello = Hello(node_id=self._tls.node_id, features=[])
        sent[0] = True
        await stream.write(_frame(hello) + _frame(message), end_stream=True)
        frames = _FrameStream(stream, self._limits.max_frame_bytes)
        first = await frames.next()
        if isinstance(first, HelloRefused):
            raise PeerProtocolError(f"hello refused: {first.message}")
        if not isinstance(first, HelloOk):
            raise PeerProtocolError(f"expected hello_ok, got {type(first).__name__}")
        answer = await frames.next()
        if answer is None:
            raise PeerUnavailableError("the peer ended the stream without an answer", sent=True)
        if isinstance(answer, Unknown):
            raise PeerProtocolError(f"unknown answer type {answer.type!r}")
        return answer
