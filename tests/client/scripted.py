"""A scripted broker for client fleet tests: real QUIC, real TLS, generated wire shapes.

A `ScriptedBroker` authenticates every stream by the negotiation rules
(`felix_wire.gating.auth_answer`), records every request it receives, and
answers each by its wire type from a table of handlers the test sets
(`broker.on["subscribe"] = ...`). A handler gets the broker, the request and a
`Reply` to answer on; it returns frames to send on the stream and may open an
event stream (`reply.events(...)`). Nothing here is a Felix broker: it says
exactly what the test scripts (`not_leader`, `shard_moved`, owner hints,
`topology`, `shard_unavailable`), so the client's fleet rules are checked one
by one. The conformance kit can drive a client against it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from felix_transport import Connection, Server, Stream, StreamClosedError, TransportConfig, serve
from felix_transport.certs import CertKeyPair, generate_ca, generate_leaf
from felix_wire.codec import Decoded, decode_payload, encode_frame
from felix_wire.features import Feature
from felix_wire.frame import FrameReader
from felix_wire.gating import auth_answer
from felix_wire.messages import (
    Auth,
    BrokerEndpoint,
    Error,
    ErrorDetail,
    EventBatch,
    EventStreamHello,
    NotLeader,
    ShardMoved,
    TopologyView,
)

__all__ = [
    "Reply",
    "ScriptedBroker",
    "ScriptedFleet",
    "batch",
    "moved",
    "refusal",
    "scripted_fleet",
    "topology",
    "wire_type",
]

HOST = "127.0.0.1"
FLAGS = 0x7FFF
FEATURES = int(
    Feature.FEATURE_TOPOLOGY
    | Feature.FEATURE_REDIRECT
    | Feature.FEATURE_STREAM_SHARDS
    | Feature.FEATURE_SHARD_OWNERS
    | Feature.FEATURE_ERROR_CODES
    | Feature.FEATURE_UNSUPPORTED
    | Feature.FEATURE_STREAM_READ
    | Feature.FEATURE_CACHE_WATCH
)


def wire_type(value: object) -> str:
    """A decoded frame's wire type: the JSON `type`, or the binary layout's class name."""
    tag = getattr(getattr(type(value), "__struct_config__", None), "tag", None)
    return str(tag) if isinstance(tag, str) else type(value).__name__


@dataclass
class Reply:
    """Where a handler answers: the request's stream and its connection."""

    broker: ScriptedBroker
    connection: Connection
    stream: Stream

    def events(self, subscription_id: int, frames: Sequence[Any], *, end: bool = True) -> None:
        """Open the event stream for `subscription_id`: its hello, `frames`, then
        (when `end`) the stream's end; left open otherwise until the connection goes."""
        self.broker._spawn(self._events(subscription_id, list(frames), end))

    async def _events(self, subscription_id: int, frames: list[Any], end: bool) -> None:
        stream = await self.connection.open_uni_stream()
        data = encode_frame(EventStreamHello(subscription_id=subscription_id))
        data += b"".join(encode_frame(f) for f in frames)
        with contextlib.suppress(StreamClosedError):
            await stream.write(data, end_stream=end)
            if not end:
                await self.connection.wait_closed()


Handler = Callable[["ScriptedBroker", Decoded, Reply], list[Any]]


@dataclass
class ScriptedBroker:
    node_id: str
    config: TransportConfig
    features: int = FEATURES
    on: dict[str, Handler] = field(default_factory=dict)
    received: list[Decoded] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    server: Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.address[1])

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def endpoint(self) -> BrokerEndpoint:
        return BrokerEndpoint(node_id=self.node_id, addr=self.addr)

    def __post_init__(self) -> None:
        self.on.setdefault("topology", lambda *_: [TopologyView(brokers=[])])

    def got(self, kind: str) -> list[Any]:
        """Every request of wire type `kind` received so far."""
        return [r for r in self.received if wire_type(r) == kind]

    def not_leader(self, owner: ScriptedBroker | None, generation: int) -> NotLeader:
        return NotLeader(
            node_id=owner.node_id if owner else "elsewhere",
            addr=owner.addr if owner else None,
            generation=generation,
        )

    async def start(self) -> None:
        self.server = await serve(self.config, HOST, 0, self._connection)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()

    def drop_connections(self) -> None:
        """Close every client connection (the client must reconnect)."""
        for connection in self.connections:
            connection.close()

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connection(self, connection: Connection) -> None:
        self.connections.append(connection)
        while True:
            try:
                stream = await connection.accept_stream()
            except ConnectionError:
                return
            if stream.is_unidirectional:
                continue
            self._spawn(self._stream(connection, stream))

    async def _stream(self, connection: Connection, stream: Stream) -> None:
        reader = FrameReader()
        authed = False
        reply = Reply(self, connection, stream)
        try:
            while data := await stream.read():
                for frame in reader.feed(data):
                    value = decode_payload(frame.flags, frame.payload)
                    if not authed:
                        assert isinstance(value, Auth), value
                        authed = True
                        answer: list[Any] = [
                            auth_answer(value, server_flags=FLAGS, server_features=self.features)
                        ]
                    else:
                        self.received.append(value)
                        handler = self.on.get(wire_type(value), _unscripted)
                        answer = handler(self, value, reply)
                    if answer:
                        await stream.write(b"".join(encode_frame(a) for a in answer))
        except StreamClosedError:
            return


def _unscripted(broker: ScriptedBroker, request: Decoded, reply: Reply) -> list[Any]:
    return [
        Error(
            message=f"{broker.node_id}: {wire_type(request)} is not scripted",
            code="invalid_request",
            retry="fatal",
        )
    ]


def refusal(code: str, retry: str, reason: str | None = None) -> Error:
    detail = ErrorDetail(reason=reason) if reason else None
    return Error(message=f"scripted {code}", code=code, retry=retry, detail=detail)


def batch(stream: str, first: int, payloads: list[bytes]) -> EventBatch:
    return EventBatch(
        tenant_id="t1", namespace="default", stream=stream, payloads=payloads, base_offset=first
    )


def moved(subscription_id: int, generation: int, **kw: Any) -> ShardMoved:
    return ShardMoved(subscription_id=subscription_id, generation=generation, **kw)


def topology(*brokers: ScriptedBroker) -> Handler:
    def answer(_b: ScriptedBroker, _r: Decoded, _reply: Reply) -> list[Any]:
        return [TopologyView(brokers=[b.endpoint for b in brokers])]

    return answer


@dataclass
class ScriptedFleet:
    brokers: list[ScriptedBroker]
    ca_file: Path

    def __getitem__(self, index: int) -> ScriptedBroker:
        return self.brokers[index]


def _pki() -> tuple[CertKeyPair, CertKeyPair]:
    ca = generate_ca("scripted fleet")
    return ca, generate_leaf(ca, dns_names=("localhost",))


@asynccontextmanager
async def scripted_fleet(tmp: Path, count: int, impl: str) -> AsyncIterator[ScriptedFleet]:
    """`count` scripted brokers on 127.0.0.1 (ephemeral ports), one CA, one QUIC stack."""
    ca, leaf = _pki()
    ca_file = tmp / "scripted-ca.pem"
    ca_file.write_bytes(ca.cert_pem)
    config = TransportConfig.server(leaf.cert_pem + ca.cert_pem, leaf.key_pem, impl=impl)
    brokers = [ScriptedBroker(f"node-{i}", config) for i in range(count)]
    try:
        for broker in brokers:
            await broker.start()
        yield ScriptedFleet(brokers, ca_file)
    finally:
        await asyncio.gather(*(b.stop() for b in brokers), return_exceptions=True)
