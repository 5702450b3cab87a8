"""The broker process: QUIC listener, per-stream adapters, HTTP listener, drain.

Thin adapters over the transport: each client stream is read into its
`StreamProtocol` (sans-IO), whose outputs are carried out here: frames written,
requests executed against the `Engine`, streams ended. Subscriptions get a
broker-opened unidirectional stream each, fed by a writer task from the
subscriber's bounded queue; a subscription outlives the control stream that
made it and ends on STOP_SENDING or when the connection goes.

Limits enforced here: at most `preauth_max_streams_per_conn` unauthenticated
streams are read at once per connection (more wait); a connection that
authenticates no stream within `auth_timeout_ms` is closed with code 1;
`max_client_connections` are refused in the handshake; `publish_window` acked
publishes at most are unanswered per stream (then the stream is not read, so
QUIC flow control holds the client back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from felix_broker.cache.service import CACHE_REQUESTS, CacheCall, CacheService
from felix_broker.catalog import Catalog, Routing, StreamSpec
from felix_broker.config import BrokerConfig, FsyncMode
from felix_broker.groups.service import GROUP_REQUESTS, GroupCall, GroupService
from felix_broker.metrics import BrokerMetrics
from felix_broker.ops_http import Health, HttpListener
from felix_broker.session.protocol import (
    Authenticated,
    AuthRefusedError,
    Dispatch,
    End,
    Send,
    StreamProtocol,
)
from felix_broker.storage import LogConfig, LogStore
from felix_broker.streams.delivery import SubscriptionWriter
from felix_broker.streams.engine import (
    Engine,
    OverloadedError,
    PublishRequest,
    Shard,
    Subscriber,
    publisher_of,
)
from felix_broker.tls import TlsMaterial, prepare_tls
from felix_common.permissions import Action, stream_object
from felix_common.tokens import DevIssuer, Principal, TokenError, TokenVerifier
from felix_transport import Connection, Server, Stream, StreamClosedError, TransportConfig, serve
from felix_transport.events import ConnectionClosedError
from felix_wire.binary import PublishBatchFrame
from felix_wire.errors import ErrorCode
from felix_wire.features import Feature
from felix_wire.flags import KNOWN_FLAGS, Flag
from felix_wire.messages import (
    AckMode,
    Auth,
    CacheShards,
    CacheShardsView,
    CursorErrorReason,
    ErrorDetail,
    Extension,
    Message,
    OffsetForTime,
    OffsetValue,
    Publish,
    PublishBatch,
    PublishWidth,
    ShardOwner,
    ShardOwners,
    ShardOwnersView,
    ShardRouting,
    StartOffset,
    StreamRead,
    StreamRecord,
    StreamRecords,
    StreamShards,
    StreamShardsView,
    Subscribe,
    SubscribeCursorError,
    Subscribed,
    Unsupported,
)

__all__ = ["SERVER_FEATURES", "SERVER_FLAGS", "Broker"]

_log = logging.getLogger(__name__)

# Frame layouts this broker reads and writes: everything but idempotent publishes.
SERVER_FLAGS = KNOWN_FLAGS & ~Flag.BINARY_PUBLISH_IDEMPOTENT
# Features a standalone in-memory broker serves (advertise nothing it cannot answer).
SERVER_FEATURES = int(
    Feature.FEATURE_STREAM_SHARDS
    | Feature.FEATURE_CACHE_SHARDS
    | Feature.FEATURE_SHARD_OWNERS
    | Feature.FEATURE_ERROR_CODES
    | Feature.FEATURE_UNSUPPORTED
    | Feature.FEATURE_PUBLISH_PIPELINE
    | Feature.FEATURE_STREAM_PUBLISH_WINDOW
    | Feature.FEATURE_SUBSCRIBE_QUEUE
    | Feature.FEATURE_ACK_ON_COMMIT
)

# Served only with durable storage: bounded reads and time lookups need a log.
DURABLE_FEATURES = int(Feature.FEATURE_STREAM_READ | Feature.FEATURE_RECORD_TIMESTAMPS)

READ_MAX_BYTES = 4 * 1024 * 1024  # a stream_read page's payload cap (R1)
CLOSE_SHUTTING_DOWN = 0
CLOSE_AUTH_TIMEOUT = 1
# Application error code on streams we abandon (RESET_STREAM / STOP_SENDING).
STREAM_ABANDONED = 1


@dataclass
class _ConnectionState:
    """What one client connection holds."""

    connection: Connection
    preauth: asyncio.Semaphore
    authenticated: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    subscriptions: dict[Subscriber, str] = field(default_factory=dict)  # -> identity

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def identity_count(self, identity: str) -> int:
        return sum(1 for owner in self.subscriptions.values() if owner == identity)


class _StreamIO:
    """Ordered writes on one client stream, and its queue of pending publish answers."""

    def __init__(self, stream: Stream, window: int) -> None:
        self.stream = stream
        self._lock = asyncio.Lock()
        # Answers to acked publishes are written in the order the stream carried the
        # publishes (PL2); at most `window` may be pending (PL3).
        self.answers: asyncio.Queue[
            tuple[asyncio.Future[int] | None, Callable[[int | None], bytes]]
        ]
        self.answers = asyncio.Queue(maxsize=max(1, window))

    async def write(self, data: bytes) -> None:
        async with self._lock:
            await self.stream.write(data)

    async def finish(self) -> None:
        """FIN after whatever is being written."""
        async with self._lock:
            await self.stream.finish()

    async def answer_writer(self) -> None:
        while True:
            future, build = await self.answers.get()
            result: int | None = None
            if future is not None:
                with contextlib.suppress(Exception):
                    result = await future
            await self.write(build(result))
            self.answers.task_done()


class Verifier(Protocol):
    """Checks a Felix token for the tenant a stream names (TokenVerifier, or the
    control plane's TenantJwksVerifier)."""

    def verify(self, token: str, tenant_id: str) -> Principal: ...


class Broker:
    """A standalone Felix broker on asyncio.

    `start()` prepares TLS and tokens, binds QUIC and HTTP and returns; `quic_port`
    and `http_port` then say where. `drain()` stops taking work and closes
    connections with code 0; `stop()` tears everything down.
    """

    def __init__(self, config: BrokerConfig, *, verifier: Verifier | None = None) -> None:
        self.config = config
        self.metrics = BrokerMetrics()
        self.health = Health()
        self.engine: Engine | None = None
        self.cache: CacheService | None = None
        self.groups: GroupService | None = None
        self.store: LogStore | None = None
        # What exists: the config file's catalog, or the control plane's live one.
        self.catalog: Catalog = config.catalog
        self._control: list[Any] = []  # control-plane clients to close on stop
        self.tls: TlsMaterial | None = None
        self.issuer: DevIssuer | None = None
        self._verifier = verifier
        self._server: Server | None = None
        self._http: HttpListener | None = None
        self._connections: dict[Connection, _ConnectionState] = {}
        self._draining = False
        self._stopped = asyncio.Event()

    # -- life cycle ----------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.tls = prepare_tls(
            data_dir=config.data_dir,
            cert=config.tls_cert,
            key=config.tls_key,
            ca=config.tls_ca,
            cert_export=config.tls_cert_export,
        )
        if config.controlplane_url is not None:
            await self._connect_control_plane(config.controlplane_url)
        if self._verifier is None:
            if config.jwks_path is not None:
                self._verifier = TokenVerifier.from_file(config.jwks_path)
            else:
                self.issuer = DevIssuer.load_or_create(config.data_dir)
                self._verifier = TokenVerifier(self.issuer.jwks())
        # Listen first: /ready answers 503 while the logs recover.
        self._http = HttpListener(
            metrics=self.metrics, health=self.health, backup_offsets=self._backup_offsets
        )
        await self._http.start(config.metrics_bind.host, config.metrics_bind.port)
        if config.durable_enabled:
            assert config.durable_storage_dir is not None
            self.store = LogStore(
                config.durable_storage_dir, config=LogConfig(fsync_mode=config.durable_fsync_mode)
            )
            # /ready stays 503 until every log has recovered (a corrupt log stops here).
            await self.store.recover_all()
            self.store.start()
        self.engine = Engine(self.catalog, config, self.metrics, self.store)
        self.cache = CacheService(config=config, catalog=self.catalog, metrics=self.metrics)
        await self.cache.start()  # reloads cache logs, starts the TTL pass
        if config.durable_enabled:
            # Consumer groups need durable storage (facts N4, Q1): none without it.
            self.groups = GroupService(
                config=config, catalog=self.catalog, engine=self.engine, metrics=self.metrics
            )
            await self.groups.start()  # replays the group logs (cursors, dead letters)
        transport = TransportConfig.server(
            self.tls.chain_pem(),
            self.tls.key_pem(),
            impl=config.quic_impl.value,
            require_alpn=config.tls_require_alpn,
            max_datagram_size=config.max_datagram_size,
            idle_timeout=config.max_idle_timeout_ms / 1000,
            connection_receive_window=config.pub_conn_recv_window,
            stream_receive_window=min(config.pub_stream_recv_window, config.pub_conn_recv_window),
        )
        self._server = await serve(
            transport,
            config.quic_bind.host,
            config.quic_bind.port,
            self._on_connection,
            max_connections=config.max_client_connections,
        )
        self.health.mark_ready()

    @property
    def quic_port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.address[1])

    @property
    def http_port(self) -> int:
        assert self._http is not None, "not started"
        return self._http.port

    @property
    def ca_path(self) -> Path | None:
        """The CA certificate clients should trust (None when the operator's
        certificate came without one)."""
        assert self.tls is not None, "not started"
        return self.tls.ca_path

    async def drain(self) -> None:
        """Stop taking work: /ready turns 503, new auth answers `draining`, queued
        publishes finish, then every connection closes with code 0."""
        if self._draining:
            return
        self._draining = True
        self.health.mark_draining()
        timeout = self.config.drain_timeout_ms / 1000
        if self.engine is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.engine.drain(), timeout)
        # Let the answer writers flush what the drained publishes produced.
        await asyncio.sleep(0)
        for state in list(self._connections.values()):
            state.connection.close(CLOSE_SHUTTING_DOWN, "broker shutting down")
        waits = [s.connection.wait_closed() for s in self._connections.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), timeout)

    async def stop(self) -> None:
        await self.drain()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._http is not None:
            await self._http.close()
        if self.cache is not None:
            await self.cache.close()
        if self.groups is not None:
            await self.groups.close()
        if self.engine is not None:
            self.engine.close()
        if self.store is not None:
            await self.store.aclose()
        for client in reversed(self._control):
            await client.close()
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- control plane ----------------------------------------------------------------

    async def _connect_control_plane(self, url: str) -> None:
        """Take the catalog and the tenants' token keys from the control plane: a
        snapshot now (start fails if it cannot be had), then changes as they come."""
        from felix_broker.catalog.live import LiveCatalog, TenantJwksVerifier

        config = self.config
        if config.controlplane_sync_token_file is not None:
            sync_token = config.controlplane_sync_token_file.read_text().strip()
        else:
            sync_token = os.environ.get("FELIX_CONTROLPLANE_SYNC_TOKEN", "")
        if not sync_token:
            raise ValueError(
                "controlplane_url needs a sync token: controlplane_sync_token_file "
                "or FELIX_CONTROLPLANE_SYNC_TOKEN"
            )
        ca = str(config.controlplane_ca) if config.controlplane_ca is not None else None
        catalog = LiveCatalog(url, sync_token=sync_token, ca_file=ca)
        verifier = TenantJwksVerifier(url, ca_file=ca, known_tenant=catalog.tenant_exists)
        catalog.add_listener(verifier.on_catalog_change)
        catalog.add_listener(self.on_catalog_change)
        await catalog.start()
        self._control.append(catalog)
        await verifier.start(catalog.tenant_ids())
        self._control.append(verifier)
        self.catalog = catalog
        self._verifier = verifier

    def on_catalog_change(self, change: Any) -> None:
        """A stream deleted from the catalog ends its subscriptions (their event streams
        finish) and forgets its shards, so a stream created again starts afresh."""
        if not (change.op == "delete" and change.kind == "stream"):
            return
        key = (change.tenant, change.namespace, change.name)
        for state in self._connections.values():
            for sub in list(state.subscriptions):
                spec = sub.shard.spec
                if (spec.tenant_id, spec.namespace, spec.name) == key:
                    self._end_subscription(state, sub)
        if self.engine is not None:
            self.engine.forget_stream(*key)

    # -- connections ----------------------------------------------------------------

    async def _on_connection(self, connection: Connection) -> None:
        state = _ConnectionState(
            connection, asyncio.Semaphore(self.config.preauth_max_streams_per_conn)
        )
        self._connections[connection] = state
        self.metrics.connections.inc()
        self.metrics.connections_accepted.inc()
        if self.config.auth_timeout_ms > 0:
            state.spawn(self._auth_timeout(state), "auth-timeout")
        try:
            while True:
                try:
                    stream = await connection.accept_stream()
                except ConnectionClosedError:
                    break
                state.spawn(self._serve_stream(state, stream), f"stream-{stream.stream_id}")
        finally:
            for task in list(state.tasks):
                task.cancel()
            for sub in list(state.subscriptions):
                self._end_subscription(state, sub)
            del self._connections[connection]
            self.metrics.connections.dec()

    async def _auth_timeout(self, state: _ConnectionState) -> None:
        try:
            await asyncio.wait_for(state.authenticated.wait(), self.config.auth_timeout_ms / 1000)
        except TimeoutError:
            _log.info("closing a connection that did not authenticate in time")
            state.connection.close(CLOSE_AUTH_TIMEOUT, "authentication timeout")

    def _authenticate(self, auth: Auth) -> Principal:
        if self._draining:
            raise AuthRefusedError(ErrorCode.DRAINING, "broker is shutting down", "draining")
        assert self._verifier is not None
        try:
            return self._verifier.verify(auth.token, auth.tenant_id)
        except TokenError as exc:
            self.metrics.auth_failures.labels(reason=exc.check).inc()
            raise AuthRefusedError(ErrorCode.UNAUTHENTICATED, str(exc), exc.check) from None

    def _new_protocol(self, *, publish_only: bool) -> StreamProtocol:
        config = self.config
        assert self.cache is not None
        features = SERVER_FEATURES | self.cache.features
        if self.groups is not None:
            features |= self.groups.features
        if self.store is not None:
            features |= DURABLE_FEATURES
        if config.publish_window <= 0:
            features &= ~int(
                Feature.FEATURE_PUBLISH_PIPELINE | Feature.FEATURE_STREAM_PUBLISH_WINDOW
            )
        return StreamProtocol(
            authenticate=self._authenticate,
            server_flags=int(SERVER_FLAGS),
            server_features=features,
            publish_window=config.publish_window,
            preauth_max_frame_bytes=config.preauth_max_frame_bytes,
            max_frame_bytes=config.max_frame_bytes,
            publish_only=publish_only,
        )

    async def _serve_stream(self, state: _ConnectionState, stream: Stream) -> None:
        proto = self._new_protocol(publish_only=stream.is_unidirectional)
        io = _StreamIO(stream, self.config.publish_window)
        writer = asyncio.get_running_loop().create_task(io.answer_writer())
        preauth = state.preauth
        await preauth.acquire()
        holding = True
        try:
            while True:
                try:
                    data = await stream.read()
                except StreamClosedError:
                    return
                outputs = proto.receive(data) if data else proto.end_of_stream()
                for output in outputs:
                    if isinstance(output, Send):
                        await io.write(output.data)
                    elif isinstance(output, Authenticated):
                        state.authenticated.set()
                        if holding:
                            preauth.release()
                            holding = False
                    elif isinstance(output, Dispatch):
                        await self._dispatch(state, proto, io, output.request)
                    elif isinstance(output, End):
                        await self._end_stream(io, output)
                        return
                if not data:
                    return
        except StreamClosedError:
            return
        finally:
            if holding:
                preauth.release()
            # Let pending answers out before the writer goes (bounded by the window).
            with contextlib.suppress(Exception):
                if not stream.at_eof or io.answers.qsize():
                    await asyncio.wait_for(
                        io.answers.join(), self.config.ack_wait_timeout_ms / 1000
                    )
            writer.cancel()

    async def _end_stream(self, io: _StreamIO, end: End) -> None:
        stream = io.stream
        with contextlib.suppress(Exception):
            await asyncio.wait_for(io.answers.join(), self.config.ack_wait_timeout_ms / 1000)
        if end.reset:
            stream.reset(STREAM_ABANDONED)
            stream.stop_sending(STREAM_ABANDONED)
            return
        with contextlib.suppress(StreamClosedError):
            if stream.writable:
                await io.finish()
        stream.stop_sending(0)

    # -- requests -------------------------------------------------------------------

    async def _dispatch(
        self,
        state: _ConnectionState,
        proto: StreamProtocol,
        io: _StreamIO,
        request: Message | PublishBatchFrame,
    ) -> None:
        if isinstance(request, PublishBatchFrame):
            await self._publish_binary(proto, io, request)
        elif isinstance(request, Publish | PublishBatch):
            await self._publish_json(proto, io, request)
        elif isinstance(request, Subscribe):
            await self._subscribe(state, proto, io, request)
        elif isinstance(request, CACHE_REQUESTS) and self.cache is not None:
            # Each cache request runs on its own: answers go out in completion order,
            # matched by request_id, so one slow request holds back no other.
            call = CacheCall(
                proto,
                io.write,
                lambda coro: state.spawn(coro, "cache-task"),
                state.connection.open_uni_stream,
            )
            state.spawn(self.cache.handle(request, call), "cache-request")
        elif isinstance(request, GROUP_REQUESTS) and self.groups is not None:
            # Like cache requests: each on its own, so a long poll holds back nothing.
            group_call = GroupCall(proto, io.write, state.connection)
            state.spawn(self.groups.handle(request, group_call), "group-request")
        elif isinstance(request, StreamRead) and self.store is not None:
            await io.write(self._stream_read(proto, request))
        elif isinstance(request, OffsetForTime) and self.store is not None:
            await io.write(self._offset_for_time(proto, request))
        elif isinstance(request, StreamShards):
            await io.write(self._stream_shards(proto, request))
        elif isinstance(request, CacheShards):
            await io.write(self._cache_shards(proto, request))
        elif isinstance(request, ShardOwners):
            await io.write(self._shard_owners(proto, request))
        elif isinstance(request, PublishWidth):
            # Not advertised, so a client should not send it; it expects no answer.
            return
        elif isinstance(request, Extension):
            # No extension is implemented: every one is answered like an unknown type
            # (N8), naming the extension and echoing its request_id.
            if proto.negotiated(Feature.FEATURE_UNSUPPORTED):
                answer = Unsupported(
                    request_type="extension", extension=request.name, request_id=request.request_id
                )
                await io.write(proto.message(answer))
            else:
                await self._end_stream(io, End(reset=False))
        else:
            await io.write(self._not_served(proto, request))

    def _not_served(self, proto: StreamProtocol, request: Message) -> bytes:
        """A known request this broker does not serve (its feature is not advertised)."""
        request_type = str(type(request).__struct_config__.tag)
        request_id = getattr(request, "request_id", None)
        if proto.negotiated(Feature.FEATURE_UNSUPPORTED):
            return proto.message(Unsupported(request_type=request_type, request_id=request_id))
        return proto.error(
            ErrorCode.INVALID_REQUEST, f"{request_type} is not served by this broker"
        )

    def _refusal(
        self, proto: StreamProtocol, tenant_id: str, action: Action, obj: str
    ) -> tuple[ErrorCode, str] | None:
        """Why the stream's principal may not do `action` on `obj`, or None."""
        principal = proto.principal
        assert principal is not None
        if tenant_id != principal.tenant_id:
            return ErrorCode.FORBIDDEN, "forbidden: the token is for another tenant"
        if not principal.permissions.allows(action, obj):
            return ErrorCode.FORBIDDEN, f"forbidden: {action.value} on {obj}"
        return None

    # -- publish ---------------------------------------------------------------------

    async def _publish_binary(
        self, proto: StreamProtocol, io: _StreamIO, frame: PublishBatchFrame
    ) -> None:
        acked = frame.request_id is not None
        await self._publish(
            proto,
            io,
            tenant_id=frame.tenant_id,
            namespace=frame.namespace,
            stream=frame.stream,
            payloads=frame.payloads,
            key=frame.key,
            request_id=frame.request_id if acked else None,
            binary=True,
        )

    async def _publish_json(
        self, proto: StreamProtocol, io: _StreamIO, message: Publish | PublishBatch
    ) -> None:
        frame_type = "publish" if isinstance(message, Publish) else "publish_batch"
        self.metrics.json_publishes.labels(frame=frame_type).inc()
        payloads = [message.payload] if isinstance(message, Publish) else list(message.payloads)
        ack = message.ack or AckMode.NONE
        wants_answer = ack is not AckMode.NONE or (
            # decision ack-default: a pipelining client's request_id owes an answer.
            message.ack is None
            and message.request_id is not None
            and proto.negotiated(Feature.FEATURE_PUBLISH_PIPELINE)
        )
        if wants_answer and message.request_id is None:
            await io.write(
                proto.error(ErrorCode.INVALID_REQUEST, "an acked publish needs a request_id")
            )
            return
        await self._publish(
            proto,
            io,
            tenant_id=message.tenant_id,
            namespace=message.namespace,
            stream=message.stream,
            payloads=payloads,
            key=message.key,
            request_id=message.request_id if wants_answer else None,
            binary=False,
        )

    async def _publish(
        self,
        proto: StreamProtocol,
        io: _StreamIO,
        *,
        tenant_id: str,
        namespace: str,
        stream: str,
        payloads: list[bytes],
        key: bytes | None,
        request_id: int | None,
        binary: bool,
    ) -> None:
        assert self.engine is not None and proto.principal is not None
        if proto.publish_only:
            request_id = None  # nothing is ever answered on a publish-only stream (T7)

        async def refuse(code: ErrorCode, text: str, detail: ErrorDetail | None = None) -> None:
            if request_id is not None:
                answer = proto.publish_answer(
                    request_id, binary=binary, error=(code, text), detail=detail
                )
                await io.answers.put((None, lambda _r: answer))

        refusal = self._refusal(
            proto, tenant_id, Action.STREAM_PUBLISH, stream_object(tenant_id, namespace, stream)
        )
        if refusal is not None:
            await refuse(*refusal)
            return
        spec = self.engine.stream(tenant_id, namespace, stream)
        if spec is None:
            await refuse(
                ErrorCode.NOT_FOUND,
                f"stream not found: tenant={tenant_id} namespace={namespace} stream={stream}",
            )
            return
        if not payloads:
            await refuse(ErrorCode.INVALID_REQUEST, "a publish batch needs at least one payload")
            return
        shard = self.engine.shard_for(spec, key)
        publish = PublishRequest(shard, payloads, publisher_of(proto.principal.subject))
        try:
            done = await self.engine.publish(publish, acked=request_id is not None)
        except OverloadedError as exc:
            await refuse(
                ErrorCode.OVERLOADED,
                str(exc),
                ErrorDetail(reason="publish_queue_full", retry_after_ms=exc.retry_after_ms),
            )
            return
        if request_id is None:
            return
        # Acknowledged when queued, unless the broker or this client asked for acks
        # after the write (A5). In-memory streams never report offsets.
        after_write = self.config.ack_on_commit or proto.negotiated(Feature.FEATURE_ACK_ON_COMMIT)
        rid = request_id
        durable = shard.durable

        def answer(offset: int | None) -> bytes:
            if offset is None and after_write:
                # The write failed after the publish was queued: it may or may not be on disk.
                return proto.publish_answer(
                    rid,
                    binary=binary,
                    error=(ErrorCode.STORAGE, "the write could not be confirmed"),
                )
            return proto.publish_answer(rid, binary=binary, offset=offset if durable else None)

        await io.answers.put((done if after_write else None, answer))

    # -- subscribe -------------------------------------------------------------------

    async def _subscribe(
        self, state: _ConnectionState, proto: StreamProtocol, io: _StreamIO, request: Subscribe
    ) -> None:
        assert self.engine is not None and proto.principal is not None
        tenant, namespace, name = request.tenant_id, request.namespace, request.stream
        refusal = self._refusal(
            proto, tenant, Action.STREAM_SUBSCRIBE, stream_object(tenant, namespace, name)
        )
        if refusal is not None:
            await io.write(proto.error(*refusal))
            return
        spec = self.engine.stream(tenant, namespace, name)
        if spec is None:
            await io.write(
                proto.error(
                    ErrorCode.NOT_FOUND,
                    f"stream not found: tenant={tenant} namespace={namespace} stream={name}",
                )
            )
            return
        index = request.shard or 0
        if index >= spec.shards:
            await io.write(
                proto.error(
                    ErrorCode.INVALID_REQUEST,
                    f"stream {name} has {spec.shards} shard(s), not {index + 1}",
                )
            )
            return
        identity = f"{proto.principal.tenant_id}/{proto.principal.subject}"
        if (
            state.identity_count(identity) >= self.config.max_subscriptions_per_conn
            or len(state.subscriptions) >= self.config.max_subscriptions_per_conn_total
        ):
            await io.write(
                proto.error(ErrorCode.LIMIT_EXCEEDED, "too many subscriptions on this connection")
            )
            return
        shard = self.engine.shard(spec, index)
        start = self._start_position(shard, request)
        if isinstance(start, SubscribeCursorError):
            await io.write(proto.message(start))
            return
        capacity = None
        if request.queue_capacity is not None and self._serves(
            proto, Feature.FEATURE_SUBSCRIBE_QUEUE
        ):
            capacity = self.engine.clamp_queue_capacity(request.queue_capacity)
        # Register the live subscriber first, then read history: nothing appended in
        # between can fall through (the writer joins the two by offset).
        live = shard.next_offset
        sub = self.engine.subscribe(shard, proto.client, capacity=capacity)
        state.subscriptions[sub] = identity
        subscribed = Subscribed(subscription_id=sub.subscription_id, queue_capacity=capacity)
        if shard.durable:
            # Shaping keeps these for clients that negotiated EVENT_BATCH_OFFSETS only.
            subscribed.start_offset = start
            subscribed.live_offset = live
        try:
            await io.write(proto.message(subscribed))
            uni = await state.connection.open_uni_stream()
        except (StreamClosedError, ConnectionClosedError):
            self._end_subscription(state, sub)
            return
        lagged = shard.durable and proto.client.has(
            Flag.EVENT_BATCH_OFFSETS, Feature.FEATURE_SUBSCRIPTION_LAGGED
        )
        state.spawn(
            self._deliver(state, sub, uni, start if shard.durable else None, lagged),
            f"deliver-{sub.subscription_id}",
        )

    def _serves(self, proto: StreamProtocol, feature: int) -> bool:
        return bool(proto.server_features & feature)

    def _start_position(self, shard: Shard, request: Subscribe) -> int | SubscribeCursorError:
        """Where a subscription starts, or why it cannot (never a silent restart, S2).

        A durable shard serves anything from its oldest retained record to its tail;
        an in-memory shard keeps no history, so `earliest` is its tail and only the
        tail can be asked for by offset.
        """
        log = shard.log
        oldest = log.start_offset if log is not None else shard.next_offset
        tail = shard.next_offset
        start = request.start
        if isinstance(start, StartOffset):
            if start.offset < oldest:
                return SubscribeCursorError(
                    reason=CursorErrorReason.TOO_OLD, requested=start.offset, available=oldest
                )
            if start.offset > tail:
                return SubscribeCursorError(
                    reason=CursorErrorReason.IN_FUTURE, requested=start.offset, available=tail
                )
            return start.offset
        return oldest if start == "earliest" else tail

    async def _deliver(
        self,
        state: _ConnectionState,
        sub: Subscriber,
        uni: Stream,
        start: int | None,
        lagged_capable: bool,
    ) -> None:
        """Run one subscription's writer (delivery.py), then forget the subscription."""
        writer = SubscriptionWriter(
            sub,
            uni,
            max_records=self.config.event_batch_max_events * 16,
            max_bytes=self.config.event_batch_max_bytes * 16,
        )
        try:
            await writer.run(start, lagged_capable)
        finally:
            self._end_subscription(state, sub)
            if not state.connection.closed:
                with contextlib.suppress(Exception):
                    uni.reset(0)

    def _end_subscription(self, state: _ConnectionState, sub: Subscriber) -> None:
        state.subscriptions.pop(sub, None)
        if self.engine is not None:
            self.engine.unsubscribe(sub)

    # -- bounded reads ------------------------------------------------------------------

    def _durable_shard(
        self, proto: StreamProtocol, tenant: str, namespace: str, name: str, index: int
    ) -> Shard | bytes:
        """The durable shard a read names, or the error frame that refuses it."""
        assert self.engine is not None
        refusal = self._refusal(
            proto, tenant, Action.STREAM_SUBSCRIBE, stream_object(tenant, namespace, name)
        )
        if refusal is not None:
            return proto.error(*refusal)
        spec = self.engine.stream(tenant, namespace, name)
        if spec is None:
            return proto.error(
                ErrorCode.NOT_FOUND,
                f"stream not found: tenant={tenant} namespace={namespace} stream={name}",
            )
        if index >= spec.shards:
            return proto.error(
                ErrorCode.INVALID_REQUEST, f"stream {name} has {spec.shards} shard(s)"
            )
        if not spec.durable:
            return proto.error(ErrorCode.INVALID_REQUEST, f"stream {name} is in memory: no log")
        return self.engine.shard(spec, index)

    def _stream_read(self, proto: StreamProtocol, request: StreamRead) -> bytes:
        """A page of committed records; never waits (R1)."""
        shard = self._durable_shard(
            proto, request.tenant_id, request.namespace, request.stream, request.shard
        )
        if isinstance(shard, bytes):
            return shard
        log = shard.log
        assert log is not None
        first = request.from_
        if first < log.start_offset:
            return proto.message(
                SubscribeCursorError(
                    reason=CursorErrorReason.TOO_OLD, requested=first, available=log.start_offset
                )
            )
        if first > log.next_offset:
            return proto.message(
                SubscribeCursorError(
                    reason=CursorErrorReason.IN_FUTURE, requested=first, available=log.next_offset
                )
            )
        cap = self.config.durable_max_records_per_read
        max_records = min(request.max_records or cap, cap)
        max_bytes = min(request.max_bytes or READ_MAX_BYTES, READ_MAX_BYTES)
        records = []
        if request.end is None or request.end > first:
            records = log.read(first, max_records=max_records, max_bytes=max_bytes, end=request.end)
        page = [
            StreamRecord(
                offset=r.offset,
                payload=r.payload,
                publisher=r.publisher,
                timestamp_micros=r.timestamp_us,
            )
            for r in records
        ]
        next_offset = records[-1].offset + 1 if records else first
        return proto.message(
            StreamRecords(records=page, next_offset=next_offset, request_id=request.request_id)
        )

    def _offset_for_time(self, proto: StreamProtocol, request: OffsetForTime) -> bytes:
        """The first offset appended at or after a time (R2)."""
        shard = self._durable_shard(
            proto, request.tenant_id, request.namespace, request.stream, request.shard
        )
        if isinstance(shard, bytes):
            return shard
        assert shard.log is not None
        offset = shard.log.offset_for_time(request.at_micros)
        return proto.message(OffsetValue(offset=offset, request_id=request.request_id))

    def _backup_offsets(self) -> dict[str, object]:
        """Every shard's committed log offsets (one past the last record a reader may see).

        A standalone broker leads every shard it serves, at generation 0. Group
        logs are read before the records' (the seed's rule), so a group offset
        never names a record past ``records``. In-memory streams and caches are
        listed under ``skipped`` as ``not_durable``.
        """
        groups = self.groups.committed_offsets() if self.groups is not None else {}
        streams = self.store.offsets() if self.store is not None else {}
        caches = self.cache.committed_offsets() if self.cache is not None else {}
        shards: list[dict[str, object]] = []
        skipped: list[dict[str, object]] = []

        def shard(scope: tuple[str, str, str, int], kind: str) -> dict[str, object]:
            tenant, namespace, name, index = scope
            return {
                "tenant_id": tenant,
                "namespace": namespace,
                "name": name,
                "shard": index,
                "kind": kind,
            }

        # What a reader may see: what an fsync covered under on_commit,
        # everything appended (and so acknowledged) under the other modes.
        on_commit = self.config.durable_fsync_mode is FsyncMode.ON_COMMIT
        for key, offsets in streams.items():
            scope = (key.tenant, key.namespace, key.stream, key.shard)
            records = offsets.durable if on_commit else offsets.next
            logs = {"records": records}
            if scope in groups:
                logs["group_cursors"] = groups[scope]
            shards.append(shard(scope, "stream") | {"generation": 0, "logs": logs})
        for scope, records in sorted(caches.items()):
            shards.append(shard(scope, "cache") | {"generation": 0, "logs": {"records": records}})
        for spec in self.catalog.streams():
            if self.store is None or not spec.durable:
                for index in range(spec.shards):
                    scope = (spec.tenant_id, spec.namespace, spec.name, index)
                    skipped.append(shard(scope, "stream") | {"reason": "not_durable"})
        if self.cache is None or not self.cache.durable:
            for cache_spec in self.catalog.caches():
                for index in range(cache_spec.shards):
                    scope = (cache_spec.tenant_id, cache_spec.namespace, cache_spec.name, index)
                    skipped.append(shard(scope, "cache") | {"reason": "not_durable"})
        return {"node_id": "", "shards": shards, "skipped": skipped}

    # -- discovery --------------------------------------------------------------------

    def _stream_shards(self, proto: StreamProtocol, request: StreamShards) -> bytes:
        assert self.engine is not None and proto.principal is not None
        spec = self._visible_stream(proto, request.tenant_id, request.namespace, request.stream)
        # routing is sent only for jump-hash streams; absent means modulo.
        jump_hash = spec is not None and spec.routing is Routing.JUMP_HASH
        return proto.message(
            StreamShardsView(
                shards=spec.shards if spec else 0,
                request_id=request.request_id,
                routing=ShardRouting.JUMP_HASH if jump_hash else None,
            )
        )

    def _visible_stream(
        self, proto: StreamProtocol, tenant: str, namespace: str, name: str
    ) -> StreamSpec | None:
        # Discovery answers are scoped to the client's tenant (D4): another tenant's
        # names are unknown here.
        assert self.engine is not None and proto.principal is not None
        if tenant != proto.principal.tenant_id:
            return None
        return self.engine.stream(tenant, namespace, name)

    def _cache_shards(self, proto: StreamProtocol, request: CacheShards) -> bytes:
        assert proto.principal is not None
        spec = None
        if request.tenant_id == proto.principal.tenant_id:
            spec = self.catalog.cache(request.tenant_id, request.namespace, request.cache)
        return proto.message(
            CacheShardsView(shards=spec.shards if spec else 0, request_id=request.request_id)
        )

    def _shard_owners(self, proto: StreamProtocol, request: ShardOwners) -> bytes:
        assert proto.principal is not None
        shards = 0
        if request.kind == "stream":
            stream = self._visible_stream(proto, request.tenant_id, request.namespace, request.name)
            shards = stream.shards if stream else 0
        elif request.tenant_id == proto.principal.tenant_id:
            cache = self.catalog.cache(request.tenant_id, request.namespace, request.name)
            shards = cache.shards if cache else 0
        # A standalone broker owns every shard it knows, with no cluster identity (D3).
        owners = [ShardOwner(shard=i, generation=0) for i in range(shards)]
        return proto.message(ShardOwnersView(owners=owners, request_id=request.request_id))
