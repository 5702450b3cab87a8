"""The cluster `Placement`: per request type, what a fleet member does with a
request for a shard it does not lead (docs/architecture.md, "What a non-owner
does with each request type").

`RULES` is the one table, request type -> (how to find the request's shard,
what to do when another broker leads it):

- forwarded (FORWARD): publish, publish_batch, binary publishes (plain, keyed,
  acked), cache get/put/delete/put_if/delete_if, counter add/get. The owner
  re-verifies the client's token and serves it; this broker relays the owner's
  answer (fleet/owner.py). Publishes of one stream are forwarded one after the
  other, so a stream's batches land in the order it sent them. A keyed batch
  whose client stream announced another width (`publish_width`) is refused
  `stale_width` before it leaves, as the owner would for its own client.
- redirected (REDIRECT): subscribe, cache_watch, every group request,
  publish_if, commit, state_get, stream_read, offset_for_time: `not_leader
  {node_id, addr, generation}` to a client that offered FEATURE_REDIRECT, an
  `error` with code `not_leader` otherwise; an idempotent publish (JSON or binary
  0x0100) is refused `publish_refused {not_leader}`.
- anything else (discovery, inspection, auth-free requests) is served here.

A request whose stream or cache this broker's catalog does not know, or that
names another tenant than the client's, or a group request whose group name
breaks the name rule, is served here too: the local handler gives the same
not_found / forbidden / invalid_request answer every broker gives. A shard with no
serving leader (no route, a state other than active, or a leader that is not a
live member) is UNAVAILABLE: `shard_unavailable` with the assignment's reason.

Forwarding is bounded: at most `MAX_FORWARD_ATTEMPTS` owners per request, never
the same (owner, generation) twice; an owner that says the forwarder is behind
(`not_leader` hint) is tried next only if it is a newer generation. A forwarded
request is never forwarded again by its owner (no chains).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from felix_broker.catalog import Catalog
from felix_broker.fleet.moves import MoveHold, in_a_move, moving_refusal
from felix_broker.fleet.peer import (
    PeerDialer,
    PeerOrigin,
    PeerPipe,
    PeerProtocolError,
    PeerUnavailableError,
)
from felix_broker.fleet.routing import (
    AssignmentState,
    Member,
    Route,
    RoutingSnapshot,
    ShardId,
    ShardKind,
)
from felix_broker.fleet.view import FleetView
from felix_broker.session.context import RequestContext, StreamIO
from felix_broker.session.dispatch import PlacementDecision, Request
from felix_broker.streams.service import publish_answer_id, refusal
from felix_common.permissions import Action, cache_object, group_object, stream_object
from felix_wire import encode_frame
from felix_wire.binary import PublishBatchFrame
from felix_wire.errors import ErrorCode, RetryClass, error_code_from_wire, retry_class_from_wire
from felix_wire.features import Feature
from felix_wire.fleet import (
    CacheOp,
    ForwardAck,
    ForwardCacheAnswer,
    ForwardCacheOp,
    ForwardPublish,
    ForwardPublishOk,
    ForwardRefused,
    LeaderHint,
    PeerMessage,
)
from felix_wire.messages import (
    CacheDelete,
    CacheDeleteIf,
    CacheGet,
    CachePut,
    CachePutIf,
    CacheWatch,
    Commit,
    CounterAdd,
    CounterGet,
    ErrorDetail,
    GroupAck,
    GroupDeadLetter,
    GroupDeadLetters,
    GroupDelete,
    GroupDescribe,
    GroupDiscard,
    GroupExtend,
    GroupNack,
    GroupPoll,
    GroupRedrive,
    GroupSeek,
    NotLeader,
    NotLeaderHint,
    OffsetForTime,
    Publish,
    PublishBatch,
    PublishIdempotent,
    PublishIf,
    PublishRefusal,
    PublishRefused,
    StateGet,
    StreamRead,
    Subscribe,
)
from felix_wire.names import name_problem
from felix_wire.routing import shard_for_key

__all__ = [
    "CACHE_ROUTING",
    "MAX_FORWARD_ATTEMPTS",
    "RULES",
    "ClusterPlacement",
    "Rule",
    "unavailable_reason",
]

_log = logging.getLogger(__name__)

MAX_FORWARD_ATTEMPTS = 3
CACHE_ROUTING: Literal["modulo"] = (
    "modulo"  # cache keys hash as UTF-8 bytes, modulo (cache/service.py)
)


# -- which shard a request is for ----------------------------------------------------

ShardOf = Callable[[Any, Catalog], ShardId | None]


def _stream_shard(request: Any, catalog: Catalog) -> ShardId | None:
    spec = catalog.stream(request.tenant_id, request.namespace, request.stream)
    shard = request.shard if request.shard is not None else 0
    if spec is None or not 0 <= shard < spec.shards:
        return None  # the local handler answers (not_found / bad shard), as everywhere
    return ShardId(ShardKind.STREAM, request.tenant_id, request.namespace, request.stream, shard)


def _group_shard(request: Any, catalog: Catalog) -> ShardId | None:
    if name_problem(request.group) is not None:
        return None  # served here: the group handler's invalid_request, as everywhere
    return _stream_shard(request, catalog)


def _stream_keyed(key_of: Callable[[Any], bytes | None]) -> ShardOf:
    def shard_of(request: Any, catalog: Catalog) -> ShardId | None:
        spec = catalog.stream(request.tenant_id, request.namespace, request.stream)
        if spec is None:
            return None
        index = shard_for_key(key_of(request), spec.shards, spec.routing.value)
        return ShardId(
            ShardKind.STREAM, request.tenant_id, request.namespace, request.stream, index
        )

    return shard_of


def _cache_keyed(request: Any, catalog: Catalog) -> ShardId | None:
    spec = catalog.cache(request.tenant_id, request.namespace, request.cache)
    if spec is None:
        return None
    index = shard_for_key(request.key.encode(), spec.shards, CACHE_ROUTING)
    return ShardId(ShardKind.CACHE, request.tenant_id, request.namespace, request.cache, index)


def _cache_watch(request: CacheWatch, catalog: Catalog) -> ShardId | None:
    spec = catalog.cache(request.tenant_id, request.namespace, request.cache)
    if spec is None:
        return None
    if request.key is not None:  # a key watch follows its key's shard (K7)
        index = shard_for_key(request.key.encode(), spec.shards, CACHE_ROUTING)
    elif request.shard is None:
        if spec.shards > 1:
            return None  # the local handler refuses a prefix watch naming no shard
        index = 0
    else:
        index = request.shard
        if not 0 <= index < spec.shards:
            return None
    return ShardId(ShardKind.CACHE, request.tenant_id, request.namespace, request.cache, index)


class Form(enum.Enum):
    """How a request leaves a broker that does not lead its shard."""

    PUBLISH = "publish"  # forwarded; answered as a JSON publish
    PUBLISH_FRAME = "publish_frame"  # forwarded; answered as a binary publish (idempotent: refused)
    CACHE_OP = "cache_op"  # forwarded; the owner's answer is written as is
    REDIRECT = "redirect"  # not_leader (or its error form)
    REFUSE_IDEMPOTENT = "refuse_idempotent"  # publish_refused{not_leader}


Permission = Callable[[Any], tuple[Action, str]]


@dataclass(frozen=True, slots=True)
class Rule:
    shard_of: ShardOf
    form: Form
    # What the request needs: checked before it leaves; a refused one is served here,
    # so the client gets the forbidden answer every broker gives.
    permission: Permission

    @property
    def decision(self) -> PlacementDecision:
        forwarded = self.form in (Form.PUBLISH, Form.PUBLISH_FRAME, Form.CACHE_OP)
        return PlacementDecision.FORWARD if forwarded else PlacementDecision.REDIRECT


def _on_stream(action: Action) -> Permission:
    return lambda r: (action, stream_object(r.tenant_id, r.namespace, r.stream))


def _on_cache(action: Action) -> Permission:
    return lambda r: (action, cache_object(r.tenant_id, r.namespace, r.cache))


def _on_group(action: Action) -> Permission:
    return lambda r: (action, group_object(r.tenant_id, r.namespace, r.stream, r.group))


_by_key = _stream_keyed(lambda r: r.key)
_by_entity = _stream_keyed(lambda r: r.entity_key)
_publish, _subscribe = _on_stream(Action.STREAM_PUBLISH), _on_stream(Action.STREAM_SUBSCRIBE)
_read, _write = _on_cache(Action.CACHE_READ), _on_cache(Action.CACHE_WRITE)
_consume, _manage = _on_group(Action.GROUP_CONSUME), _on_group(Action.GROUP_MANAGE)
RULES: dict[type[Any], Rule] = {
    Publish: Rule(_by_key, Form.PUBLISH, _publish),
    PublishBatch: Rule(_by_key, Form.PUBLISH, _publish),
    PublishBatchFrame: Rule(_by_key, Form.PUBLISH_FRAME, _publish),
    PublishIdempotent: Rule(_by_key, Form.REFUSE_IDEMPOTENT, _publish),
    PublishIf: Rule(_by_key, Form.REDIRECT, _publish),
    Commit: Rule(_by_entity, Form.REDIRECT, _publish),
    StateGet: Rule(_by_entity, Form.REDIRECT, _subscribe),
    Subscribe: Rule(_stream_shard, Form.REDIRECT, _subscribe),
    StreamRead: Rule(_stream_shard, Form.REDIRECT, _subscribe),
    OffsetForTime: Rule(_stream_shard, Form.REDIRECT, _subscribe),
    CacheWatch: Rule(_cache_watch, Form.REDIRECT, _read),
    **{
        kind: Rule(_group_shard, Form.REDIRECT, _consume)
        for kind in (
            GroupPoll,
            GroupAck,
            GroupNack,
            GroupDeadLetters,
            GroupDescribe,
            GroupExtend,
            GroupDeadLetter,
        )
    },
    **{
        kind: Rule(_group_shard, Form.REDIRECT, _manage)
        for kind in (GroupSeek, GroupDelete, GroupRedrive, GroupDiscard)
    },
    **{kind: Rule(_cache_keyed, Form.CACHE_OP, _read) for kind in (CacheGet, CounterGet)},
    **{
        kind: Rule(_cache_keyed, Form.CACHE_OP, _write)
        for kind in (CachePut, CacheDelete, CachePutIf, CacheDeleteIf, CounterAdd)
    },
}
_PUBLISHES = (Form.PUBLISH, Form.PUBLISH_FRAME)
# Reads are never held for a move: refused shard_unavailable/moving at once (A.11).
_NEVER_HELD: frozenset[type[Any]] = frozenset({Subscribe, CacheWatch, StreamRead, OffsetForTime})


def unavailable_reason(route: Route | None, leader: Member | None) -> str:
    if route is None:
        return "not_assigned"
    if route.state is AssignmentState.ACTIVE and leader is None:
        return "owner_unavailable"
    if route.reason:
        return route.reason
    return {
        AssignmentState.MOVING: "moving",
        AssignmentState.DRAINING: "moving",
        AssignmentState.UNAVAILABLE: "owner_unavailable",
    }.get(route.state, "not_ready")


LocalOwner = Callable[[PeerMessage, PeerOrigin], Awaitable[PeerMessage | Awaitable[PeerMessage]]]
"""The owner side's handler (OwnerService.handle), for forwards to this very broker."""

