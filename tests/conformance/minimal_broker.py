"""A deliberately minimal, probe-style Felix broker for testing the kit's robustness.

Built on felix_wire + felix_transport only: it answers `auth` with an `auth_ok`
advertising nothing (no flags, no features) and does little else. What it does
with any other frame is its `mode`:

- "error": answers every further frame with `error` (a message, no code), then ends
  the stream when the client does;
- "close": ends the stream at once (FIN) without answering;
- "silent": never answers and keeps the stream open (the kit's step timeouts
  must end the case).

A frame it cannot even frame (bad magic, an oversize header) resets the stream.
"""

from __future__ import annotations

import asyncio
import contextlib

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
from felix_wire.codec import decode_payload, encode_frame
from felix_wire.frame import FrameReader
from felix_wire.messages import Auth, AuthOk, Error
from felix_wire.wire_errors import WireError

MODES = ("error", "close", "silent")


class MinimalBroker:
    def __init__(self, mode: str = "error") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        ca = generate_ca("minimal broker CA")
        leaf = generate_leaf(ca, dns_names=("localhost",), ip_addresses=("127.0.0.1",))
        self.ca_pem = ca.cert_pem
        self._config = TransportConfig.server(leaf.cert_pem + ca.cert_pem, leaf.key_pem)
        self._server: Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.frames_seen = 0

    async def start(self) -> tuple[str, int]:
        self._server = await serve(self._config, "127.0.0.1", 0, self._on_connection)
        host, port = self._server.address[:2]
        return str(host), int(port)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _on_connection(self, connection: Connection) -> None:
        with contextlib.suppress(ConnectionClosedError):
            while not connection.closed:
                stream = await connection.accept_stream()
                task = asyncio.create_task(self._serve_stream(stream))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _serve_stream(self, stream: Stream) -> None:
        reader = FrameReader()
        authed = False
        with contextlib.suppress(StreamClosedError, ConnectionClosedError):
            while True:
                data = await stream.read()
                if not data:
                    if not stream.is_unidirectional:
                        await stream.finish()
                    return
                try:
                    frames = reader.feed(data)
                except WireError:
                    stream.reset(1)
                    return
                for frame in frames:
                    self.frames_seen += 1
                    try:
                        message = decode_payload(frame.flags, frame.payload)
                    except WireError:
                        message = None
                    if not authed and isinstance(message, Auth):
                        authed = True
                        if not stream.is_unidirectional:
                            await stream.write(encode_frame(AuthOk(server_flags=0)))
                        continue
                    if self.mode == "close":
                        await stream.finish()
                        return
                    if self.mode == "error" and not stream.is_unidirectional:
                        answer = Error(message="not served here")
                        await stream.write(encode_frame(answer))
