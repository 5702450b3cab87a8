"""Guarded writes: idempotent producers, conditional publishes, atomic commits, state reads.

Every handler admits the request (feature, permission, catalog, shard), hands
a :class:`~felix_broker.streams.engine.PublishRequest` carrying an append guard
(guards.py) to the engine, and answers once the write is durable per fsync
mode (the guard's check runs where the worker assigns offsets):

- ``producer_init`` -> ``producer_init_ok`` with 64 random bits.
- ``publish_idempotent`` and binary frames with flag 0x0100 (which requires
  0x0008): always answered in JSON, in the stream's publish order (PL2):
  ``publish_ok`` with the batch's (or, for a duplicate, the original) first
  offset, ``publish_refused`` with the producer table's reason, or
  ``publish_error``. Sequences count per producer per shard; in-memory
  streams keep producers in memory only. On a Quorum stream of a fleet the
  batch is judged by every replica where it falls in the replicated log
  (replication/apply.py; decision quorum-idempotent-producers) and answered
  once a majority holds it (``quorum_timeout`` when none does in time).
- ``publish_if``: ``publish_ok`` with the first offset, ``publish_refused
  {offset_mismatch: {tail}}`` with nothing written, or ``error``; an empty
  batch or an in-memory stream is ``invalid_request``.
- ``commit``: the event and its entity's state changes as one record of the
  shard ``entity_key`` routes to; ``commit_ok {offset}``, ``publish_refused``
  for a failed ``expected_offset``, or ``error``. Durable streams only.
- ``state_get`` -> ``state_value {value|null, version, as_of}`` from the
  shard's state view (state.py). The view is rebuilt from the log before the
  shard serves anything, so there is no window in which a read is not ready;
  a shard whose log failed answers ``storage`` (retry).
- ``publish_width``: recorded for the QUIC stream it came on (width.py); never
  answered. Keyed batches routed by another width are refused ``stale_width``.

``publish_refused`` goes only to a client that offered FEATURE_IDEMPOTENT_PRODUCER
(the bit by which a client says it decodes it). Any other client gets the refusal
as the error it decodes: ``publish_error`` for an idempotent batch, ``error`` for
``publish_if`` and ``commit``, code ``invalid_request`` (the same request is
refused the same way again), the refusal's reason in ``detail.reason``
(``offset_mismatch``, ``sequence_gap``, ...) and its text in the message.

A shard whose log cannot be opened (the shard is picked first, which opens its
log) answers ``storage`` before anything is written.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from felix_broker.catalog import StreamSpec
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.driver import ReplicationRefusedError
from felix_broker.session.context import RequestContext
from felix_broker.session.dispatch import DispatchTable
from felix_broker.session.protocol import StreamProtocol
from felix_broker.storage import StorageError
from felix_broker.storage.format import CommitMark, StoredChange
from felix_broker.streams.engine import Engine, OverloadedError, PublishRequest, Shard, publisher_of
from felix_broker.streams.guards import (
    AppendGuard,
    AppendRefusedError,
    CommitGuard,
    ConditionalGuard,
    ProducerGuard,
    TailMismatch,
    publish_refused,
)
from felix_broker.streams.producers import Duplicate, Refusal, payload_digest
from felix_broker.streams.service import refusal
from felix_broker.streams.width import StreamWidths
from felix_common.permissions import Action, stream_object
from felix_wire.binary import PublishBatchFrame
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.features import Feature
from felix_wire.flags import Flag
from felix_wire.messages import (
    Commit,
    CommitOk,
    ErrorDetail,
    ProducerInit,
    ProducerInitOk,
    PublishIdempotent,
    PublishIf,
    PublishOk,
    PublishWidth,
    StateChangeDelete,
    StateGet,
    StateValue,
)

__all__ = ["GUARDED_FEATURES", "GUARDED_FLAGS", "GuardedWriteService"]

# Served on any broker (commits and publish_if then refuse in-memory streams).
GUARDED_FEATURES = int(
    Feature.FEATURE_IDEMPOTENT_PRODUCER
    | Feature.FEATURE_SEQUENCE_REUSED
    | Feature.FEATURE_PUBLISH_CONDITIONAL
    | Feature.FEATURE_ATOMIC_COMMIT
    | Feature.FEATURE_PUBLISH_WIDTH
)
# The frame layout this service reads: binary idempotent publishes.
GUARDED_FLAGS = int(Flag.BINARY_PUBLISH_IDEMPOTENT)

_MAX_STATE_KEY_BYTES = 0xFFFF

HoldBytes = Callable[[RequestContext, int], Awaitable[Callable[[], None]]]


@dataclass(frozen=True, slots=True)
class _Refused:
    """A guarded write's refusal: the frame to send and its outcome label for metrics."""

    outcome: str
    frame: bytes