HoldBytes = Callable[[RequestContext, int], Awaitable[Callable[[], None]]]
"""Takes publish bytes from the stream service's budgets; returns their release."""

StaleWidth = Callable[[RequestContext, str, str, str, int], int | None]
"""The width announced on the client stream (`publish_width`) when a keyed batch for
(tenant, namespace, stream) of that many shards must be refused `stale_width`, else
None (streams/width.py): checked before a keyed publish is forwarded, as the owner's
handler checks it for a client on the owner."""


class ClusterPlacement:
    """A fleet member's placement: serve what it leads, forward or redirect the rest."""

    def __init__(
        self,
        *,
        view: FleetView,
        catalog: Callable[[], Catalog],
        dialer: PeerDialer,
        ack_on_commit: bool,
        hold_bytes: HoldBytes,
        hold: MoveHold | None = None,
        stale_width: StaleWidth | None = None,
    ) -> None:
        self._view = view
        self._stale_width = stale_width
        # Writes for a shard in a move wait for its cut-over (fleet/moves.py), then are
        # dispatched anew through `redispatch` (the dispatch table, set once built).
        self._hold = hold
        self.redispatch: Callable[[Request, RequestContext], Awaitable[None]] | None = None
        # This broker's owner side (fleet/owner.py), set once built: a forward whose shard
        # turned out to be led here (a move cut over to this broker while the forward
        # was held at the old owner) is served by it, without the network.
        self.local_owner: LocalOwner | None = None
        self._catalog = catalog
        self._dialer = dialer
        self._ack_on_commit = ack_on_commit
        self._hold_bytes = hold_bytes
        # Forwarded publishes of one client stream go one after the other (ordering).
        self._stream_locks: weakref.WeakKeyDictionary[StreamIO, asyncio.Lock]
        self._stream_locks = weakref.WeakKeyDictionary()
        # Each client stream's ordered pipes, one per owner (fleet/peer.py PeerPipe).
        self._pipes: weakref.WeakKeyDictionary[StreamIO, dict[str, PeerPipe]]
        self._pipes = weakref.WeakKeyDictionary()
        self._settling: set[asyncio.Task[int]] = set()

    # -- the decision ----------------------------------------------------------------

    def place(self, request: Request, ctx: RequestContext) -> PlacementDecision:
        rule = RULES.get(type(request))
        principal = ctx.principal
        if rule is None or request.tenant_id != principal.tenant_id:  # type: ignore[union-attr]
            return PlacementDecision.SERVE_HERE
        if not principal.permissions.allows(*rule.permission(request)):
            return PlacementDecision.SERVE_HERE  # the handler's forbidden, as everywhere
        shard = rule.shard_of(request, self._catalog())
        if shard is None:
            return PlacementDecision.SERVE_HERE
        snapshot = self._view.snapshot
        if snapshot.leads(shard):
            return PlacementDecision.SERVE_HERE
        if snapshot.leader_of(shard) is None or not self._active(snapshot, shard):
            return PlacementDecision.UNAVAILABLE
        return rule.decision

    @staticmethod
    def _active(snapshot: RoutingSnapshot, shard: ShardId) -> bool:
        route = snapshot.route(shard)
        return route is not None and route.state is AssignmentState.ACTIVE

    async def elsewhere(
        self, decision: PlacementDecision, request: Request, ctx: RequestContext
    ) -> None:
        rule = RULES[type(request)]
        shard = rule.shard_of(request, self._catalog())
        assert shard is not None
        snapshot = self._view.snapshot
        form = rule.form
        if form is Form.PUBLISH_FRAME and getattr(request, "producer_id", None) is not None:
            form = Form.REFUSE_IDEMPOTENT  # a binary idempotent publish (0x0100)
        if decision is PlacementDecision.UNAVAILABLE:
            route = snapshot.route(shard)
            if in_a_move(route) and type(request) not in _NEVER_HELD:
                await self._held(request, ctx, form, shard)
                return
            reason = unavailable_reason(route, snapshot.leader_of(shard))
            await self._unavailable(request, ctx, form, reason)
        elif form in (Form.REDIRECT, Form.REFUSE_IDEMPOTENT):
            await self._redirect(request, ctx, form, snapshot, shard)
        elif form in _PUBLISHES:
            await self._forward_publish(request, ctx, form, shard)
        else:
            await ctx.connection.spawn_request(
                self._forward_cache(request, ctx, shard), "forward_cache_op", ctx.io
            )

    async def _held(self, request: Any, ctx: RequestContext, form: Form, shard: ShardId) -> None:
        """A write for a shard in a move: held until the cut-over, then dispatched anew
        (served here, forwarded or redirected to the new owner); refused
        shard_unavailable/moving with retry_after_ms at the hold's bounds."""
        hold, redispatch = self._hold, self.redispatch
        can_hold = hold is not None and redispatch is not None and not hold.redispatched
        if can_hold and hold is not None and redispatch is not None and await hold.wait(shard):
            await hold.again(lambda: redispatch(request, ctx))
            return
        text, detail = moving_refusal("the hold for its cut-over ran out")
        await self._unavailable(request, ctx, form, "moving", detail, text)

    # -- shard_unavailable and not_leader ----------------------------------------------

    async def _unavailable(
        self,
        request: Any,
        ctx: RequestContext,
        form: Form,
        reason: str,
        detail: ErrorDetail | None = None,
        text: str | None = None,
    ) -> None:
        text = text or f"shard unavailable: {reason}"
        detail = detail or ErrorDetail(reason=reason)
        if form in _PUBLISHES:
            rid = self._publish_rid(request, ctx, form)
            if rid is not None:
                answer = ctx.proto.publish_answer(
                    rid,
                    binary=form is Form.PUBLISH_FRAME,
                    error=(ErrorCode.SHARD_UNAVAILABLE, text),
                    detail=detail,
                )
                await ctx.answer_in_order(None, lambda _r: answer)
            return
        await ctx.write(ctx.proto.error(ErrorCode.SHARD_UNAVAILABLE, text, detail=detail))

    async def _redirect(
        self,
        request: Any,
        ctx: RequestContext,
        form: Form,
        snapshot: RoutingSnapshot,
        shard: ShardId,
    ) -> None:
        leader = snapshot.leader_of(shard)
        route = snapshot.route(shard)
        assert leader is not None and route is not None
        addr = leader.client_addr or None
        proto = ctx.proto
        if form is Form.REFUSE_IDEMPOTENT:
            # Idempotent publishes are never forwarded: two ingress brokers could each
            # deliver one copy.
            rid = request.request_id
            assert rid is not None
            if not proto.negotiated(Feature.FEATURE_IDEMPOTENT_PRODUCER):
                # The client does not decode publish_refused: the error it decodes.
                text = f"not the leader: {leader.node_id} at {addr or 'unknown'} leads this shard"
                error = proto.publish_answer(rid, binary=False, error=(ErrorCode.NOT_LEADER, text))
                await ctx.answer_in_order(None, lambda _r: error)
                return
            refused = PublishRefused(
                request_id=rid,
                reason=PublishRefusal(not_leader=NotLeaderHint(node_id=leader.node_id, addr=addr)),
                message=f"not the leader: {leader.node_id} leads this shard",
            )
            answer = proto.message(refused)
            await ctx.answer_in_order(None, lambda _r: answer)
            return
        if proto.negotiated(Feature.FEATURE_REDIRECT):
            message = NotLeader(node_id=leader.node_id, addr=addr, generation=route.generation)
            await ctx.write(proto.message(message))
            return
        text = f"not the leader: {leader.node_id}"
        if addr:
            text += f" at {addr}"
        await ctx.write(
            proto.error(
                ErrorCode.NOT_LEADER, f"{text} leads this shard (generation {route.generation})"
            )
        )

    # -- forwarding ----------------------------------------------------------------------

    def _publish_rid(self, request: Any, ctx: RequestContext, form: Form) -> int | None:
        """The request id this publish is answered by (None: not answered; -1: it
        owes an answer but names no request_id)."""
        if ctx.proto.publish_only:
            return None
        if form is Form.PUBLISH_FRAME:
            rid: int | None = request.request_id
            return rid
        return publish_answer_id(request, ctx.proto)

    async def _forward_publish(
        self, request: Any, ctx: RequestContext, form: Form, shard: ShardId
    ) -> None:
        proto = ctx.proto
        binary = form is Form.PUBLISH_FRAME
        rid = self._publish_rid(request, ctx, form)
        if rid == -1:
            await ctx.write(
                proto.error(ErrorCode.INVALID_REQUEST, "an acked publish needs a request_id")
            )
            return
        many: list[bytes] | None = getattr(request, "payloads", None)
        payloads = list(many) if many is not None else [request.payload]

        async def answer(build: Callable[[int | None], bytes]) -> None:
            if rid is not None:
                await ctx.answer_in_order(None, build)

        tenant, ns, stream = request.tenant_id, request.namespace, request.stream
        denied = refusal(ctx, tenant, Action.STREAM_PUBLISH, stream_object(tenant, ns, stream))
        if denied is not None:
            code, text = denied
            await answer(
                lambda _r: proto.publish_answer(rid or 0, binary=binary, error=(code, text))
            )
            return
        if not payloads:
            await answer(
                lambda _r: proto.publish_answer(
                    rid or 0,
                    binary=binary,
                    error=(ErrorCode.INVALID_REQUEST, "a publish batch needs at least one payload"),
                )
            )
            return
        spec = self._catalog().stream(tenant, ns, stream)
        announced = (
            self._stale_width(ctx, tenant, ns, stream, spec.shards)
            if self._stale_width is not None and request.key is not None and spec is not None
            else None
        )
        if announced is not None and spec is not None:
            text = (
                f"stale width: the batch was routed by {announced} shard(s); "
                f"stream {stream} has {spec.shards}"
            )
            await answer(
                lambda _r: proto.publish_answer(
                    rid or 0, binary=binary, error=(ErrorCode.STALE_WIDTH, text)
                )
            )
            return
        after_write = self._ack_on_commit or proto.negotiated(Feature.FEATURE_ACK_ON_COMMIT)

        def build(generation: int, request_id: int) -> PeerMessage:
            return ForwardPublish(
                request_id=request_id,
                token=ctx.token,
                tenant_id=tenant,
                namespace=ns,
                stream=stream,
                shard=shard.shard,
                generation=generation,
                key=request.key,
                payloads=payloads,
                ack=ForwardAck.WRITTEN if after_write else ForwardAck.ENQUEUED,
            )

        def answer_of(outcome: _Owned | _Failed) -> bytes:
            if isinstance(outcome, _Owned):
                ok = outcome.answer
                assert isinstance(ok, ForwardPublishOk)
                owner = (outcome.node_id, outcome.addr, outcome.generation)
                return proto.publish_answer(rid or 0, binary=binary, offset=ok.offset, owner=owner)
            return proto.publish_answer(
                rid or 0,
                binary=binary,
                error=(outcome.code, outcome.text),
                retry=outcome.retry,
                detail=outcome.detail,
            )

        # A forward holds its bytes in the same budgets as a local publish (per identity,
        # connection and broker) until the owner answered; waiting stops the stream.
        release = await self._hold_bytes(ctx, sum(map(len, payloads)))
        # Sent now, in the stream's order, on the stream's pipe to the owner; the answer
        # settles later and goes out in order with the stream's other answers.
        try:
            sent = await self._send_in_order(ctx, shard, build)
        except BaseException:
            release()
            raise
        built: list[bytes] = []

        async def settle() -> int:
            try:
                built.append(answer_of(await self._settle(ctx, shard, build, sent)))
            finally:
                release()
            return 0

        task = asyncio.get_running_loop().create_task(settle())
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        if rid is None:
            return
        fallback = proto.publish_answer(
            rid,
            binary=binary,
            error=(ErrorCode.INTERNAL, "the forward failed"),
            retry=RetryClass.OUTCOME_UNKNOWN,
        )
        await ctx.answer_in_order(task, lambda _r: built[0] if built else fallback)

    async def _send_in_order(
        self, ctx: RequestContext, shard: ShardId, build: Callable[[int, int], PeerMessage]
    ) -> _Sent | _Failed:
        """Write a forward on this client stream's pipe to the shard's owner."""
        snapshot = self._view.snapshot
        route, leader = snapshot.route(shard), snapshot.leader_of(shard)
        if route is None or leader is None:
            return _OWNER_UNAVAILABLE
        if leader.node_id == snapshot.node_id:
            return _LED_HERE  # the shard came here meanwhile: `_settle` serves it here
        pipes = self._pipes.get(ctx.io)
        if pipes is None:
            pipes = self._pipes[ctx.io] = {}
        for _attempt in range(2):  # an idle pipe closes itself: open the next once
            pipe = pipes.get(leader.node_id)
            try:
                if pipe is None or not pipe.usable:
                    pipe = pipes[leader.node_id] = await self._dialer.pipe(
                        leader.node_id, leader.peer_addr
                    )
                future = await pipe.send(build(route.generation, 1))
            except PeerUnavailableError as exc:
                if exc.sent:
                    return _unacknowledged(leader.node_id)
                pipes.pop(leader.node_id, None)
                continue
            return _Sent(pipe, future, leader, route.generation)
        return _OWNER_UNAVAILABLE

    async def _settle(
        self,
        ctx: RequestContext,
        shard: ShardId,
        build: Callable[[int, int], PeerMessage],
        sent: _Sent | _Failed,
    ) -> _Owned | _Failed:
        """The owner's answer to a pipelined forward; a refusal naming another owner or
        generation is retried one forward at a time (bounded)."""
        if sent is _LED_HERE:
            return await self._forward(ctx, shard, build)
        if isinstance(sent, _Failed):
            return sent
        try:
            answer = await sent.pipe.answer(sent.future)
        except PeerUnavailableError as exc:
            return _unacknowledged(sent.member.node_id) if exc.sent else _OWNER_UNAVAILABLE
        except PeerProtocolError as exc:
            _log.warning("forward to %s: %s", sent.member.node_id, exc)
            return _bad_answer(sent.member.node_id)
        outcome = _interpret(answer, sent.member, sent.generation)
        if not isinstance(outcome, LeaderHint):
            return outcome
        lock = self._stream_locks.get(ctx.io)
        if lock is None:
            lock = self._stream_locks[ctx.io] = asyncio.Lock()
        async with lock:  # retries of one stream go one after the other, in order
            return await self._forward(ctx, shard, build)

    async def _forward_cache(self, request: Any, ctx: RequestContext, shard: ShardId) -> None:
        proto = ctx.proto
        op: CacheOp = request
        client = proto.client
        outcome = await self._forward(
            ctx,
            shard,
            lambda generation, request_id: ForwardCacheOp(
                request_id=request_id,
                token=ctx.token,
                client_flags=client.flags,
                client_features=client.features,
                shard=shard.shard,
                generation=generation,
                op=op,
            ),
        )
        if isinstance(outcome, _Owned):
            answer = outcome.answer
            assert isinstance(answer, ForwardCacheAnswer)
            await ctx.write(encode_frame(answer.answer))
        else:
            await ctx.write(
                proto.error(outcome.code, outcome.text, retry=outcome.retry, detail=outcome.detail)
            )

    async def _forward(
        self,
        ctx: RequestContext,
        shard: ShardId,
        build: Callable[[int, int], PeerMessage],
    ) -> _Owned | _Failed:
        """Send a forward to the shard's owner; follow a newer owner's hint a bounded
        number of times. Returns the owner's answer or why there is none."""
        snapshot = self._view.snapshot
        route = snapshot.route(shard)
        leader = snapshot.leader_of(shard)
        tried: set[tuple[str, int]] = set()
        failed = _Failed(
            ErrorCode.SHARD_UNAVAILABLE,
            "shard unavailable: owner_unavailable",
            None,
            ErrorDetail(reason="owner_unavailable"),
        )
        target = (leader, route.generation) if leader is not None and route is not None else None
        for attempt in range(MAX_FORWARD_ATTEMPTS):
            if target is None:
                return failed
            member, generation = target
            if (member.node_id, generation) in tried:
                return failed  # never the same owner twice
            tried.add((member.node_id, generation))
            if member.node_id == snapshot.node_id:
                # Led here now: served by this broker's owner side (never forwarded on).
                if self.local_owner is None:
                    return failed
                origin = PeerOrigin(member.node_id, ctx.connection.connection, ctx.io.stream)
                served = await self.local_owner(build(generation, attempt + 1), origin)
                answer = await served if inspect.isawaitable(served) else served
                outcome = _interpret(answer, member, generation)
                return outcome if not isinstance(outcome, LeaderHint) else failed
            try:
                answer = await self._dialer.request(
                    member.node_id, member.peer_addr, build(generation, attempt + 1)
                )
            except PeerUnavailableError as exc:
                _log.info("forward to %s failed: %s", member.node_id, exc)
                if exc.sent:  # it may have been applied: never resent
                    return _Failed(
                        ErrorCode.UNACKNOWLEDGED,
                        f"the owner {member.node_id} did not answer",
                        RetryClass.OUTCOME_UNKNOWN,
                        None,
                    )
                return failed
            except PeerProtocolError as exc:
                _log.warning("forward to %s: %s", member.node_id, exc)
                return _Failed(
                    ErrorCode.INTERNAL,
                    f"the owner {member.node_id} answered badly",
                    RetryClass.OUTCOME_UNKNOWN,
                    None,
                )
            outcome = _interpret(answer, member, generation)
            if not isinstance(outcome, LeaderHint):
                return outcome
            hint = outcome
            if hint.generation <= generation:
                return failed
            named = self._view.snapshot.members.get(hint.node_id)
            target = (named, hint.generation) if named is not None else None
        return failed


