"""The named connections and streams of one case while it runs.

Each stream keeps its own incremental frame reader (a QUIC read is not a
frame) and hands out one event at a time: a decoded frame, the peer's FIN, its
RESET_STREAM, or the connection going away. Every frame and event is written to
the case's wire log as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from felix_transport import Connection, ConnectionClosedError, Stream, StreamClosedError
from felix_wire.frame import FrameReader
from felix_wire.wire_errors import FrameError

from .frames import Received, decode_received
from .schema import TranscriptError
from .wirelog import WireLog

__all__ = ["Session", "StreamEvent", "StreamIO"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamEvent:
    kind: str  # "frame" | "end" | "reset" | "closed" | "timeout" | "bad_frame"
    frame: Received | None = None
    code: int | None = None
    detail: str = ""

    def describe(self) -> str:
        if self.frame is not None:
            return self.frame.describe()
        code = "" if self.code is None else f" code {self.code}"
        return f"{self.kind}{code} {self.detail}".strip()


class StreamIO:
    """One named stream: frames in (decoded, queued) and bytes out."""

    def __init__(self, name: str, stream: Stream, log: WireLog) -> None:
        self.name = name
        self.stream = stream
        self._log = log
        self._reader = FrameReader()
        self._events: deque[StreamEvent] = deque()
        self._finished = False  # a terminal event was queued: nothing more comes

    async def write(self, data: bytes, text: str, *, fin: bool = False) -> None:
        self._log.sent(self.name, text + (" [FIN]" if fin else ""))
        await self.stream.write(data, end_stream=fin)

    async def next_event(self, timeout: float) -> StreamEvent:
        """The next frame or stream event; a "timeout" event when nothing came."""
        try:
            async with asyncio.timeout(timeout):
                while not self._events:
                    if self._finished:
                        # After the end nothing more arrives; report the end again.
                        return StreamEvent("end", detail="(already ended)")
                    await self._read_more()
        except TimeoutError:
            return StreamEvent("timeout", detail=f"nothing within {timeout:g}s")
        return self._events.popleft()

    async def _read_more(self) -> None:
        try:
            data = await self.stream.read()
        except StreamClosedError as exc:
            # Only the peer's RESET_STREAM carries a code; a connection going away does not.
            kind = "closed" if exc.error_code is None else "reset"
            event = StreamEvent(kind, code=exc.error_code, detail=str(exc))
            self._terminal(event)
            return
        if not data:
            try:
                self._reader.close()
            except FrameError as exc:
                self._queue(StreamEvent("bad_frame", detail=f"stream ended mid-frame: {exc}"))
            self._terminal(StreamEvent("end"))
            return
        try:
            frames = self._reader.feed(data)
        except FrameError as exc:
            # A bad header: nothing after it can be framed, so the stream is over for us.
            self._terminal(StreamEvent("bad_frame", detail=str(exc)))
            return
        for frame in frames:
            received = decode_received(frame.flags, frame.payload)
            self._queue(StreamEvent("frame", frame=received))

    def _queue(self, event: StreamEvent) -> None:
        self._log.received(self.name, event.describe())
        self._events.append(event)

    def _terminal(self, event: StreamEvent) -> None:
        self._queue(event)
        self._finished = True


class Session:
    """The connections and streams of one case, by the names the transcript gives."""

    def __init__(
        self,
        connect: Callable[[str | None], Awaitable[Connection]],
        log: WireLog,
        handshake: Callable[[str | None, tuple[str, ...]], Awaitable[Connection]] | None = None,
    ) -> None:
        # HOST:PORT of a fleet broker, or None: the target -> a connection
        self._connect = connect
        # The same, offering the given ALPN ids (none when empty), kept alive.
        self._handshake = handshake
        self.log = log
        self.connections: dict[str, Connection] = {}
        self.addresses: dict[str, str | None] = {}  # where each connection went
        self.streams: dict[str, StreamIO] = {}

    async def connection(self, name: str, address: str | None = None) -> Connection:
        """The named connection, made on first use: to `address` if given, else to
        the target. A connection cannot move: naming another address for one
        already made is the transcript's mistake (TranscriptError)."""
        connection = self.connections.get(name)
        if connection is None:
            connection = await self._connect(address)
            self.connections[name] = connection
            self.addresses[name] = address
            self.log.note(name, f"connected to {address}" if address else "connected")
        elif address is not None and address != self.addresses[name]:
            raise TranscriptError(
                name,
                f"connection {name} already goes to {self.addresses[name] or 'the target'}, "
                f"not {address}",
            )
        return connection

    async def handshake(self, name: str, address: str | None, alpn: tuple[str, ...]) -> Connection:
        """A new connection `name` made offering exactly `alpn` (none when empty);
        what the handshake fails with propagates (TargetUnreachableError)."""
        if name in self.connections:
            raise TranscriptError(name, f"connection {name} is already made")
        if self._handshake is None:
            raise TranscriptError(name, "this session cannot make handshakes of its own")
        offered = "none" if not alpn else ", ".join(alpn)
        self.log.note(name, f"handshake offering ALPN {offered}")
        connection = await self._handshake(address, alpn)
        self.connections[name] = connection
        self.addresses[name] = address
        self.log.note(name, f"connected (ALPN selected: {connection.alpn_protocol or 'none'})")
        return connection

    async def open(
        self, conn: str, name: str, direction: str, address: str | None = None
    ) -> StreamIO:
        connection = await self.connection(conn, address)
        if direction == "uni":
            stream = await connection.open_uni_stream()
        else:
            stream = await connection.open_bidi_stream()
        self.log.note(name, f"opened {direction} stream {stream.stream_id} on {conn}")
        io = self.streams[name] = StreamIO(name, stream, self.log)
        return io

    async def accept(self, conn: str, name: str, timeout: float) -> StreamIO:
        connection = await self.connection(conn)
        async with asyncio.timeout(timeout):
            stream = await connection.accept_stream()
        kind = "uni" if stream.is_unidirectional else "bidi"
        self.log.note(name, f"accepted broker-opened {kind} stream {stream.stream_id} on {conn}")
        io = self.streams[name] = StreamIO(name, stream, self.log)
        return io

    def close(self) -> None:
        for name, connection in self.connections.items():
            with contextlib.suppress(ConnectionClosedError, StreamClosedError):
                connection.close()
            _log.debug("closed connection %s", name)
        self.connections.clear()
        self.streams.clear()
