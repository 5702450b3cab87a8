"""The owner's side of forwarding: serve a forwarded request, or refuse it.

Every forwarded request is authorized twice: the forwarder authenticated the
client's stream, and the owner verifies the client's token again (against the
tenant's keys, with the permission the request needs). A credential the owner
refuses is answered `error {code: forbidden}`, which the forwarder relays.

Before anything is written the owner compares the forwarder's generation with
the one it holds for the shard:

- equal, and this broker serves the shard: proceed;
- forwarder behind (or this broker no longer leads): `not_leader` naming the
  leader this broker knows, at its generation;
- forwarder ahead: `stale_route` (this broker is the one behind: it must not write).

A forwarded request is never forwarded again (no chains): a refusal goes back.

Publishes go to the shard the forward names (`Engine.publish`); the answer
follows the forwarder's `ack` (enqueued, or written with the first offset on a
durable stream). Cache and counter ops run through this broker's own cache
handler on a virtual client stream: the client's auth is replayed (same token,
same offer), so the answer is shaped exactly as if the client had asked here,
and returned whole (`forward_cache_answer`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from felix_broker.catalog import Catalog
from felix_broker.fleet.moves import MoveHold, in_a_move, moving_refusal
from felix_broker.fleet.peer import PeerOrigin
from felix_broker.fleet.placement import CACHE_ROUTING
from felix_broker.fleet.routing import ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.driver import ReplicationRefusedError
from felix_broker.session.context import ConnectionState, RequestContext, StreamIO
from felix_broker.session.dispatch import DispatchTable
from felix_broker.session.protocol import Authenticated, AuthRefusedError, StreamProtocol
from felix_broker.streams.engine import Engine, OverloadedError, PublishRequest, publisher_of
from felix_common.permissions import Action, stream_object
from felix_common.tokens import Principal, TokenError
from felix_transport import Connection, Stream
from felix_wire import encode_frame
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.features import feature_words
from felix_wire.fleet import (
    ForwardAck,
    ForwardCacheAnswer,
    ForwardCacheOp,
    ForwardPublish,
    ForwardPublishOk,
    ForwardRefusal,
    ForwardRefused,
    LeaderHint,
    PeerError,
    PeerMessage,
    PeerUnsupported,
    StaleRoute,
)
from felix_wire.frame import FrameReader
from felix_wire.messages import Auth, ErrorDetail, decode_message
from felix_wire.routing import shard_for_key

__all__ = ["VERIFIED_MAX", "VERIFIED_TTL", "OwnerService"]

# Bounds of the owner's cache of verified forwarded tokens: a key rotated away or a
# tenant removed stops a cached token within VERIFIED_TTL seconds.
VERIFIED_TTL = 30.0
VERIFIED_MAX = 4096

_log = logging.getLogger(__name__)

Verify = Callable[[str, str], Principal]  # (token, tenant_id) -> principal, or TokenError


def _consume(future: asyncio.Future[int]) -> None:
    if not future.cancelled():
        future.exception()  # a failed write after an enqueued ack is the engine's to log


class _Refusal(Exception):
    def __init__(self, refusal: ForwardRefusal) -> None:
        self.refusal = refusal


def _error(
    code: ErrorCode, message: str, retry: RetryClass | None = None, reason: str | None = None
) -> _Refusal:
    detail = ErrorDetail(reason=reason) if reason is not None else None
    error = PeerError(
        code=code.wire, retry=(retry or code.default_retry).wire, message=message, detail=detail
    )
    return _Refusal(ForwardRefusal(error=error))


class _CapturedIO(StreamIO):
    """The virtual client stream of a forwarded cache op: answers are kept, not sent."""

    def __init__(self, stream: Stream) -> None:
        super().__init__(stream, 1, ack_wait=0)
        self.written = bytearray()

    async def write(self, data: bytes) -> None:
        self.written += data


class OwnerService:
    """Serves forwarded publishes and cache ops at the shard's owner."""

    def __init__(
        self,
        *,
        view: FleetView,
        catalog: Callable[[], Catalog],
        engine: Callable[[], Engine],
        table: DispatchTable,
        verify: Verify,
        server_flags: int,
        features: Callable[[], int],
        max_frame_bytes: int,
        metrics: BrokerMetrics,
        hold: MoveHold | None = None,
        unanswered: Callable[[], bool] | None = None,
    ) -> None:
        self._view = view
        self._hold = hold  # a forward for a shard in a move waits for its cut-over
        self._catalog = catalog
        self._engine = engine
        self._table = table
        self._verify = verify
        # Verified forwarded credentials, so a busy stream's token is not checked per batch.
        self._verified: OrderedDict[tuple[str, str], tuple[Principal, float]] = OrderedDict()
        self._server_flags = server_flags
        self._features = features
        self._max_frame_bytes = max_frame_bytes
        self._metrics = metrics
        self._states: dict[Connection, ConnectionState] = {}
        # Test mode only (the fault file's forwards_unanswered): another broker's
        # forwarded publishes are taken and never answered nor applied.
        self._unanswered = unanswered

    async def handle(
        self, message: PeerMessage, origin: PeerOrigin
    ) -> PeerMessage | Awaitable[PeerMessage]:
        """Admit a forwarded request. A publish is answered once admitted (queued on its
        shard) or, for `written`, by an awaitable that settles after the write, so the
        next publish of the same peer stream is admitted meanwhile (order kept)."""
        request_id: int = getattr(message, "request_id", 0) or 0
        try:
            if isinstance(message, ForwardPublish):
                if self._swallows(origin):
                    # Never settles: the forwarder stops waiting after its request
                    # timeout and resets the peer stream, which drops this answer.
                    never: asyncio.Future[PeerMessage] = asyncio.get_running_loop().create_future()
                    return never
                return await self._publish(message)
            if isinstance(message, ForwardCacheOp):
                return await self._cache_op(message, origin)
        except _Refusal as refused:
            return ForwardRefused(request_id=request_id, refusal=refused.refusal)
        return PeerUnsupported(request_type=str(type(message).__struct_config__.tag))

    def _swallows(self, origin: PeerOrigin) -> bool:
        """Whether a forward from another broker goes unanswered (a test fault; one this
        broker serves itself, led here meanwhile, never does)."""
        if self._unanswered is None or origin.node_id == self._view.snapshot.node_id:
            return False
        return self._unanswered()

    def _replay_authenticate(self, auth: Auth) -> Principal:
        """The replayed auth of a forwarded cache op: the client's token, verified again."""
        try:
            return self._verified_principal(auth.token, auth.tenant_id)
        except TokenError as exc:
            raise AuthRefusedError(ErrorCode.UNAUTHENTICATED, str(exc), exc.check) from None

    def _verified_principal(self, token: str, tenant: str) -> Principal:
        """The token's principal, verified against the tenant's keys. A verification is
        reused for at most VERIFIED_TTL seconds and never past the token's expiry; at
        most VERIFIED_MAX are kept (least recently used dropped). Raises TokenError."""
        key = (token, tenant)
        now = time.time()
        held = self._verified.get(key)
        if held is not None:
            principal, at = held
            if now - at < VERIFIED_TTL and now < principal.expires_at:
                self._verified.move_to_end(key)
                return principal
            del self._verified[key]
        principal = self._verify(token, tenant)
        self._verified[key] = (principal, now)
        if len(self._verified) > VERIFIED_MAX:
            self._verified.popitem(last=False)
        return principal

    # -- generation check --------------------------------------------------------------

    async def _await_route(self, shard: ShardId, generation: int) -> None:
        """`_check_route`, after waiting (bounded) for a move of the shard to cut over:
        a forward that reached the old leader during the fence is then told the new
        leader (not_leader, at the newer generation), which the forwarder follows."""
        if self._hold is not None and in_a_move(self._view.snapshot.route(shard)):
            await self._hold.wait(shard)
        self._check_route(shard, generation)

    def _check_route(self, shard: ShardId, generation: int) -> None:
        snapshot = self._view.snapshot
        route = snapshot.route(shard)
        if route is None:
            raise _error(
                ErrorCode.SHARD_UNAVAILABLE,
                "shard unavailable: not_assigned",
                reason="not_assigned",
            )
        if generation > route.generation:
            raise _Refusal(ForwardRefusal(stale_route=StaleRoute(generation=route.generation)))
        leads = snapshot.leads(shard)
        if generation == route.generation and leads:
            return
        leader = snapshot.leader_of(shard)
        if in_a_move(route) and (leader is None or leader.node_id == snapshot.node_id):
            text, detail = moving_refusal("the hold for its cut-over ran out")
            error = PeerError(
                code=ErrorCode.SHARD_UNAVAILABLE.wire,
                retry=RetryClass.RETRY.wire,
                message=text,
                detail=detail,
            )
            raise _Refusal(ForwardRefusal(error=error))
        if leader is None or (leader.node_id == snapshot.node_id and not leads):
            reason = route.reason or "not_ready"
            raise _error(ErrorCode.SHARD_UNAVAILABLE, f"shard unavailable: {reason}", reason=reason)
        # The forwarder is behind: name the leader this broker knows (maybe itself).
        hint = LeaderHint(
            node_id=leader.node_id, addr=leader.client_addr or None, generation=route.generation
        )
        raise _Refusal(ForwardRefusal(not_leader=hint))

    # -- publishes ---------------------------------------------------------------------

    async def _publish(self, message: ForwardPublish) -> PeerMessage | Awaitable[PeerMessage]:
        tenant, ns, name = message.tenant_id, message.namespace, message.stream
        try:
            principal = self._verified_principal(message.token, tenant)
        except TokenError as exc:
            raise _error(
                ErrorCode.FORBIDDEN, f"forbidden: the owner refused the credential: {exc}"
            ) from None
        obj = stream_object(tenant, ns, name)
        if principal.tenant_id != tenant or not principal.permissions.allows(
            Action.STREAM_PUBLISH, obj
        ):
            raise _error(ErrorCode.FORBIDDEN, f"forbidden: {Action.STREAM_PUBLISH.value} on {obj}")
        spec = self._catalog().stream(tenant, ns, name)
        if spec is None:
            raise _error(
                ErrorCode.NOT_FOUND,
                f"stream not found: tenant={tenant} namespace={ns} stream={name}",
            )
        if message.shard >= spec.shards:
            raise _error(ErrorCode.INVALID_REQUEST, f"stream {name} has no shard {message.shard}")
        if not message.payloads:
            raise _error(ErrorCode.INVALID_REQUEST, "a publish batch needs at least one payload")
        await self._await_route(
            ShardId(ShardKind.STREAM, tenant, ns, name, message.shard), message.generation
        )
        engine = self._engine()
        shard = engine.shard(spec, message.shard)
        publish = PublishRequest(shard, list(message.payloads), publisher_of(principal.subject))
        try:
            done = await engine.publish(publish, acked=True)
        except OverloadedError as exc:
            error = PeerError(
                code=ErrorCode.OVERLOADED.wire,
                retry=RetryClass.RETRY_AFTER.wire,
                message=str(exc),
                detail=ErrorDetail(reason="publish_queue_full", retry_after_ms=exc.retry_after_ms),
            )
            raise _Refusal(ForwardRefusal(error=error)) from None
        if message.ack is ForwardAck.ENQUEUED and not spec.replicated:
            done.add_done_callback(_consume)  # answered at enqueue, as a standalone broker does
            return ForwardPublishOk(request_id=message.request_id)
        return asyncio.ensure_future(self._written(message.request_id, done, shard.durable))

    async def _written(
        self, request_id: int, done: asyncio.Future[int], durable: bool
    ) -> PeerMessage:
        try:
            offset = await asyncio.shield(done)
        except ReplicationRefusedError as exc:  # quorum_timeout, not_leader, fenced, ...
            refused = _error(exc.code, str(exc), exc.retry, reason=exc.reason)
            return ForwardRefused(request_id=request_id, refusal=refused.refusal)
        except Exception:
            refused = _error(
                ErrorCode.STORAGE, "the write could not be confirmed", RetryClass.OUTCOME_UNKNOWN
            )
            return ForwardRefused(request_id=request_id, refusal=refused.refusal)
        return ForwardPublishOk(request_id=request_id, offset=offset if durable else None)

    # -- cache and counter ops ---------------------------------------------------------

    async def _cache_op(self, message: ForwardCacheOp, origin: PeerOrigin) -> PeerMessage:
        op = message.op
        proto = StreamProtocol(
            authenticate=self._replay_authenticate,
            server_flags=self._server_flags,
            server_features=self._features(),
            publish_window=1,
            preauth_max_frame_bytes=self._max_frame_bytes,
            max_frame_bytes=self._max_frame_bytes,
        )
        lo, hi = feature_words(message.client_features, peer_reads_hi=True)
        auth = Auth(
            tenant_id=op.tenant_id,
            token=message.token,
            client_flags=message.client_flags,
            client_features=lo,
            client_features_hi=hi,
        )
        outputs = proto.receive(encode_frame(auth))
        if not any(isinstance(out, Authenticated) for out in outputs) or proto.principal is None:
            raise _error(ErrorCode.FORBIDDEN, "forbidden: the owner refused the credential")
        spec = self._catalog().cache(op.tenant_id, op.namespace, op.cache)
        if spec is None:
            raise _error(ErrorCode.NOT_FOUND, f"cache not found: {op.namespace}/{op.cache}")
        index = shard_for_key(op.key.encode(), spec.shards, CACHE_ROUTING)
        if index != message.shard:
            raise _error(
                ErrorCode.INVALID_REQUEST,
                f"key {op.key!r} is on shard {index}, not {message.shard}",
            )
        await self._await_route(
            ShardId(ShardKind.CACHE, op.tenant_id, op.namespace, op.cache, index),
            message.generation,
        )
        handler: Any = self._table.handler_for(type(op))
        if handler is None:
            raise _error(
                ErrorCode.INVALID_REQUEST, f"{type(op).__struct_config__.tag} is not served here"
            )
        io = _CapturedIO(origin.stream)
        await handler(op, RequestContext(proto, io, self._state(origin.connection)))
        frames = FrameReader(max_payload=self._max_frame_bytes).feed(bytes(io.written))
        if len(frames) != 1:
            raise _error(
                ErrorCode.INTERNAL, "the cache op gave no single answer", RetryClass.OUTCOME_UNKNOWN
            )
        answer = decode_message(frames[0].payload)
        return ForwardCacheAnswer(request_id=message.request_id, answer=answer)  # type: ignore[arg-type]

    def _state(self, connection: Connection) -> ConnectionState:
        state = self._states.get(connection)
        if state is None:
            state = self._states[connection] = ConnectionState(
                connection,
                preauth=asyncio.Semaphore(1),
                request_slots=asyncio.Semaphore(1),
                metrics=self._metrics,
            )
            connection_closed = connection.wait_closed()
            task = asyncio.get_running_loop().create_task(connection_closed)
            task.add_done_callback(lambda _t: self._states.pop(connection, None))
        return state
