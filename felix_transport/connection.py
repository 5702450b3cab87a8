"""Async connections and streams over a sans-IO adapter.

A :class:`Connection` owns one :class:`~felix_transport.backends.ConnectionAdapter`
and is driven by the datagram loop in :mod:`felix_transport.endpoint`, which
feeds it datagram batches, runs its timers and asks it to transmit. The
application sees :class:`Connection` and :class:`Stream` only.

Back-pressure, both directions, per stream:

- Sending: ``Stream.write`` queries the stack's send backlog before each chunk;
  above ``send_high_watermark`` the writer waits until the backlog falls to
  ``send_low_watermark`` (checked after every receive batch and transmit).
  Writes are cut into chunks of at most the high mark, so the stack never
  holds more than about twice the high mark for one stream.
- Receiving: at most ``stream_receive_window`` bytes wait in a stream for the
  application. On aioquic MAX_STREAM_DATA only advances as the application
  reads (``Capabilities.per_stream_receive_credit``), so the peer cannot send
  past the bound. qh3's native core extends windows on its own, so there the
  connection stops feeding datagrams to the stack while any of its streams is
  over the bound, holding at most ``_MAX_HELD_DATAGRAMS`` (dropping the rest:
  QUIC retransmits them) and resuming once reads bring the stream below half
  the bound. Unacknowledged, the peer's congestion window fills and its
  sender stops. To keep a long pause from idling the connection out, one held
  datagram (the newest) is fed every ``idle_timeout / 3``, so a stalled stream can exceed
  its bound by about one datagram per such tick. The pause is connection-wide:
  other streams of the same connection stall with it.

Before authentication (``TransportConfig.preauth_stream_window`` set, server
side): until the application calls :meth:`Connection.trust`, a connection is
untrusted. Its streams are bounded by ``preauth_stream_window`` instead of
``stream_receive_window`` (aioquic: that is the credit the peer gets; qh3: the
input pause above), all its streams together by ``preauth_connection_budget``
(aioquic: MAX_DATA follows reads; qh3: input pauses at the budget and resumes
at half of it), and all untrusted connections of a server together by
``preauth_global_budget`` (both stacks: an untrusted connection receiving while
the shared budget is spent pauses until it falls to half). An untrusted
connection is fed one datagram at a time and holds at most
``_MAX_HELD_UNTRUSTED`` datagrams while paused, so it overshoots a bound by at
most one datagram.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from cryptography import x509

from .backends import Address, ConnectionAdapter
from .config import TransportConfig
from .events import (
    NO_ERROR,
    ConnectionClosedError,
    ConnectionIdIssued,
    ConnectionIdRetired,
    ConnectionTerminated,
    HandshakeCompleted,
    StopSendingReceived,
    StreamClosedError,
    StreamDataReceived,
    StreamReset,
)

__all__ = ["Connection", "ReceiveBudget", "Stream"]

logger = logging.getLogger(__name__)

# Datagrams held for a paused (qh3) connection; beyond this they are dropped.
_MAX_HELD_DATAGRAMS = 256
# ...and for a paused connection nobody has authenticated yet.
_MAX_HELD_UNTRUSTED = 8
# Pause reasons besides stream ids (which are >= 0).
_CONNECTION_BUDGET = -1
_GLOBAL_BUDGET = -2


class ReceiveBudget:
    """Bytes buffered by a server's untrusted connections, against one limit.

    A connection charges what its streams buffer while it is untrusted; one that
    receives while the budget is spent pauses, and every paused one resumes when
    the total falls to half the limit.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._paused: set[Connection] = set()

    @property
    def spent(self) -> bool:
        return self.used > self.limit

    def charge(self, delta: int) -> None:
        self.used += delta
        if delta < 0 and self._paused and self.used <= self.limit // 2:
            paused, self._paused = self._paused, set()
            for connection in paused:
                connection._unpause(_GLOBAL_BUDGET)

    def wait(self, connection: Connection) -> None:
        self._paused.add(connection)

    def forget(self, connection: Connection) -> None:
        self._paused.discard(connection)


