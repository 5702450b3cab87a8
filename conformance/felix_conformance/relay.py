"""A QUIC man-in-the-middle between Felix clients and an upstream broker.

Toward clients it presents its own certificate (from its own CA); toward the
upstream it verifies normally. Every client stream is mirrored by one upstream
stream of the same kind, every broker-opened stream by one toward the client,
and bytes are pumped both ways. Ends are mirrored too: FIN, RESET_STREAM (with
its code), STOP_SENDING, and the connection close code.

Two uses:
- observing (the recorder): bytes are forwarded untouched as they arrive, and a
  copy is framed for the `RelayObserver`;
- rewriting (tests' deliberately broken brokers): whole frames are passed
  through a `FrameRewriter`, which returns the frames to forward instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from felix_transport import (
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
from felix_wire.frame import MAX_ENCODABLE_PAYLOAD, Frame, FrameReader
from felix_wire.wire_errors import FrameError

from .target import Target

__all__ = ["FrameRewriter", "Relay", "RelayObserver", "StreamRef"]

_log = logging.getLogger(__name__)

TO_BROKER = "to_broker"
TO_CLIENT = "to_client"


@dataclass(frozen=True)
class StreamRef:
    """A relayed stream: its connection number and its id on the client side."""

    conn: int
    stream_id: int
    opened_by: str  # "client" | "broker"
    unidirectional: bool


class RelayObserver(Protocol):
    def stream_opened(self, ref: StreamRef) -> None: ...

    def frame(self, ref: StreamRef, direction: str, frame: Frame) -> None: ...

    def stream_ended(self, ref: StreamRef, direction: str, kind: str, code: int | None) -> None: ...

    def connection_closed(self, conn: int, code: int | None) -> None: ...


# (stream, direction, frame) -> frames to forward in its place.
FrameRewriter = Callable[[StreamRef, str, Frame], Sequence[bytes]]


class Relay:
    def __init__(
        self,
        upstream: Target,
        *,
        observer: RelayObserver | None = None,
        rewriter: FrameRewriter | None = None,
    ) -> None:
        self.upstream = upstream
        self.observer = observer
        self.rewriter = rewriter
        ca = generate_ca("Felix conformance relay CA")
        leaf = generate_leaf(ca, dns_names=("localhost",), ip_addresses=("127.0.0.1", "::1"))
        self.ca_pem = ca.cert_pem
        self._chain = leaf.cert_pem + ca.cert_pem
        self._key = leaf.key_pem
        self._server: Server | None = None
        self._connections = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        config = TransportConfig.server(self._chain, self._key)
        self._server = await serve(config, host, port, self._on_connection)
        address = self._server.address
        return str(address[0]), int(address[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _on_connection(self, client: Connection) -> None:
        self._connections += 1
        conn = self._connections
        try:
            broker = await self.upstream.connect()
        except Exception:
            _log.exception("relay: upstream connection failed")
            client.close(0x1, "upstream unreachable")
            return
        tasks: set[asyncio.Task[None]] = set()

        def spawn(coro: Coroutine[Any, Any, None]) -> None:
            task = asyncio.get_running_loop().create_task(coro)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        spawn(self._accept_loop(conn, client, broker, "client", spawn))
        spawn(self._accept_loop(conn, broker, client, "broker", spawn))
        try:
            done, _ = await asyncio.wait(
                [
                    asyncio.ensure_future(client.wait_closed()),
                    asyncio.ensure_future(broker.wait_closed()),
                ],
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            # Let pumps flush what already arrived before mirroring the close.
            await asyncio.sleep(0.05)
            code = None
            if broker.termination is not None:
                code = broker.termination.error_code
                client.close(code, broker.termination.reason_phrase)
            if client.termination is not None:
                broker.close(client.termination.error_code)
            broker.close()
            client.close(code or 0)
            for task in list(tasks):
                task.cancel()
            if self.observer is not None:
                self.observer.connection_closed(conn, code)
            del done

    async def _accept_loop(
        self,
        conn: int,
        source: Connection,
        sink: Connection,
        opened_by: str,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        while True:
            try:
                incoming = await source.accept_stream()
                if incoming.is_unidirectional:
                    outgoing = await sink.open_uni_stream()
                else:
                    outgoing = await sink.open_bidi_stream()
            except (ConnectionClosedError, StreamClosedError):
                return
            client_side = incoming if opened_by == "client" else outgoing
            ref = StreamRef(conn, client_side.stream_id, opened_by, incoming.is_unidirectional)
            if self.observer is not None:
                self.observer.stream_opened(ref)
            forward = TO_BROKER if opened_by == "client" else TO_CLIENT
            backward = TO_CLIENT if opened_by == "client" else TO_BROKER
            spawn(self._pump(ref, forward, incoming, outgoing))
            if not incoming.is_unidirectional:
                spawn(self._pump(ref, backward, outgoing, incoming))

    async def _pump(self, ref: StreamRef, direction: str, src: Stream, dst: Stream) -> None:
        # Framing only to observe or rewrite; the bound is the protocol's, not a policy.
        reader = FrameReader(max_payload=MAX_ENCODABLE_PAYLOAD)
        framing = True
        while True:
            try:
                data = await src.read()
            except StreamClosedError as exc:
                if exc.error_code is not None:
                    self._ended(ref, direction, "reset", exc.error_code)
                    dst.reset(exc.error_code)
                return
            if not data:
                self._ended(ref, direction, "fin", None)
                with contextlib.suppress(StreamClosedError):
                    await dst.finish()
                return
            out: list[bytes] = []
            frames: list[Frame] = []
            if framing:
                try:
                    frames = reader.feed(data)
                except FrameError:
                    framing = False  # malformed input: pass the rest through untouched
            if self.rewriter is not None and framing:
                for frame in frames:
                    self._observe(ref, direction, frame)
                    out.extend(self.rewriter(ref, direction, frame))
            else:
                for frame in frames:
                    self._observe(ref, direction, frame)
                out.append(data)
            try:
                for chunk in out:
                    await dst.write(chunk)
            except StreamClosedError as exc:
                # The far side stopped reading: tell the sender the same.
                src.stop_sending(exc.error_code or 0)
                return

    def _observe(self, ref: StreamRef, direction: str, frame: Frame) -> None:
        if self.observer is not None:
            self.observer.frame(ref, direction, frame)

    def _ended(self, ref: StreamRef, direction: str, kind: str, code: int | None) -> None:
        if self.observer is not None:
            self.observer.stream_ended(ref, direction, kind, code)
