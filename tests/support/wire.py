"""The tests' one raw wire client: real QUIC, TLS and tokens, frames in and out.

`WireClient` dials a broker under test and opens streams on one connection;
`WireStream` sends messages (or raw bytes, for malformed frames) and receives decoded
frames. Nothing here knows a capability: broker, cache and group tests build their
requests from the generated layer and assert on what comes back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from felix_broker.cli import full_rights
from felix_transport import Connection, Stream, TransportConfig, connect
from felix_wire.codec import Decoded, decode_frame, encode_frame
from felix_wire.features import Feature
from felix_wire.flags import Flag
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth
from felix_wire.messages import AuthOk, EventStreamHello, Message

TENANT = "t1"
NS = "default"
# What the official client 0.6.2 offers in its auth, as seen on the wire.
OFFICIAL_FLAGS = 0x1FFF
OFFICIAL_FEATURES = 0xFB77FFFF | (0xF << 32)
ALL_FLAGS = 0x7FFF


class Issuer(Protocol):
    def mint(self, tenant: str, *, subject: str, perms: list[str], **claims: Any) -> str: ...


class BrokerUnderTest(Protocol):
    """What a raw client needs of a broker: where to dial, which CA, who signs tokens."""

    @property
    def quic_port(self) -> int: ...

    @property
    def ca_path(self) -> Path | None: ...

    @property
    def issuer(self) -> Issuer | None: ...


@dataclass(frozen=True)
class BrokerProcess:
    """A broker running in another process, known by its QUIC port and its data folder
    (where it keeps its development CA and token keys)."""

    quic_port: int
    data_dir: Path

    @property
    def ca_path(self) -> Path:
        return self.data_dir / "tls" / "ca.pem"

    @property
    def issuer(self) -> Issuer:
        from felix_common.tokens import DevIssuer

        return DevIssuer.load_or_create(self.data_dir)


def token(
    broker: BrokerUnderTest,
    *,
    perms: list[str] | None = None,
    tenant: str = TENANT,
    **claims: Any,
) -> str:
    """A token signed by the broker's issuer; full rights in `tenant` unless `perms`."""
    assert broker.issuer is not None
    return broker.issuer.mint(
        tenant,
        subject=claims.pop("subject", "tester"),
        perms=full_rights(tenant) if perms is None else perms,
        **claims,
    )


class WireStream:
    """One stream: send values, receive decoded frames."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.reader = FrameReader()
        self._pending: list[Decoded] = []

    async def send(self, value: Message | bytes) -> None:
        """Send a message, a binary frame value, or bytes exactly as given."""
        await self.stream.write(value if isinstance(value, bytes) else encode_frame(value))

    async def recv(self, timeout: float = 5.0) -> Decoded:
        async def next_one() -> Decoded:
            while not self._pending:
                data = await self.stream.read()
                if not data:
                    raise EOFError("stream ended")
                self._pending.extend(decode_frame(f) for f in self.reader.feed(data))
            return self._pending.pop(0)

        # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
        # lands as the read completes, and a cancelled test loop then never ends.
        async with asyncio.timeout(timeout):
            return await next_one()

    async def expect_end(self, timeout: float = 5.0) -> None:
        """The broker finished the stream (FIN) with nothing more to read."""
        async with asyncio.timeout(timeout):
            data = await self.stream.read()
        assert data == b"", f"expected the end of the stream, got {data!r}"

    async def nothing(self, wait: float = 0.3) -> None:
        """Nothing arrives within `wait` seconds."""
        try:
            got = await self.recv(timeout=wait)
        except TimeoutError:
            return
        raise AssertionError(f"expected no answer, got {got!r}")


class WireClient:
    """One QUIC connection to a broker under test."""

    def __init__(self, broker: BrokerUnderTest, connection: Connection) -> None:
        self.broker = broker
        self.connection = connection
        # The features the broker advertised on the last `session` (both words).
        self.server_features = 0

    @classmethod
    async def connect(cls, broker: BrokerUnderTest, **options: Any) -> WireClient:
        assert broker.ca_path is not None
        config = TransportConfig.client(broker.ca_path.read_bytes(), **options)
        return cls(broker, await connect(config, "127.0.0.1", broker.quic_port))

    async def stream(self) -> WireStream:
        """A new bidirectional stream, not authenticated."""
        return WireStream(await self.connection.open_bidi_stream())

    async def authed(
        self,
        *,
        flags: int | None = OFFICIAL_FLAGS,
        features: int = OFFICIAL_FEATURES,
        tok: str | None = None,
        tenant: str = TENANT,
        perms: list[str] | None = None,
    ) -> tuple[WireStream, Decoded]:
        """A new stream that sent auth, and the broker's answer to it (whatever it is)."""
        stream = await self.stream()
        credential = tok or token(self.broker, perms=perms, tenant=tenant)
        await stream.send(
            client_auth(tenant, credential, client_flags=flags, client_features=features)
        )
        return stream, await stream.recv()

    async def session(self, **auth: Any) -> WireStream:
        """A new stream the broker authenticated (auth_ok); remembers its features."""
        stream, answer = await self.authed(**auth)
        assert isinstance(answer, AuthOk), answer
        self.server_features = (answer.server_features or 0) | (
            (answer.server_features_hi or 0) << 32
        )
        return stream

    async def request(self, message: Message, **auth: Any) -> Decoded:
        """One request on a fresh authenticated stream, and its answer."""
        stream = await self.session(**auth)
        await stream.send(message)
        return await stream.recv()

    async def event_stream(
        self, subscription_id: int | None = None, timeout: float = 5.0
    ) -> WireStream:
        """The next broker-opened stream; with `subscription_id`, its first frame must be
        the event_stream_hello naming it (and is consumed)."""
        async with asyncio.timeout(timeout):
            uni = WireStream(await self.connection.accept_stream())
        if subscription_id is not None:
            hello = await uni.recv()
            assert hello == EventStreamHello(subscription_id=subscription_id), hello
        return uni

    def close(self) -> None:
        self.connection.close()


__all__ = [
    "ALL_FLAGS",
    "NS",
    "OFFICIAL_FEATURES",
    "OFFICIAL_FLAGS",
    "TENANT",
    "BrokerProcess",
    "BrokerUnderTest",
    "Feature",
    "Flag",
    "WireClient",
    "WireStream",
    "token",
]