class _Driver(Protocol):
    """What a connection needs from the datagram loop that drives it."""

    def send_datagrams(self, datagrams: list[tuple[bytes, Address]]) -> None: ...

    def schedule_transmit(self, connection: Connection) -> None: ...

    def connection_id_issued(self, connection: Connection, cid: bytes) -> None: ...

    def connection_id_retired(self, connection: Connection, cid: bytes) -> None: ...

    def handshake_completed(self, connection: Connection) -> None: ...

    def connection_terminated(self, connection: Connection) -> None: ...


class Stream:
    """One QUIC stream (bidirectional, or one direction of a unidirectional one)."""

    def __init__(self, connection: Connection, stream_id: int) -> None:
        self._conn = connection
        self.stream_id = stream_id
        self.is_unidirectional = bool(stream_id & 0x2)
        self.is_local = bool(stream_id & 0x1) == (not connection.is_client)
        self.readable = not (self.is_unidirectional and self.is_local)
        self.writable = not (self.is_unidirectional and not self.is_local)
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._consumed = 0
        self._eof = not self.readable
        self._read_error: StreamClosedError | None = None
        self._read_waiter: asyncio.Future[None] | None = None
        self._send_error: StreamClosedError | None = None
        self._fin_sent = not self.writable
        self._write_waiter: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[int] = connection._loop.create_future()
        # The stop code is read via wait_stopped(); nobody may await it at all.
        self._stopped.add_done_callback(_consume_result)

    def __repr__(self) -> str:
        kind = "uni" if self.is_unidirectional else "bidi"
        return f"<Stream {self.stream_id} {kind}>"

    # -- reading -------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Received bytes waiting for :meth:`read`."""
        return self._buffered

    @property
    def at_eof(self) -> bool:
        """True once the peer's FIN has been read (or the stream cannot receive)."""
        return self._eof and not self._chunks

    async def read(self, max_bytes: int = -1) -> bytes:
        """Up to ``max_bytes`` bytes (all buffered when negative); ``b""`` at FIN.

        Raises :class:`StreamClosedError` after the peer's RESET_STREAM, after
        a local :meth:`stop_sending`, or when the connection is gone.
        """
        if not self.readable:
            raise StreamClosedError(self.stream_id, "stream is send-only")
        while not self._chunks and not self._eof and self._read_error is None:
            self._read_waiter = self._conn._loop.create_future()
            try:
                await self._read_waiter
            finally:
                self._read_waiter = None
        if not self._chunks:
            if self._read_error is not None:
                raise self._read_error
            return b""
        if max_bytes < 0 or max_bytes >= self._buffered:
            data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
            self._chunks.clear()
        else:
            parts: list[bytes] = []
            need = max_bytes
            while need:
                head = self._chunks[0]
                if len(head) <= need:
                    parts.append(self._chunks.popleft())
                    need -= len(head)
                else:
                    parts.append(head[:need])
                    self._chunks[0] = head[need:]
                    need = 0
            data = b"".join(parts)
        self._buffered -= len(data)
        self._consumed += len(data)
        self._conn._buffer_changed(-len(data))
        self._conn._consumed(self)
        return data

    async def readexactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; raises ``asyncio.IncompleteReadError`` at an early FIN."""
        parts: list[bytes] = []
        got = 0
        while got < n:
            chunk = await self.read(n - got)
            if not chunk:
                raise asyncio.IncompleteReadError(b"".join(parts), n)
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def stop_sending(self, error_code: int = NO_ERROR) -> None:
        """Ask the peer to stop sending (STOP_SENDING); buffered data is dropped."""
        if not self.readable or self._eof or self._read_error is not None:
            return
        self._conn._adapter.stop_sending(self.stream_id, error_code)
        self._fail_read(StreamClosedError(self.stream_id, "reading stopped locally"))
        self._conn._schedule()

    # -- writing -------------------------------------------------------------

    @property
    def send_backlog(self) -> int:
        """Bytes the stack still holds for this stream (see Capabilities)."""
        if not self.writable or self._conn.closed:
            return 0
        return self._conn._adapter.send_backlog(self.stream_id)

    @property
    def stop_sending_code(self) -> int | None:
        """The peer's STOP_SENDING code, None if it sent none."""
        return self._stopped.result() if self._stopped.done() else None

    async def wait_stopped(self) -> int:
        """Wait for the peer's STOP_SENDING and return its error code."""
        return await asyncio.shield(self._stopped)

    async def write(self, data: bytes, *, end_stream: bool = False) -> None:
        """Queue ``data`` (then FIN if ``end_stream``), waiting while the backlog is high.

        Raises :class:`StreamClosedError` once FIN was sent, after :meth:`reset`,
        after the peer's STOP_SENDING, or when the connection is gone.
        """
        self._check_writable()
        conn = self._conn
        step = conn._config.send_high_watermark
        if len(data) <= step:
            # The common case: one piece, no slicing copy.
            await self._wait_send_capacity()
            self._check_writable()
            conn._adapter.send(self.stream_id, data, end_stream=end_stream)
            if end_stream:
                self._fin_sent = True
            conn._schedule()
            return
        view = memoryview(data)
        offset = 0
        while True:
            await self._wait_send_capacity()
            self._check_writable()
            piece = bytes(view[offset : offset + step])
            offset += len(piece)
            last = offset >= len(view)
            fin = end_stream and last
            conn._adapter.send(self.stream_id, piece, end_stream=fin)
            if fin:
                self._fin_sent = True
            conn._schedule()
            if last:
                return

    async def finish(self) -> None:
        """Send FIN without more data."""
        await self.write(b"", end_stream=True)

    def reset(self, error_code: int = NO_ERROR) -> None:
        """Abandon sending (RESET_STREAM); later writes raise StreamClosedError."""
        if not self.writable or self._fin_sent or self._send_error is not None:
            return
        if self._conn.closed:
            return
        self._conn._adapter.reset(self.stream_id, error_code)
        self._fail_write(StreamClosedError(self.stream_id, "stream was reset locally"))
        self._conn._schedule()

    def _check_writable(self) -> None:
        if not self.writable:
            raise StreamClosedError(self.stream_id, "stream is receive-only")
        if self._send_error is not None:
            raise self._send_error
        if self._fin_sent:
            raise StreamClosedError(self.stream_id, "FIN already sent")

    async def _wait_send_capacity(self) -> None:
        conn = self._conn
        if conn._adapter.send_backlog(self.stream_id) <= conn._config.send_high_watermark:
            return
        self._write_waiter = conn._loop.create_future()
        conn._blocked_writers.add(self)
        try:
            await self._write_waiter
        finally:
            self._write_waiter = None
            conn._blocked_writers.discard(self)

    # -- events from the connection -----------------------------------------

    def _on_data(self, data: bytes, end_stream: bool) -> None:
        if self._read_error is not None or self._eof:
            # Reading was stopped: still hand the credit back so the peer is not
            # stuck on flow control before it sees our STOP_SENDING.
            self._consumed += len(data)
            self._conn._consumed(self)
            return
        if data:
            self._chunks.append(data)
            self._buffered += len(data)
            self._conn._buffer_changed(len(data))
        if end_stream:
            self._eof = True
        self._wake_reader()

    def _fail_read(self, error: StreamClosedError, *, discard: bool = True) -> None:
        """Fail reads; ``discard`` drops what is buffered (reset, local stop).

        When the connection ends, data that already arrived stays readable and
        the error is raised only after it (so a peer's last answer before its
        CONNECTION_CLOSE is not lost).
        """
        if self._read_error is None and not self._eof:
            self._read_error = error
        if discard:
            self._chunks.clear()
            self._conn._buffer_changed(-self._buffered)
            self._buffered = 0
        self._wake_reader()
        self._conn._stream_drained(self)

    def _fail_write(self, error: StreamClosedError) -> None:
        if self._send_error is None:
            self._send_error = error
        waiter = self._write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _on_stop_sending(self, error_code: int) -> None:
        if not self._stopped.done():
            self._stopped.set_result(error_code)
        self._fail_write(StreamClosedError(self.stream_id, "peer sent STOP_SENDING", error_code))

    def _wake_reader(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        waiter = self._write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def _finished(self) -> bool:
        recv_done = (self._eof and not self._chunks) or self._read_error is not None
        send_done = self._fin_sent or self._send_error is not None
        return recv_done and send_done


def _consume_result(future: asyncio.Future[int]) -> None:
    if not future.cancelled():
        future.exception()


class Connection:
    """A QUIC connection: open, accept and close streams.

    Created by :func:`felix_transport.connect` or handed to a
    :func:`felix_transport.serve` handler once the handshake is complete.
    """

    def __init__(
        self,
        driver: _Driver,
        adapter: ConnectionAdapter,
        config: TransportConfig,
        *,
        is_client: bool,
        budget: ReceiveBudget | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._driver = driver
        self._adapter = adapter
        self._config = config
        self.is_client = is_client
        self._streams: dict[int, Stream] = {}
        # Highest peer stream number seen per kind: late events for streams we
        # already discarded must not resurrect them.
        self._peer_seen = {False: -1, True: -1}
        self._accept_queue: deque[Stream] = deque()
        self._accept_waiter: asyncio.Future[None] | None = None
        self._blocked_writers: set[Stream] = set()
        self._handshake: asyncio.Future[None] = self._loop.create_future()
        self._handshake.add_done_callback(_consume_exception)
        self._closed = asyncio.Event()
        self._closing = False
        self.termination: ConnectionTerminated | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._keepalive: asyncio.TimerHandle | None = None
        self._keepalive_interval: float | None = None
        # Receive pause (backends without per-stream credit only).
        self._over_limit: set[int] = set()
        self._held: deque[tuple[bytes, Address]] = deque()
        self.dropped_datagrams = 0
        self._trickle: asyncio.TimerHandle | None = None
        self.refused = False
        # Before authentication (see the module docstring).
        self._trusted = is_client or config.preauth_stream_window is None
        self._budget = None if self._trusted else budget
        self._buffered_total = 0
        self._charged = 0  # the part of _buffered_total charged to _budget

    def __repr__(self) -> str:
        role = "client" if self.is_client else "server"
        return f"<Connection {self._adapter.impl} {role} peer={self.peer_address}>"

    # -- public API ------------------------------------------------------------

    @property
    def impl(self) -> str:
        """The backend carrying this connection (``qh3`` or ``aioquic``)."""
        return self._adapter.impl

    @property
    def adapter(self) -> ConnectionAdapter:
        """The sans-IO adapter (for capabilities and diagnostics)."""
        return self._adapter

    @property
    def peer_address(self) -> Address | None:
        """The peer's UDP address."""
        return self._adapter.peer_address

    @property
    def alpn_protocol(self) -> str | None:
        """The negotiated ALPN protocol (None when none was)."""
        return self._adapter.alpn_protocol

    @property
    def peer_certificate(self) -> x509.Certificate | None:
        """The peer's verified leaf certificate: the server's on a client connection;
        on a server, the client's when the server asked for one (``client_ca_pem``)."""
        der = self._adapter.peer_certificate_der
        return None if der is None else x509.load_der_x509_certificate(der)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called or the connection terminated."""
        return self._closing or self.termination is not None

    @property
    def receive_paused(self) -> bool:
        """True while input is paused for a slow reader (qh3 only)."""
        return bool(self._over_limit)

    @property
    def held_datagrams(self) -> int:
        """Datagrams held while input is paused."""
        return len(self._held)

    @property
    def buffered_bytes(self) -> int:
        """Received bytes waiting for the application in all of this connection's streams."""
        return self._buffered_total

    @property
    def trusted(self) -> bool:
        """False while the pre-authentication bounds apply (see :meth:`trust`)."""
        return self._trusted

    def trust(self) -> None:
        """Lift the pre-authentication bounds: the application has authenticated
        the peer. Streams get ``stream_receive_window`` and the connection's own
        windows apply from now on; idempotent."""
        if self._trusted:
            return
        self._trusted = True
        self._release_budget()
        if self.termination is not None:
            return
        window = self._config.stream_receive_window
        self._adapter.set_receive_limits(window, None)
        for reason in list(self._over_limit):
            stream = self._streams.get(reason)
            if stream is None or stream._buffered <= window // 2:
                self._over_limit.discard(reason)
        if not self._over_limit:
            self._resume_input()
        self._schedule()

    async def wait_handshake(self) -> None:
        """Wait for the handshake; raises ConnectionClosedError if it fails."""
        await asyncio.shield(self._handshake)

    async def open_bidi_stream(self) -> Stream:
        """Open a bidirectional stream (nothing is sent until the first write)."""
        return await self._open(unidirectional=False)

    async def open_uni_stream(self) -> Stream:
        """Open a unidirectional (send-only) stream."""
        return await self._open(unidirectional=True)

    async def accept_stream(self) -> Stream:
        """The next stream the peer opened (check ``Stream.is_unidirectional``)."""
        while not self._accept_queue:
            if self.termination is not None:
                raise self._closed_error()
            self._accept_waiter = self._loop.create_future()
            try:
                await self._accept_waiter
            finally:
                self._accept_waiter = None
        return self._accept_queue.popleft()

    def close(self, code: int = NO_ERROR, reason: str = "") -> None:
        """Send an application CONNECTION_CLOSE with ``code`` and ``reason``; idempotent."""
        self._close(code, reason, transport=False)

    def _close(self, code: int, reason: str, *, transport: bool) -> None:
        if self._closing or self.termination is not None:
            return
        # Put what the application already wrote on the wire first: once the
        # stack is closing it sends nothing but CONNECTION_CLOSE. Not during the
        # handshake: a refused client must get the close, not our first flight.
        if self._handshake.done():
            self._transmit()
        self._closing = True
        self._adapter.close(code, reason, transport=transport)
        self._transmit()

    async def wait_closed(self) -> None:
        """Wait until the connection has terminated (after draining)."""
        await self._closed.wait()

    # -- driven by the datagram loop ---------------------------------------

    def _datagrams_received(self, runs: Sequence[tuple[Address, list[bytes]]], now: float) -> None:
        if self.termination is not None:
            return
        for addr, datagrams in runs:
            # Untrusted: one datagram at a time, so a bound is checked after each.
            pieces = [datagrams] if self._trusted else [[data] for data in datagrams]
            for piece in pieces:
                if self._over_limit:
                    self._hold(piece, addr)
                    continue
                try:
                    self._adapter.receive_datagrams(piece, addr, now)
                except Exception:
                    # One connection's stack failure must not take the loop (and
                    # every other connection on the socket) down with it.
                    logger.warning("%r: stack failed on receive", self, exc_info=True)
                self._process_events()
                if self.termination is not None:
                    return

    def _hold(self, datagrams: list[bytes], addr: Address) -> None:
        limit = _MAX_HELD_DATAGRAMS if self._trusted else _MAX_HELD_UNTRUSTED
        for data in datagrams:
            if len(self._held) < limit:
                self._held.append((data, addr))
            else:
                self.dropped_datagrams += 1

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.termination is not None:
            return
        try:
            self._adapter.handle_timer(self._loop.time())
        except Exception:
            logger.warning("%r: stack failed in its timer", self, exc_info=True)
        self._process_events()
        self._transmit()

    def _transmit(self) -> None:
        if self.termination is not None:
            return
        now = self._loop.time()
        try:
            datagrams = self._adapter.datagrams_to_send(now)
        except Exception as exc:
            # Known case: a qh3 2.1 server cannot build its Handshake flight
            # for an aioquic 1.7 client's Initial ("packet builder capacity
            # exhausted"); after loss recovery (about 1.3 s on loopback) it
            # succeeds, so keep the connection rather than fail it.
            logger.debug("%r: stack failed to build packets: %s", self, exc)
            datagrams = []
        if datagrams:
            self._driver.send_datagrams(datagrams)
        self._arm_timer()
        if self._blocked_writers:
            self._wake_writers()

    def _schedule(self) -> None:
        self._driver.schedule_transmit(self)

    def _arm_timer(self) -> None:
        when = self._adapter.get_timer()
        if when == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = when
        if when is not None:
            self._timer = self._loop.call_at(when, self._on_timer)

    def _wake_writers(self) -> None:
        low = self._config.send_low_watermark
        backlog = self._adapter.send_backlog
        for stream in list(self._blocked_writers):
            if backlog(stream.stream_id) <= low:
                self._blocked_writers.discard(stream)
                stream._wake_writer()

    # -- events ----------------------------------------------------------------

    def _process_events(self) -> None:
        adapter = self._adapter
        while (event := adapter.next_event()) is not None:
            if isinstance(event, StreamDataReceived):
                stream = self._stream_for_event(event.stream_id)
                if stream is not None:
                    stream._on_data(event.data, event.end_stream)
                    self._check_receive_bound(stream)
                    self._maybe_discard(stream)
            elif isinstance(event, StreamReset):
                stream = self._stream_for_event(event.stream_id)
                if stream is not None:
                    stream._fail_read(
                        StreamClosedError(event.stream_id, "reset by peer", event.error_code)
                    )
                    self._maybe_discard(stream)
            elif isinstance(event, StopSendingReceived):
                stream = self._stream_for_event(event.stream_id)
                if stream is not None:
                    stream._on_stop_sending(event.error_code)
                    self._maybe_discard(stream)
            elif isinstance(event, HandshakeCompleted):
                self._on_handshake()
            elif isinstance(event, ConnectionTerminated):
                self._terminate(event)
                return
            elif isinstance(event, ConnectionIdIssued):
                self._driver.connection_id_issued(self, event.connection_id)
            elif isinstance(event, ConnectionIdRetired):
                self._driver.connection_id_retired(self, event.connection_id)

    def _stream_for_event(self, stream_id: int) -> Stream | None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            return stream
        peer_initiated = bool(stream_id & 0x1) == self.is_client
        if not peer_initiated:
            return None  # a local stream we already finished with
        uni = bool(stream_id & 0x2)
        number = stream_id >> 2
        if number <= self._peer_seen[uni]:
            return None  # a peer stream we already finished with
        # Opening stream N implicitly opens every lower-numbered stream of its type
        # (RFC 9000 section 3.2): their data may simply arrive later, so they are
        # created now, in order, and accepted in order.
        kind = stream_id & 0x3
        for n in range(self._peer_seen[uni] + 1, number + 1):
            implied = Stream(self, (n << 2) | kind)
            self._streams[implied.stream_id] = implied
            self._accept_queue.append(implied)
        self._peer_seen[uni] = number
        waiter = self._accept_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return self._streams[stream_id]

    def _on_handshake(self) -> None:
        if self._handshake.done():
            return
        self._handshake.set_result(None)
        self._keepalive_interval = self._negotiated_keepalive()
        if self._keepalive_interval is not None:
            self._keepalive = self._loop.call_later(self._keepalive_interval, self._send_keepalive)
        self._driver.handshake_completed(self)

    def _negotiated_keepalive(self) -> float | None:
        """The configured keep-alive interval, capped at a third of the idle timeout
        both ends agreed on (the smaller of ours and the peer's): a peer with a
        shorter idle timeout than ours must still hear from us in time."""
        interval = self._config.keepalive_interval
        if interval is None:
            return None
        idle = self._config.idle_timeout
        peer = self._adapter.peer_idle_timeout()
        if peer is not None:
            idle = min(idle, peer)
        return min(interval, idle / 3)

    def _send_keepalive(self) -> None:
        if self.closed:
            return
        self._adapter.ping()
        self._transmit()
        interval = self._keepalive_interval
        assert interval is not None
        self._keepalive = self._loop.call_later(interval, self._send_keepalive)

    def _terminate(self, event: ConnectionTerminated) -> None:
        if self.termination is not None:
            return
        self.termination = event
        for handle in (self._timer, self._keepalive, self._trickle):
            if handle is not None:
                handle.cancel()
        self._timer = self._keepalive = self._trickle = None
        error = self._closed_error()
        if not self._handshake.done():
            self._handshake.set_exception(error)
        for stream in list(self._streams.values()):
            gone = StreamClosedError(stream.stream_id, f"connection closed: {error}")
            if stream.readable:
                stream._fail_read(gone, discard=False)
            stream._fail_write(gone)
            if not stream._stopped.done():
                stream._stopped.cancel()
        self._streams.clear()
        self._over_limit.clear()
        self._held.clear()
        self._release_budget()
        self._blocked_writers.clear()
        waiter = self._accept_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._closed.set()
        logger.debug("%r terminated: %#x %s", self, event.error_code, event.reason_phrase)
        self._driver.connection_terminated(self)

    def _closed_error(self) -> ConnectionClosedError:
        event = self.termination
        if event is None:
            return ConnectionClosedError(None, "connection closing")
        return ConnectionClosedError(event.error_code, event.reason_phrase)

    # -- stream bookkeeping ------------------------------------------------

    async def _open(self, *, unidirectional: bool) -> Stream:
        if not self._handshake.done():
            await self.wait_handshake()
        if self.closed:
            raise self._closed_error()
        stream_id = self._adapter.open_stream(unidirectional=unidirectional)
        stream = Stream(self, stream_id)
        self._streams[stream_id] = stream
        return stream

    def _consumed(self, stream: Stream) -> None:
        if self.termination is not None:
            return
        if self._adapter.consumed(stream.stream_id, stream._consumed):
            self._schedule()
        self._stream_drained(stream)
        self._maybe_discard(stream)

    def _stream_window(self) -> int:
        window = self._config.preauth_stream_window
        if self._trusted or window is None:
            return self._config.stream_receive_window
        return window

    def _check_receive_bound(self, stream: Stream) -> None:
        if not self._trusted:
            self._check_budgets()
        if self._adapter.capabilities.per_stream_receive_credit:
            return
        if stream._buffered > self._stream_window():
            self._pause(stream.stream_id)

    def _pause(self, reason: int) -> None:
        if not self._over_limit and self.termination is None:
            logger.debug("%r: pausing input (%d over its bound)", self, reason)
            self._trickle = self._loop.call_later(
                self._config.idle_timeout / 3, self._feed_one_held
            )
        self._over_limit.add(reason)

    def _unpause(self, reason: int) -> None:
        if reason not in self._over_limit:
            return
        self._over_limit.discard(reason)
        if not self._over_limit:
            self._resume_input()

    def _check_budgets(self) -> None:
        limit = self._config.preauth_connection_budget
        if self._buffered_total > limit:
            self._pause(_CONNECTION_BUDGET)
        elif self._buffered_total <= limit // 2:
            self._unpause(_CONNECTION_BUDGET)
        budget = self._budget
        if budget is not None and budget.spent and self._buffered_total > 0:
            budget.wait(self)
            self._pause(_GLOBAL_BUDGET)

    def _buffer_changed(self, delta: int) -> None:
        self._buffered_total += delta
        if self._budget is not None and self.termination is None:
            self._charged += delta
            self._budget.charge(delta)

    def _release_budget(self) -> None:
        budget = self._budget
        if budget is None:
            return
        self._budget = None
        budget.forget(self)
        charged, self._charged = self._charged, 0
        if charged:
            budget.charge(-charged)

    def _stream_drained(self, stream: Stream) -> None:
        if not self._trusted:
            if _CONNECTION_BUDGET in self._over_limit:
                self._check_budgets()
            if _GLOBAL_BUDGET in self._over_limit and self._buffered_total == 0:
                # Everything it sent was read: let it make progress (it pauses
                # again on its next data while the budget is still spent).
                if self._budget is not None:
                    self._budget.forget(self)
                self._unpause(_GLOBAL_BUDGET)
        if stream.stream_id not in self._over_limit:
            return
        if stream._buffered > self._stream_window() // 2:
            return
        self._unpause(stream.stream_id)

    def _resume_input(self) -> None:
        if self._trickle is not None:
            self._trickle.cancel()
            self._trickle = None
        if not self._held or self.termination is not None:
            return
        held = list(self._held)
        self._held.clear()
        # Feed in socket-sized batches so that a stream going over its bound
        # again pauses input after at most one batch.
        batch = self._config.max_datagrams_per_wakeup
        runs: list[tuple[Address, list[bytes]]] = []
        for data, addr in held:
            if runs and runs[-1][0] == addr and len(runs[-1][1]) < batch:
                runs[-1][1].append(data)
            else:
                runs.append((addr, [data]))
        # Feeding may pause input again; the rest is then held once more.
        self._datagrams_received(runs, self._loop.time())
        self._schedule()

    def _feed_one_held(self) -> None:
        self._trickle = None
        if not self._over_limit or self.termination is not None:
            return
        if self._held:
            # The newest: what the peer sent last (its latest ACKs, or its
            # CONNECTION_CLOSE) matters most; older stream data is resent anyway.
            data, addr = self._held.pop()
            try:
                self._adapter.receive_datagrams([data], addr, self._loop.time())
            except Exception:
                logger.warning("%r: stack failed on receive", self, exc_info=True)
            self._process_events()
            self._transmit()
        if self._over_limit and self.termination is None:
            self._trickle = self._loop.call_later(
                self._config.idle_timeout / 3, self._feed_one_held
            )

    def _maybe_discard(self, stream: Stream) -> None:
        if stream._finished and stream.stream_id in self._streams:
            if stream.stream_id in self._over_limit:
                return
            del self._streams[stream.stream_id]
            self._adapter.forget_stream(stream.stream_id)


def _consume_exception(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
