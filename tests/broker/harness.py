"""A raw wire client and an in-process broker for broker tests (real QUIC, TLS and tokens)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from felix_broker.app import Broker
from felix_broker.catalog import CacheSpec, Routing, StaticCatalog, StreamSpec
from felix_broker.cli import full_rights
from felix_broker.config import load_config
from felix_transport import Connection, Stream, TransportConfig, connect, default_impl
from felix_wire.codec import Decoded, decode_frame, encode_frame
from felix_wire.features import Feature
from felix_wire.flags import Flag
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth
from felix_wire.messages import AuthOk, Message

TENANT = "t1"
NS = "default"
# What the official client offers (real-client facts, section 2).
OFFICIAL_FLAGS = 0x1FFF
OFFICIAL_FEATURES = 0xFB77FFFF | (0xF << 32)
ALL_FLAGS = 0x7FFF


def catalog() -> StaticCatalog:
    return StaticCatalog(
        streams=[
            StreamSpec(TENANT, NS, "orders", shards=1),
            StreamSpec(TENANT, NS, "wide", shards=4, routing=Routing.JUMP_HASH),
            StreamSpec(TENANT, NS, "mod", shards=3),
            StreamSpec("t2", NS, "other", shards=1),
            StreamSpec(TENANT, NS, "log", durable=True, shards=2),
        ],
        caches=[CacheSpec(TENANT, NS, "c", shards=2)],
    )


@asynccontextmanager
async def running_broker(tmp: Path, **overrides: Any) -> AsyncIterator[Broker]:
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "data_dir": str(tmp),
        "durable_storage_dir": str(tmp / "durable"),
        # FELIX_QUIC_IMPL picks the stack for the broker and (via the transport's
        # default) for the test clients, so the suite runs on either backend.
        "quic_impl": default_impl(),
    }
    settings.update(overrides)
    config = dataclasses.replace(load_config(environ={}, overrides=settings), catalog=catalog())
    broker = Broker(config)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


def token(
    broker: Broker, *, perms: list[str] | None = None, tenant: str = TENANT, **kw: Any
) -> str:
    assert broker.issuer is not None
    return broker.issuer.mint(
        tenant,
        subject=kw.pop("subject", "tester"),
        perms=full_rights(tenant) if perms is None else perms,
        **kw,
    )


class WireStream:
    """One client stream: send values, receive decoded frames."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.reader = FrameReader()
        self._pending: list[Decoded] = []

    async def send(self, value: Any) -> None:
        await self.stream.write(value if isinstance(value, bytes) else encode_frame(value))

    async def recv(self, timeout: float = 5.0) -> Decoded:
        async def next_one() -> Decoded:
            while not self._pending:
                data = await self.stream.read()
                if not data:
                    raise EOFError("stream ended")
                self._pending.extend(decode_frame(f) for f in self.reader.feed(data))
            return self._pending.pop(0)

        return await asyncio.wait_for(next_one(), timeout)

    async def expect_end(self, timeout: float = 5.0) -> None:
        """The broker finished the stream (FIN) with nothing more to read."""
        data = await asyncio.wait_for(self.stream.read(), timeout)
        assert data == b"", f"expected the end of the stream, got {data!r}"

    async def nothing(self, wait: float = 0.3) -> None:
        try:
            got = await self.recv(timeout=wait)
        except TimeoutError:
            return
        raise AssertionError(f"expected no answer, got {got!r}")


class WireClient:
    def __init__(self, broker: Broker, connection: Connection) -> None:
        self.broker = broker
        self.connection = connection

    @classmethod
    async def connect(cls, broker: Broker, **options: Any) -> WireClient:
        assert broker.ca_path is not None
        config = TransportConfig.client(broker.ca_path.read_bytes(), **options)
        return cls(broker, await connect(config, "127.0.0.1", broker.quic_port))

    async def stream(self) -> WireStream:
        return WireStream(await self.connection.open_bidi_stream())

    async def authed(
        self,
        *,
        flags: int | None = OFFICIAL_FLAGS,
        features: int = OFFICIAL_FEATURES,
        tok: str | None = None,
        tenant: str = TENANT,
    ) -> tuple[WireStream, Decoded]:
        stream = await self.stream()
        await stream.send(
            client_auth(
                tenant, tok or token(self.broker), client_flags=flags, client_features=features
            )
        )
        return stream, await stream.recv()

    async def event_stream(self, timeout: float = 5.0) -> WireStream:
        return WireStream(await asyncio.wait_for(self.connection.accept_stream(), timeout))

    async def request(self, message: Message, **auth: Any) -> Decoded:
        stream, answer = await self.authed(**auth)
        assert isinstance(answer, AuthOk), answer
        await stream.send(message)
        return await stream.recv()

    def close(self) -> None:
        self.connection.close()


__all__ = [
    "ALL_FLAGS",
    "NS",
    "OFFICIAL_FEATURES",
    "OFFICIAL_FLAGS",
    "TENANT",
    "Feature",
    "Flag",
    "WireClient",
    "WireStream",
    "running_broker",
    "token",
]
