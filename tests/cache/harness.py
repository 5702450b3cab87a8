"""An in-process broker and a raw QUIC cache client for the cache tests."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from felix_broker.app import Broker
from felix_broker.cache.service import CacheLimits
from felix_broker.catalog import CacheSpec, StaticCatalog, StreamSpec
from felix_broker.cli import full_rights
from felix_broker.config import load_config
from felix_transport import Connection, Stream, TransportConfig, connect
from felix_wire.codec import Decoded, decode_frame, encode_frame
from felix_wire.features import Feature
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth
from felix_wire.messages import AuthOk, EventStreamHello, Message

TENANT = "t1"
NS = "default"
CACHE = "c"
MULTI = "multi"
# What the official client offers (real-client facts, section 2).
OFFICIAL_FLAGS = 0x1FFF
OFFICIAL_FEATURES = 0xFB77FFFF | (0xF << 32)
WITHOUT_CONDITIONAL = OFFICIAL_FEATURES & ~int(Feature.FEATURE_CACHE_CONDITIONAL)


def catalog() -> StaticCatalog:
    return StaticCatalog(
        streams=[StreamSpec(TENANT, NS, "orders", shards=1)],
        caches=[CacheSpec(TENANT, NS, CACHE, shards=1), CacheSpec(TENANT, NS, MULTI, shards=4)],
    )


def broker_config(tmp: Path, *, durable: bool, **overrides: Any) -> Any:
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "data_dir": str(tmp / "data"),
    }
    # Durable storage is on by default; an empty value turns it off.
    settings["durable_storage_dir"] = str(tmp / "durable") if durable else ""
    settings.update(overrides)
    return dataclasses.replace(load_config(environ={}, overrides=settings), catalog=catalog())


@asynccontextmanager
async def cache_broker(
    tmp: Path, *, durable: bool = True, limits: CacheLimits | None = None, **overrides: Any
) -> AsyncIterator[Broker]:
    broker = Broker(broker_config(tmp, durable=durable, **overrides), cache_limits=limits)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


def token(broker: Broker, perms: list[str] | None = None) -> str:
    assert broker.issuer is not None
    return broker.issuer.mint(
        TENANT, subject="tester", perms=full_rights(TENANT) if perms is None else perms
    )


class Frames:
    """Decoded frames from one stream."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._reader = FrameReader()
        self._pending: list[Decoded] = []

    async def recv(self, timeout: float = 5.0) -> Decoded:
        async def next_one() -> Decoded:
            while not self._pending:
                data = await self.stream.read()
                if not data:
                    raise EOFError("stream ended")
                self._pending.extend(decode_frame(f) for f in self._reader.feed(data))
            return self._pending.pop(0)

        return await asyncio.wait_for(next_one(), timeout)

    async def send(self, message: Message) -> None:
        await self.stream.write(encode_frame(message))


class CacheClient:
    """A raw client: authenticated bidi streams and broker-opened event streams."""

    def __init__(self, broker: Broker, connection: Connection) -> None:
        self.broker = broker
        self.connection = connection
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, broker: Broker) -> CacheClient:
        assert broker.ca_path is not None
        config = TransportConfig.client(broker.ca_path.read_bytes())
        return cls(broker, await connect(config, "127.0.0.1", broker.quic_port))

    def rid(self) -> int:
        return next(self._ids)

    async def stream(
        self, *, features: int = OFFICIAL_FEATURES, perms: list[str] | None = None
    ) -> Frames:
        frames = Frames(await self.connection.open_bidi_stream())
        auth = client_auth(
            TENANT,
            token(self.broker, perms),
            client_flags=OFFICIAL_FLAGS,
            client_features=features,
        )
        await frames.send(auth)
        answer = await frames.recv()
        assert isinstance(answer, AuthOk), answer
        self.server_features = (answer.server_features or 0) | (
            (answer.server_features_hi or 0) << 32
        )
        return frames

    async def ask(self, message: Message, **options: Any) -> Decoded:
        """One request on a fresh stream, and its answer."""
        frames = await self.stream(**options)
        await frames.send(message)
        return await frames.recv()

    async def event_stream(self, subscription_id: int, timeout: float = 5.0) -> Frames:
        uni = await asyncio.wait_for(self.connection.accept_stream(), timeout)
        frames = Frames(uni)
        hello = await frames.recv()
        assert hello == EventStreamHello(subscription_id=subscription_id), hello
        return frames

    def close(self) -> None:
        self.connection.close()