def _interpret(
    answer: PeerMessage, member: Member, generation: int
) -> _Owned | _Failed | LeaderHint:
    """An owner's answer: served, refused (as the client will see it), or a newer
    leader to try."""
    node = member.node_id
    if isinstance(answer, ForwardPublishOk | ForwardCacheAnswer):
        return _Owned(answer, node, member.client_addr, generation)
    if not isinstance(answer, ForwardRefused):
        return _Failed(
            ErrorCode.INTERNAL, f"the owner {node} does not serve forwards", RetryClass.RETRY, None
        )
    refused = answer.refusal
    if refused.error is not None:
        err = refused.error
        code = error_code_from_wire(err.code)
        return _Failed(
            code if isinstance(code, ErrorCode) else ErrorCode.INTERNAL,
            err.message,
            retry_class_from_wire(err.retry),
            err.detail,
        )
    if refused.stale_route is not None:
        # The owner is behind us: it must not write; the client retries.
        return _Failed(
            ErrorCode.SHARD_UNAVAILABLE,
            "shard unavailable: stale",
            None,
            ErrorDetail(reason="stale"),
        )
    assert refused.not_leader is not None
    return refused.not_leader


def _unacknowledged(node: str) -> _Failed:
    return _Failed(
        ErrorCode.UNACKNOWLEDGED,
        f"the owner {node} did not answer",
        RetryClass.OUTCOME_UNKNOWN,
        None,
    )


def _bad_answer(node: str) -> _Failed:
    return _Failed(
        ErrorCode.INTERNAL, f"the owner {node} answered badly", RetryClass.OUTCOME_UNKNOWN, None
    )


@dataclass(frozen=True, slots=True)
class _Sent:
    pipe: PeerPipe
    future: asyncio.Future[PeerMessage]
    member: Member
    generation: int


@dataclass(frozen=True, slots=True)
class _Owned:
    answer: PeerMessage
    node_id: str
    addr: str
    generation: int


@dataclass(frozen=True, slots=True)
class _Failed:
    code: ErrorCode
    text: str
    retry: RetryClass | None
    detail: ErrorDetail | None


_OWNER_UNAVAILABLE = _Failed(
    ErrorCode.SHARD_UNAVAILABLE,
    "shard unavailable: owner_unavailable",
    None,
    ErrorDetail(reason="owner_unavailable"),
)
# The shard is led by this very broker now (a move cut over to it).
_LED_HERE = _Failed(
    ErrorCode.SHARD_UNAVAILABLE, "shard unavailable: led here", None, ErrorDetail(reason="moving")
)
