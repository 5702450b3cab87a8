"""The stream service: publish, subscribe, stream_read and offset_for_time.

Handlers admit a request (permission, catalog, shard), hand the work to the
`Engine` (engine.py) and answer through the request's context. All of them run
inline on the stream's reader (dispatch.py), so a stream's publishes reach the
engine, and their answers leave, in the order the stream carried them (PL2).

Publishing. An acked publish is answered once queued, unless the broker
(`ack_on_commit`) or this client (FEATURE_ACK_ON_COMMIT) asked for answers
after the write (A5); in-memory streams never report offsets. The answers of
one stream are queued in order (`RequestContext.answer_in_order`, at most
`publish_window` pending); a full queue stops the stream's reader.

Publish bytes in flight are bounded per connection and identity, per
connection and per broker (budget.py): a publish that does not fit waits, and
its stream is not read meanwhile.

Subscribing. A subscription gets a broker-opened unidirectional stream fed by
its `SubscriptionWriter` (delivery.py) from the subscriber's bounded queue; it
outlives the control stream that made it and ends on STOP_SENDING, when the
connection goes, or when its stream is deleted from the catalog.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from felix_broker.catalog import StreamSpec
from felix_broker.config import BrokerConfig
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.driver import ReplicationRefusedError
from felix_broker.session.context import ConnectionState, RequestContext
from felix_broker.session.dispatch import DispatchTable
from felix_broker.session.protocol import StreamProtocol
from felix_broker.storage import StorageError
from felix_broker.streams.budget import ByteBudget
from felix_broker.streams.delivery import SubscriptionWriter
from felix_broker.streams.engine import (
    Engine,
    OverloadedError,
    PublishRequest,
    Shard,
    Subscriber,
    publisher_of,
)
from felix_broker.streams.width import StreamWidths
from felix_common.permissions import Action, stream_object
from felix_transport import Stream, StreamClosedError
from felix_transport.events import ConnectionClosedError
from felix_wire.binary import PublishBatchFrame
from felix_wire.errors import ErrorCode
from felix_wire.features import Feature
from felix_wire.flags import Flag
from felix_wire.messages import (
    AckMode,
    CursorErrorReason,
    ErrorDetail,
    OffsetForTime,
    OffsetValue,
    Publish,
    PublishBatch,
    StartOffset,
    StreamRead,
    StreamRecord,
    StreamRecords,
    Subscribe,
    SubscribeCursorError,
    Subscribed,
)

__all__ = [
    "DURABLE_FEATURES",
    "READ_MAX_BYTES",
    "STREAM_FEATURES",
    "StreamService",
    "publish_answer_id",
    "refusal",
]

# Features the stream service serves on any broker.
STREAM_FEATURES = int(
    Feature.FEATURE_PUBLISH_PIPELINE
    | Feature.FEATURE_STREAM_PUBLISH_WINDOW
    | Feature.FEATURE_SUBSCRIBE_QUEUE
    | Feature.FEATURE_ACK_ON_COMMIT
)
# Served only with durable storage: bounded reads and time lookups need a log.
DURABLE_FEATURES = int(Feature.FEATURE_STREAM_READ | Feature.FEATURE_RECORD_TIMESTAMPS)

READ_MAX_BYTES = 4 * 1024 * 1024  # a stream_read page's payload cap (R1)
# Pages of fewer records are encoded on the event loop (a thread hop costs more).
_ENCODE_ON_LOOP_RECORDS = 64


def refusal(
    ctx: RequestContext, tenant_id: str, action: Action, obj: str
) -> tuple[ErrorCode, str] | None:
    """Why the stream's principal may not do `action` on `obj`, or None."""
    principal = ctx.principal
    if tenant_id != principal.tenant_id:
        return ErrorCode.FORBIDDEN, "forbidden: the token is for another tenant"
    if not principal.permissions.allows(action, obj):
        return ErrorCode.FORBIDDEN, f"forbidden: {action.value} on {obj}"
    return None


def publish_answer_id(message: Publish | PublishBatch, proto: StreamProtocol) -> int | None:
    """The request id a JSON publish is answered by: None when it owes no answer, -1
    when it owes one but names no request_id (refused invalid_request)."""
    ack = message.ack or AckMode.NONE
    wants_answer = ack is not AckMode.NONE or (
        # decision ack-default: a pipelining client's request_id owes an answer.
        message.ack is None
        and message.request_id is not None
        and proto.negotiated(Feature.FEATURE_PUBLISH_PIPELINE)
    )
    if not wants_answer:
        return None
    return -1 if message.request_id is None else message.request_id