def refused_answer(
    proto: StreamProtocol, request_id: int, admission: Refusal | TailMismatch, *, batch: bool
) -> bytes:
    """The answer to a refused guarded write: ``publish_refused`` to a client that
    offered FEATURE_IDEMPOTENT_PRODUCER, else ``publish_error`` (an idempotent
    `batch`) or ``error`` with code invalid_request and the reason in the detail."""
    refused = publish_refused(request_id, admission)
    if proto.negotiated(Feature.FEATURE_IDEMPOTENT_PRODUCER):
        return proto.message(refused)
    reason = admission.reason.value if isinstance(admission, Refusal) else "offset_mismatch"
    detail = ErrorDetail(reason=reason)
    error = (ErrorCode.INVALID_REQUEST, refused.message)
    if batch:
        return proto.publish_answer(request_id, binary=False, error=error, detail=detail)
    return proto.error(*error, detail=detail)


class GuardedWriteService:
    """Idempotent, conditional and atomic writes over the engine's publish worker."""

    def __init__(
        self,
        *,
        engine: Engine,
        metrics: BrokerMetrics,
        widths: StreamWidths,
        hold_bytes: HoldBytes,
    ) -> None:
        self._engine = engine
        self._metrics = metrics
        self.widths = widths
        # The publish byte budgets of the stream service: a guarded write holds its
        # payload bytes until the worker has taken it, like any publish.
        self._hold_bytes = hold_bytes

    @property
    def features(self) -> int:
        return GUARDED_FEATURES

    def register(self, table: DispatchTable) -> None:
        table.register(ProducerInit, self.producer_init)
        table.register(PublishIdempotent, self.publish_idempotent)
        table.register(PublishIf, self.publish_if)
        table.register(Commit, self.commit)
        table.register(StateGet, self.state_get)
        table.register(PublishWidth, self.publish_width)

    # -- shared admission --------------------------------------------------------------

    def _admit(
        self,
        ctx: RequestContext,
        tenant_id: str,
        namespace: str,
        stream: str,
        action: Action,
    ) -> StreamSpec | tuple[ErrorCode, str]:
        denied = refusal(ctx, tenant_id, action, stream_object(tenant_id, namespace, stream))
        if denied is not None:
            return denied
        spec = self._engine.stream(tenant_id, namespace, stream)
        if spec is None:
            return (
                ErrorCode.NOT_FOUND,
                f"stream not found: tenant={tenant_id} namespace={namespace} stream={stream}",
            )
        return spec

    def _shard(self, spec: StreamSpec, key: bytes | None) -> Shard | tuple[ErrorCode, str]:
        """The shard `key` routes to; picking it opens its log, which can fail (a
        full disk, a folder that cannot be created): that is a `storage` error."""
        try:
            return self._engine.shard_for(spec, key)
        except StorageError as exc:
            return ErrorCode.STORAGE, f"the shard's log could not be opened: {exc}"

    def _stale_width(
        self, ctx: RequestContext, spec: StreamSpec, key: bytes | None
    ) -> tuple[ErrorCode, str] | None:
        announced = self.widths.stale(
            ctx.io,
            spec.tenant_id,
            spec.namespace,
            spec.name,
            keyed=key is not None,
            actual=spec.shards,
        )
        if announced is None:
            return None
        return (
            ErrorCode.STALE_WIDTH,
            f"stale width: the batch was routed by {announced} shard(s); "
            f"stream {spec.name} has {spec.shards}",
        )

    async def _queue(
        self, ctx: RequestContext, request: PublishRequest
    ) -> asyncio.Future[int] | tuple[ErrorCode, str, ErrorDetail]:
        release = await self._hold_bytes(ctx, request.size)
        try:
            done = await self._engine.publish(request, acked=True)
        except OverloadedError as exc:
            release()
            detail = ErrorDetail(reason="publish_queue_full", retry_after_ms=exc.retry_after_ms)
            return ErrorCode.OVERLOADED, str(exc), detail
        except BaseException:
            release()
            raise
        done.add_done_callback(lambda _f: release())
        return done

    # -- idempotent producers ----------------------------------------------------------

    async def producer_init(self, request: ProducerInit, ctx: RequestContext) -> None:
        producer_id = secrets.randbits(64)
        await ctx.write(
            ctx.proto.message(
                ProducerInitOk(request_id=request.request_id, producer_id=producer_id)
            )
        )

    async def publish_idempotent(self, request: PublishIdempotent, ctx: RequestContext) -> None:
        await self._idempotent(
            ctx,
            tenant_id=request.tenant_id,
            namespace=request.namespace,
            stream=request.stream,
            payloads=list(request.payloads),
            key=request.key,
            request_id=request.request_id,
            producer_id=request.producer_id,
            sequence=request.sequence,
        )

    async def publish_frame(self, frame: PublishBatchFrame, ctx: RequestContext) -> None:
        """A binary publish frame with flag 0x0100 (the session checked it carries 0x0008)."""
        assert frame.request_id is not None
        assert frame.producer_id is not None and frame.sequence is not None
        await self._idempotent(
            ctx,
            tenant_id=frame.tenant_id,
            namespace=frame.namespace,
            stream=frame.stream,
            payloads=frame.payloads,
            key=frame.key,
            request_id=frame.request_id,
            producer_id=frame.producer_id,
            sequence=frame.sequence,
        )

    async def _idempotent(
        self,
        ctx: RequestContext,
        *,
        tenant_id: str,
        namespace: str,
        stream: str,
        payloads: list[bytes],
        key: bytes | None,
        request_id: int,
        producer_id: int,
        sequence: int,
    ) -> None:
        proto = ctx.proto
        # A publish-only unidirectional stream is never answered (T7): its idempotent
        # frames are still deduplicated, and their outcome is known only by resending.
        answered = not proto.publish_only

        async def refuse(code: ErrorCode, text: str, detail: ErrorDetail | None = None) -> None:
            if answered:
                answer = proto.publish_answer(
                    request_id, binary=False, error=(code, text), detail=detail
                )
                await ctx.answer_in_order(None, lambda _r: answer)

        spec = self._admit(ctx, tenant_id, namespace, stream, Action.STREAM_PUBLISH)
        if not isinstance(spec, StreamSpec):
            await refuse(*spec)
            return
        if not payloads:
            await refuse(ErrorCode.INVALID_REQUEST, "a publish batch needs at least one payload")
            return
        stale = self._stale_width(ctx, spec, key)
        if stale is not None:
            await refuse(*stale)
            return
        shard = self._shard(spec, key)
        if isinstance(shard, tuple):
            await refuse(*shard)
            return
        guard = ProducerGuard(
            shard.marks,
            producer_id=producer_id,
            sequence=sequence,
            digest=payload_digest(payloads),
            reused_refusal=ctx.negotiated(Feature.FEATURE_SEQUENCE_REUSED),
        )
        publish = PublishRequest(shard, payloads, publisher_of(ctx.principal.subject), guard=guard)
        queued = await self._queue(ctx, publish)
        if isinstance(queued, tuple):
            await refuse(*queued)
            return
        if not answered:
            return
        durable = shard.durable
        metrics = self._metrics

        def answer(offset: int | None) -> bytes:
            # Always answered after the write (A5), in JSON (A4).
            failure = queued.exception() if queued.done() and not queued.cancelled() else None
            if isinstance(failure, ReplicationRefusedError):
                # A Quorum stream's batch: quorum_timeout / leadership_lost (outcome
                # unknown: resend it, the producer table dedups), not_leader, ...
                why = ErrorDetail(reason=failure.reason) if failure.reason else None
                return proto.publish_answer(
                    request_id,
                    binary=False,
                    error=(failure.code, str(failure)),
                    retry=failure.retry,
                    detail=why,
                )
            if isinstance(failure, AppendRefusedError):
                admission = failure.admission
                if isinstance(admission, Refusal):
                    metrics.producer_refusals.labels(reason=admission.reason.value).inc()
                return refused_answer(proto, request_id, admission, batch=True)
            if offset is None:
                return proto.publish_answer(
                    request_id,
                    binary=False,
                    error=(ErrorCode.STORAGE, "the write could not be confirmed"),
                )
            if isinstance(guard.admission, Duplicate):
                metrics.producer_duplicates.inc()
            return proto.message(
                PublishOk(request_id=request_id, offset=offset if durable else None)
            )

        await ctx.answer_in_order(queued, answer)

    # -- conditional publish -----------------------------------------------------------

    async def publish_if(self, request: PublishIf, ctx: RequestContext) -> None:
        proto = ctx.proto
        spec = self._admit(
            ctx, request.tenant_id, request.namespace, request.stream, Action.STREAM_PUBLISH
        )
        if not isinstance(spec, StreamSpec):
            await ctx.write(proto.error(*spec))
            return
        if not request.payloads:
            await ctx.write(proto.error(ErrorCode.INVALID_REQUEST, "publish_if needs a payload"))
            return
        if not spec.durable:
            await ctx.write(
                proto.error(
                    ErrorCode.INVALID_REQUEST,
                    f"stream {spec.name} is in memory: it has no log to compare offsets with",
                )
            )
            return
        stale = self._stale_width(ctx, spec, request.key)
        if stale is not None:
            await ctx.write(proto.error(*stale))
            return
        shard = self._shard(spec, request.key)
        if isinstance(shard, tuple):
            await ctx.write(proto.error(*shard))
            return
        guard = ConditionalGuard(request.expected_offset)
        publish = PublishRequest(
            shard,
            list(request.payloads),
            publisher_of(ctx.principal.subject),
            guard=guard,
        )
        settled = await self._settle(publish, request.request_id, ctx, "publish_if")
        if isinstance(settled, int):
            await ctx.write(proto.message(PublishOk(request_id=request.request_id, offset=settled)))
            return
        await ctx.write(settled.frame)

    async def _settle(
        self, publish: PublishRequest, request_id: int, ctx: RequestContext, kind: str
    ) -> int | _Refused:
        """The offset a guarded write landed at, or the frame that refuses it."""
        proto = ctx.proto
        queued = await self._queue(ctx, publish)
        if isinstance(queued, tuple):
            code, text, detail = queued
            return _Refused(code.wire, proto.error(code, text, detail=detail))
        try:
            return await queued
        except AppendRefusedError as exc:
            if isinstance(exc.admission, TailMismatch):
                self._metrics.conditional_refusals.labels(type=kind).inc()
            return _Refused(
                "offset_mismatch", refused_answer(proto, request_id, exc.admission, batch=False)
            )
        except ReplicationRefusedError as exc:
            # A Quorum stream's write: quorum_timeout / leadership_lost (outcome unknown),
            # not_ready, fenced, not_leader (nothing written), as for a plain publish.
            why = ErrorDetail(reason=exc.reason) if exc.reason else None
            return _Refused(
                exc.code.wire, proto.error(exc.code, str(exc), retry=exc.retry, detail=why)
            )
        except (StorageError, ValueError) as exc:
            # Appended or not: the worker could not confirm it (outcome unknown).
            code = ErrorCode.STORAGE
            return _Refused(
                code.wire, proto.error(code, f"the write could not be confirmed: {exc}")
            )

    # -- atomic commits ----------------------------------------------------------------

    async def commit(self, request: Commit, ctx: RequestContext) -> None:
        proto = ctx.proto
        outcome = await self._commit(request, ctx)
        if isinstance(outcome, int):
            self._metrics.commits.labels(outcome="ok").inc()
            await ctx.write(proto.message(CommitOk(request_id=request.request_id, offset=outcome)))
            return
        self._metrics.commits.labels(outcome=outcome.outcome).inc()
        await ctx.write(outcome.frame)

    async def _commit(self, request: Commit, ctx: RequestContext) -> int | _Refused:
        proto = ctx.proto

        def fail(code: ErrorCode, text: str) -> _Refused:
            return _Refused(code.wire, proto.error(code, text))

        spec = self._admit(
            ctx, request.tenant_id, request.namespace, request.stream, Action.STREAM_PUBLISH
        )
        if not isinstance(spec, StreamSpec):
            return fail(*spec)
        if not spec.durable:
            return fail(
                ErrorCode.INVALID_REQUEST,
                f"stream {spec.name} is in memory: commits need a durable stream",
            )
        changes: list[StoredChange] = []
        for change in request.changes:
            if len(change.key.encode("utf-8")) > _MAX_STATE_KEY_BYTES:
                return fail(ErrorCode.INVALID_REQUEST, "a state key is at most 65535 bytes")
            value = None if isinstance(change, StateChangeDelete) else change.value
            changes.append(StoredChange(change.key, value))
        shard = self._shard(spec, request.entity_key)
        if isinstance(shard, tuple):
            return fail(*shard)
        guard: AppendGuard = CommitGuard(
            shard.marks,
            CommitMark(request.entity_key, tuple(changes)),
            expected_offset=request.expected_offset,
        )
        publish = PublishRequest(
            shard, [request.event], publisher_of(ctx.principal.subject), guard=guard
        )
        return await self._settle(publish, request.request_id, ctx, "commit")

    async def state_get(self, request: StateGet, ctx: RequestContext) -> None:
        proto = ctx.proto
        spec = self._admit(
            ctx, request.tenant_id, request.namespace, request.stream, Action.STREAM_SUBSCRIBE
        )
        if not isinstance(spec, StreamSpec):
            await ctx.write(proto.error(*spec))
            return
        if not spec.durable:
            await ctx.write(
                proto.error(
                    ErrorCode.INVALID_REQUEST,
                    f"stream {spec.name} is in memory: it has no commits",
                )
            )
            return
        shard = self._shard(spec, request.entity_key)
        if isinstance(shard, tuple):
            await ctx.write(proto.error(*shard, retry=RetryClass.RETRY))  # a read
            return
        log = shard.log
        assert log is not None
        if log.failed:
            await ctx.write(
                proto.error(
                    ErrorCode.STORAGE,
                    "the shard's log failed; its state is not served until it reopens",
                    retry=RetryClass.RETRY,
                )
            )
            return
        shard.marks.follow(log.start_offset)
        read = shard.marks.state.get(request.entity_key, request.key)
        await ctx.write(
            proto.message(
                StateValue(
                    value=read.value,
                    version=read.version,
                    as_of=read.as_of,
                    request_id=request.request_id,
                )
            )
        )

    # -- publish width -----------------------------------------------------------------

    async def publish_width(self, request: PublishWidth, ctx: RequestContext) -> None:
        """Never answered (decision publish-width); applies to this QUIC stream only."""
        self.widths.announce(
            ctx.io, request.tenant_id, request.namespace, request.stream, request.shards
        )
