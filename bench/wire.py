"""The benchmarks' raw wire stream: frames out, decoded frames in, nothing in between.

Benchmarks measure the broker, so they drive it with bare frames rather than the
client library; `open_session` dials, authenticates one bidirectional stream and
returns it as a `WireStream`. (The tests have their own, assertion-laden client in
tests/support/wire.py; benchmarks never import tests.)
"""

from __future__ import annotations

from felix_transport import Connection, Stream, TransportConfig, connect
from felix_wire.codec import Decoded, decode_frame, encode_frame
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth
from felix_wire.messages import AuthOk, Message

# What the official client 0.6.2 offers in its auth, as seen on the wire.
OFFICIAL_FLAGS = 0x1FFF
OFFICIAL_FEATURES = 0xFB77FFFF | (0xF << 32)


class WireStream:
    """One stream: `send` encodes, `recv` returns the next decoded frame."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.reader = FrameReader()
        self.pending: list[Decoded] = []

    async def send(self, message: Message) -> None:
        await self.stream.write(encode_frame(message))

    async def recv(self) -> Decoded:
        """The next frame; EOFError once the stream ended."""
        while not self.pending:
            data = await self.stream.read()
            if not data:
                raise EOFError("stream ended")
            self.pending.extend(decode_frame(f) for f in self.reader.feed(data))
        return self.pending.pop(0)


async def open_session(
    ca_pem: bytes,
    port: int,
    tenant: str,
    token: str,
    *,
    host: str = "127.0.0.1",
    flags: int = OFFICIAL_FLAGS,
    features: int = OFFICIAL_FEATURES,
) -> tuple[Connection, WireStream]:
    """A new connection to `host`:`port` and one stream the broker authenticated."""
    connection = await connect(TransportConfig.client(ca_pem), host, port)
    stream = WireStream(await connection.open_bidi_stream())
    await stream.send(client_auth(tenant, token, client_flags=flags, client_features=features))
    answer = await stream.recv()
    assert isinstance(answer, AuthOk), answer
    return connection, stream