class StreamService:
    """Publish, subscribe and (with durable storage) bounded reads, over the engine."""

    def __init__(
        self, *, config: BrokerConfig, engine: Engine, metrics: BrokerMetrics, durable: bool
    ) -> None:
        self._config = config
        self._engine = engine
        self._metrics = metrics
        self._durable = durable
        self._inflight = ByteBudget(config.pub_inflight_bytes)  # the whole broker's
        # Read at scrape time: nothing to count per publish.
        metrics.publish_inflight_bytes.set_function(lambda: self._inflight.held)
        # Set by the composition root when guarded writes are served (guarded.py):
        # binary idempotent frames (0x0100) go there, and keyed batches routed by a
        # width other than the stream's (publish_width) are refused stale_width.
        self.idempotent_frames: (
            Callable[[PublishBatchFrame, RequestContext], Awaitable[None]] | None
        ) = None
        self.widths: StreamWidths | None = None

    @property
    def features(self) -> int:
        return STREAM_FEATURES | (DURABLE_FEATURES if self._durable else 0)

    def register(self, table: DispatchTable) -> None:
        table.register(PublishBatchFrame, self.publish_binary)
        table.register(Publish, self.publish_json)
        table.register(PublishBatch, self.publish_batch_json)
        table.register(Subscribe, self.subscribe)
        if self._durable:
            table.register(StreamRead, self.stream_read)
            table.register(OffsetForTime, self.offset_for_time)

    # -- publish ---------------------------------------------------------------------

    async def publish_binary(self, frame: PublishBatchFrame, ctx: RequestContext) -> None:
        if frame.producer_id is not None and self.idempotent_frames is not None:
            await self.idempotent_frames(frame, ctx)
            return
        acked = frame.request_id is not None
        await self._publish(
            ctx,
            tenant_id=frame.tenant_id,
            namespace=frame.namespace,
            stream=frame.stream,
            payloads=frame.payloads,
            key=frame.key,
            request_id=frame.request_id if acked else None,
            binary=True,
        )

    async def publish_json(self, message: Publish, ctx: RequestContext) -> None:
        await self._publish_json(ctx, message, [message.payload], "publish")

    async def publish_batch_json(self, message: PublishBatch, ctx: RequestContext) -> None:
        await self._publish_json(ctx, message, list(message.payloads), "publish_batch")

    async def _publish_json(
        self,
        ctx: RequestContext,
        message: Publish | PublishBatch,
        payloads: list[bytes],
        frame_type: str,
    ) -> None:
        proto = ctx.proto
        self._metrics.json_publishes.labels(frame=frame_type).inc()
        request_id = publish_answer_id(message, proto)
        if request_id == -1:
            await ctx.write(
                proto.error(ErrorCode.INVALID_REQUEST, "an acked publish needs a request_id")
            )
            return
        await self._publish(
            ctx,
            tenant_id=message.tenant_id,
            namespace=message.namespace,
            stream=message.stream,
            payloads=payloads,
            key=message.key,
            request_id=request_id,
            binary=False,
        )

    async def _publish(
        self,
        ctx: RequestContext,
        *,
        tenant_id: str,
        namespace: str,
        stream: str,
        payloads: list[bytes],
        key: bytes | None,
        request_id: int | None,
        binary: bool,
    ) -> None:
        started = time.perf_counter()
        proto = ctx.proto
        if proto.publish_only:
            request_id = None  # nothing is ever answered on a publish-only stream (T7)

        async def refuse(code: ErrorCode, text: str, detail: ErrorDetail | None = None) -> None:
            if request_id is not None:
                answer = proto.publish_answer(
                    request_id, binary=binary, error=(code, text), detail=detail
                )
                await ctx.answer_in_order(None, lambda _r: answer)

        denied = refusal(
            ctx, tenant_id, Action.STREAM_PUBLISH, stream_object(tenant_id, namespace, stream)
        )
        if denied is not None:
            await refuse(*denied)
            return
        spec = self._engine.stream(tenant_id, namespace, stream)
        if spec is None:
            await refuse(
                ErrorCode.NOT_FOUND,
                f"stream not found: tenant={tenant_id} namespace={namespace} stream={stream}",
            )
            return
        if not payloads:
            await refuse(ErrorCode.INVALID_REQUEST, "a publish batch needs at least one payload")
            return
        if self.widths is not None:
            announced = self.widths.stale(
                ctx.io, tenant_id, namespace, stream, keyed=key is not None, actual=spec.shards
            )
            if announced is not None:
                await refuse(
                    ErrorCode.STALE_WIDTH,
                    f"stale width: the batch was routed by {announced} shard(s); "
                    f"stream {stream} has {spec.shards}",
                )
                return
        try:
            shard = self._engine.shard_for(spec, key)
        except StorageError as exc:
            # The shard's log could not be opened (e.g. ENOSPC on its first segment).
            await refuse(ErrorCode.STORAGE, str(exc))
            return
        publish = PublishRequest(shard, payloads, publisher_of(ctx.principal.subject))
        # Held until the worker has appended it; waiting here stops this stream's reader.
        release = await self._hold_bytes(ctx, publish.size)
        try:
            done = await self._engine.publish(publish, acked=request_id is not None)
        except OverloadedError as exc:
            release()
            await refuse(
                ErrorCode.OVERLOADED,
                str(exc),
                ErrorDetail(reason="publish_queue_full", retry_after_ms=exc.retry_after_ms),
            )
            return
        except BaseException:
            release()
            raise
        done.add_done_callback(lambda _f: release())
        if request_id is None:
            return
        # Acknowledged when queued, unless the broker or this client asked for acks
        # after the write (A5). In-memory streams never report offsets.
        # A replicated (Quorum) shard acknowledges only at the quorum mark.
        after_write = (
            self._config.ack_on_commit
            or proto.negotiated(Feature.FEATURE_ACK_ON_COMMIT)
            or spec.replicated
        )
        rid = request_id
        durable = shard.durable
        ack_seconds = self._metrics.publish_ack_seconds

        def answer(offset: int | None) -> bytes:
            # Built just before it is written: received -> (appended, synced) -> answered.
            ack_seconds.observe(time.perf_counter() - started)
            refused = _replication_refusal(done) if offset is None else None
            if refused is not None:  # quorum_timeout, not_leader, fenced, leadership_lost
                reason = ErrorDetail(reason=refused.reason) if refused.reason else None
                return proto.publish_answer(
                    rid,
                    binary=binary,
                    error=(refused.code, str(refused)),
                    retry=refused.retry,
                    detail=reason,
                )
            if offset is None and after_write:
                # The write failed after the publish was queued: it may or may not be on disk.
                return proto.publish_answer(
                    rid,
                    binary=binary,
                    error=(ErrorCode.STORAGE, "the write could not be confirmed"),
                )
            return proto.publish_answer(rid, binary=binary, offset=offset if durable else None)

        await ctx.answer_in_order(done if after_write else None, answer)

    async def hold_publish_bytes(self, ctx: RequestContext, size: int) -> Callable[[], None]:
        """The byte budgets of `_hold_bytes`, for the engine's other publishers (guarded.py)."""
        return await self._hold_bytes(ctx, size)

    async def _hold_bytes(self, ctx: RequestContext, size: int) -> Callable[[], None]:
        """Take `size` bytes from the connection's identity budget, the connection's
        and the broker's (budget.py), waiting until they fit; returns the release."""
        config = self._config
        principal = ctx.principal
        budgets = ctx.connection.publish_bytes
        identity = f"{principal.tenant_id}/{principal.subject}"
        mine = budgets.get(identity)
        if mine is None:
            mine = budgets[identity] = ByteBudget(config.pub_conn_inflight_bytes)
        total = budgets.get("")
        if total is None:
            total = budgets[""] = ByteBudget(config.effective_pub_conn_total_inflight_bytes)
        held: list[ByteBudget] = []
        try:
            for budget in (mine, total, self._inflight):
                await budget.acquire(size)
                held.append(budget)
        except BaseException:
            for budget in held:
                budget.release(size)
            raise
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                for budget in held:
                    budget.release(size)

        return release

    # -- subscribe -------------------------------------------------------------------

    async def subscribe(self, request: Subscribe, ctx: RequestContext) -> None:
        proto, state = ctx.proto, ctx.connection
        tenant, namespace, name = request.tenant_id, request.namespace, request.stream
        denied = refusal(
            ctx, tenant, Action.STREAM_SUBSCRIBE, stream_object(tenant, namespace, name)
        )
        if denied is not None:
            await ctx.write(proto.error(*denied))
            return
        spec = self._engine.stream(tenant, namespace, name)
        if spec is None:
            await ctx.write(
                proto.error(
                    ErrorCode.NOT_FOUND,
                    f"stream not found: tenant={tenant} namespace={namespace} stream={name}",
                )
            )
            return
        index = request.shard or 0
        if index >= spec.shards:
            await ctx.write(
                proto.error(
                    ErrorCode.INVALID_REQUEST,
                    f"stream {name} has {spec.shards} shard(s), not {index + 1}",
                )
            )
            return
        gated = _gated(proto, self._engine.read_refusal(spec, index))
        if gated is not None:  # a replicated shard this broker cannot serve reads of yet
            await ctx.write(gated)
            return
        principal = ctx.principal
        identity = f"{principal.tenant_id}/{principal.subject}"
        config = self._config
        if (
            state.identity_count(identity) >= config.max_subscriptions_per_conn
            or len(state.subscriptions) >= config.max_subscriptions_per_conn_total
        ):
            await ctx.write(
                proto.error(ErrorCode.LIMIT_EXCEEDED, "too many subscriptions on this connection")
            )
            return
        try:
            shard = self._engine.shard(spec, index)
        except StorageError as exc:
            await ctx.write(proto.error(ErrorCode.STORAGE, str(exc)))
            return
        start = _start_position(shard, request)
        if isinstance(start, SubscribeCursorError):
            await ctx.write(proto.message(start))
            return
        capacity = None
        if request.queue_capacity is not None and ctx.serves(Feature.FEATURE_SUBSCRIBE_QUEUE):
            capacity = self._engine.clamp_queue_capacity(request.queue_capacity)
        # Register the live subscriber first, then read history: nothing appended in
        # between can fall through (the writer joins the two by offset).
        live = shard.next_offset
        sub = self._engine.subscribe(shard, proto.client, capacity=capacity)
        sub.shard_moved_capable = proto.client.has_feature(Feature.FEATURE_SHARD_MOVED)
        state.subscriptions[sub] = identity
        # It ends when the token it was opened under expires (plus the leeway).
        ctx.io.on_expire.append(lambda: self.end_subscription(state, sub))
        subscribed = Subscribed(subscription_id=sub.subscription_id, queue_capacity=capacity)
        if shard.durable:
            # Shaping keeps these for clients that negotiated EVENT_BATCH_OFFSETS only.
            subscribed.start_offset = start
            subscribed.live_offset = live
        try:
            await ctx.write(proto.message(subscribed))
            uni = await ctx.open_uni_stream()
        except (StreamClosedError, ConnectionClosedError):
            self.end_subscription(state, sub)
            return
        lagged = shard.durable and proto.client.has(
            Flag.EVENT_BATCH_OFFSETS, Feature.FEATURE_SUBSCRIPTION_LAGGED
        )
        ctx.spawn(
            self._deliver(state, sub, uni, start if shard.durable else None, lagged),
            "subscription_delivery",
        )

    async def _deliver(
        self,
        state: ConnectionState,
        sub: Subscriber,
        uni: Stream,
        start: int | None,
        lagged_capable: bool,
    ) -> None:
        """Run one subscription's writer (delivery.py), then forget the subscription."""
        writer = SubscriptionWriter(
            sub,
            uni,
            max_records=self._config.event_batch_max_events * 16,
            max_bytes=self._config.event_batch_max_bytes * 16,
        )
        try:
            await writer.run(start, lagged_capable)
        finally:
            self.end_subscription(state, sub)
            if not state.connection.closed:
                with contextlib.suppress(Exception):
                    uni.reset(0)

    def end_subscription(self, state: ConnectionState, sub: Subscriber) -> None:
        state.subscriptions.pop(sub, None)
        self._engine.unsubscribe(sub)

    def end_connection(self, state: ConnectionState) -> None:
        """The connection went: every subscription it held ends."""
        for sub in list(state.subscriptions):
            self.end_subscription(state, sub)

    def end_stream_subscriptions(
        self, states: list[ConnectionState], tenant: str, namespace: str, name: str
    ) -> None:
        """A stream was deleted: its subscriptions end (their event streams finish) and
        its shards are forgotten, so a stream created again starts afresh."""
        key = (tenant, namespace, name)
        for state in states:
            for sub in list(state.subscriptions):
                spec = sub.shard.spec
                if (spec.tenant_id, spec.namespace, spec.name) == key:
                    self.end_subscription(state, sub)
        self._engine.forget_stream(tenant, namespace, name)

    def end_shard_subscriptions(
        self,
        states: list[ConnectionState],
        key: tuple[str, str, str, int],
        moved_to: tuple[str | None, str | None, int],
    ) -> int:
        """This broker stopped serving one shard (a move's fence, a lapsed lease): each
        of its subscriptions ends after what is queued, with shard_moved naming
        `moved_to` (node_id, addr, generation). Returns how many were ended."""
        ended = 0
        for state in states:
            for sub in list(state.subscriptions):
                spec = sub.shard.spec
                if (spec.tenant_id, spec.namespace, spec.name, sub.shard.index) == key:
                    sub.end_moved(*moved_to)
                    ended += 1
        return ended

    # -- bounded reads ------------------------------------------------------------------

    def _durable_shard(
        self, ctx: RequestContext, tenant: str, namespace: str, name: str, index: int
    ) -> Shard | bytes:
        """The durable shard a read names, or the error frame that refuses it."""
        proto = ctx.proto
        denied = refusal(
            ctx, tenant, Action.STREAM_SUBSCRIBE, stream_object(tenant, namespace, name)
        )
        if denied is not None:
            return proto.error(*denied)
        spec: StreamSpec | None = self._engine.stream(tenant, namespace, name)
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
        gated = _gated(proto, self._engine.read_refusal(spec, index))
        if gated is not None:
            return gated
        try:
            return self._engine.shard(spec, index)
        except StorageError as exc:
            return proto.error(ErrorCode.STORAGE, str(exc))

    async def stream_read(self, request: StreamRead, ctx: RequestContext) -> None:
        """A page of committed records; never waits for new ones (R1)."""
        await ctx.write(await self._stream_read(ctx, request))

    async def _stream_read(self, ctx: RequestContext, request: StreamRead) -> bytes:
        proto = ctx.proto
        shard = self._durable_shard(
            ctx, request.tenant_id, request.namespace, request.stream, request.shard
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
        cap = self._config.durable_max_records_per_read
        max_records = min(request.max_records or cap, cap)
        max_bytes = min(request.max_bytes or READ_MAX_BYTES, READ_MAX_BYTES)
        records = []
        if request.end is None or request.end > first:
            # Up to 4 MiB from disk: read on a worker thread, not on the event loop.
            records = await log.aread(
                first, max_records=max_records, max_bytes=max_bytes, end=request.end
            )
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
        answer = StreamRecords(records=page, next_offset=next_offset, request_id=request.request_id)
        if len(records) < _ENCODE_ON_LOOP_RECORDS:
            return proto.message(answer)
        # Encoding megabytes (base64 in JSON) is loop time too: a worker thread does it.
        return await asyncio.to_thread(proto.message, answer)

    async def offset_for_time(self, request: OffsetForTime, ctx: RequestContext) -> None:
        """The first offset appended at or after a time (R2)."""
        shard = self._durable_shard(
            ctx, request.tenant_id, request.namespace, request.stream, request.shard
        )
        if isinstance(shard, bytes):
            await ctx.write(shard)
            return
        assert shard.log is not None
        offset = shard.log.offset_for_time(request.at_micros)
        await ctx.write(
            ctx.proto.message(OffsetValue(offset=offset, request_id=request.request_id))
        )


def _start_position(shard: Shard, request: Subscribe) -> int | SubscribeCursorError:
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


def _replication_refusal(done: asyncio.Future[int]) -> ReplicationRefusedError | None:
    """The replication refusal a failed publish of a replicated shard ended with."""
    if not done.done() or done.cancelled():
        return None
    error = done.exception()
    return error if isinstance(error, ReplicationRefusedError) else None


def _gated(proto: StreamProtocol, refused: tuple[ErrorCode, str | None] | None) -> bytes | None:
    """The error frame for a read the replication gate refuses, or None."""
    if refused is None:
        return None
    code, reason = refused
    text = f"{code.wire}: {reason}" if reason else code.wire
    return proto.error(code, text, detail=ErrorDetail(reason=reason) if reason else None)
