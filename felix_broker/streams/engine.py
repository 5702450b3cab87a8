"""Streams, shards, publish queues and subscriber queues: the broker's data path.

No transport here: the engine takes publish requests and hands encoded event
frames to subscriber queues; the server's adapters move bytes.

Publishing. Each tenant has one bounded publish queue (`pub_queue_depth`
batches) drained by one worker task. A full queue refuses: an unacked publish at
once (shed and counted), an acked one after waiting up to
`publish_queue_wait_timeout_ms`; nothing is queued either way (`Overloaded`).
The worker appends every batch waiting for it to its shard, resolves each
request's future with the batch's base offset, then flushes the shards it
touched: disk (later) and delivery order are append order.

Delivery. A flush cuts the appended records into event batches of at most
`event_batch_max_events` events and `event_batch_max_bytes` payload bytes (a new
batch also starts where the publisher changes, for variants that carry it) and
encodes each batch ONCE per delivery variant present among the shard's
subscribers; every subscriber of a variant gets the same bytes. Batches grow
under load because the worker flushes once per pass over what is queued; a
pass stops taking more once `event_batch_max_delay_us` has gone by since its
first append, so no record waits longer than that (plus one append) to be
batched, however deep the queue (0: one publish batch per pass).

Subscribers. Each has a bounded queue of frames (`subscriber_queue_capacity`,
clamped `queue_capacity` when the client asked). At the bound, `drop_new`
(default) drops the new frame, `drop_old` drops the oldest queued frame, and
`block` queues the frame all the same and makes the tenant's worker wait for
room before its next pass (slowing that tenant's publishers; a blocked queue
holds at most its capacity plus one pass's frames, and loses nothing). Drops
are counted per subscriber and in the metrics. A slow subscriber never slows
the publisher or other subscribers under the drop policies.

Durable streams append to their shard's log (felix_broker.storage). The worker
waits for durability per fsync mode before it fans out and acknowledges, so disk
order is delivery order, and everything queued while it waits shares the next
fsync (group commit). Their events carry offsets, append times (one per publish
batch) and the stored publisher, as each subscriber negotiated.

In-memory streams keep no history: offsets are counted internally (so a resume
point can be checked) but never sent, `earliest` is the tail, and events carry
no offsets or times, as the protocol describes for in-memory streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from felix_broker.catalog import Catalog, StreamSpec
from felix_broker.clock import wall_us
from felix_broker.config import BrokerConfig, SubscriberQueuePolicy
from felix_broker.metrics import BrokerMetrics
from felix_broker.storage import Log, LogStore, Retention, ShardKey, StorageError
from felix_broker.storage.format import BatchExtension
from felix_broker.streams.guards import AppendGuard, AppendRefusedError, ShardMarks
from felix_broker.streams.producers import Append, Duplicate
from felix_wire.binary import (
    EventBatchLegacyFrame,
    EventBatchSharedFrame,
    encode_event_batch_legacy_frame,
    encode_event_batch_shared_frame,
)
from felix_wire.codec import encode_frame
from felix_wire.errors import ErrorCode
from felix_wire.features import Capabilities
from felix_wire.flags import Flag
from felix_wire.messages import EventBatch
from felix_wire.routing import shard_for_key

__all__ = [
    "Chunk",
    "DeliveryKind",
    "Engine",
    "OverloadedError",
    "PublishRequest",
    "Shard",
    "Subscriber",
    "Variant",
    "encode_events",
    "variant_for",
]

_log = logging.getLogger(__name__)

# The most that the publisher field can carry (u8 length).
MAX_PUBLISHER_BYTES = 255


class OverloadedError(Exception):
    """The tenant's publish queue had no room; nothing was queued."""

    def __init__(self, tenant_id: str, retry_after_ms: int) -> None:
        super().__init__(f"publish queue full; retry in {retry_after_ms} ms")
        self.tenant_id = tenant_id
        self.retry_after_ms = retry_after_ms


class DeliveryKind(enum.Enum):
    SHARED = "shared"  # flag 0x0004: encoded once, shared by every subscriber of the variant
    LEGACY = "legacy"  # flag 0x0002: carries the subscription id, so encoded per subscriber
    JSON = "json"  # event_batch messages, for clients that offered no binary event layout


@dataclass(frozen=True, slots=True)
class Variant:
    """How one subscriber's events are laid out: every subscriber of a variant
    receives the same bytes (but for LEGACY, which names the subscription)."""

    kind: DeliveryKind
    publisher: bool  # EVENT_BATCH_PUBLISHER offered (binary layouts only)
    offsets: bool = False  # durable stream and EVENT_BATCH_OFFSETS offered
    timestamps: bool = False  # durable stream and EVENT_BATCH_TIMESTAMPS offered (binary only)


def variant_for(client: Capabilities, *, durable: bool = False) -> Variant:
    """The best layout the client offered. Offsets and times exist only on durable
    streams; an in-memory stream's events carry neither."""
    if client.has(Flag.BINARY_EVENT_BATCH_SHARED):
        kind = DeliveryKind.SHARED
    elif client.has(Flag.BINARY_EVENT_BATCH):
        kind = DeliveryKind.LEGACY
    else:
        kind = DeliveryKind.JSON
    binary = kind is not DeliveryKind.JSON
    publisher = binary and client.has(Flag.EVENT_BATCH_PUBLISHER)
    offsets = durable and (not binary or client.has(Flag.EVENT_BATCH_OFFSETS))
    timestamps = durable and binary and client.has(Flag.EVENT_BATCH_TIMESTAMPS)
    return Variant(kind, publisher, offsets, timestamps)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Records cut for one event batch: contiguous offsets, one publisher."""

    payloads: list[bytes]
    publisher: str | None
    base_offset: int
    timestamps: list[int] | None


def encode_events(
    variant: Variant, spec: StreamSpec, chunk: Chunk, subscription_id: int = 0
) -> bytes:
    """One event batch frame laid out for `variant`."""
    base = chunk.base_offset if variant.offsets else None
    publisher = chunk.publisher if variant.publisher else None
    timestamps = chunk.timestamps if variant.timestamps else None
    if variant.kind is DeliveryKind.SHARED:
        return encode_event_batch_shared_frame(
            EventBatchSharedFrame(
                base_offset=base,
                publisher=publisher,
                timestamps=timestamps,
                payloads=chunk.payloads,
            )
        )
    if variant.kind is DeliveryKind.LEGACY:
        return encode_event_batch_legacy_frame(
            EventBatchLegacyFrame(
                subscription_id=subscription_id,
                base_offset=base,
                publisher=publisher,
                timestamps=timestamps,
                payloads=chunk.payloads,
            )
        )
    return encode_frame(
        EventBatch(
            tenant_id=spec.tenant_id,
            namespace=spec.namespace,
            stream=spec.name,
            payloads=chunk.payloads,
            base_offset=base,
        )
    )


@dataclass(slots=True)
class PublishRequest:
    """One publish batch on its way to a shard."""

    shard: Shard
    payloads: list[bytes]
    publisher: str | None
    done: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    guard: AppendGuard | None = None
    """Checked where the offsets are assigned (idempotent, conditional, commit); a
    refusal resolves ``done`` with :class:`AppendRefusedError`, nothing appended."""

    @property
    def size(self) -> int:
        return sum(map(len, self.payloads))


class QueuedBytes:
    """Encoded bytes queued for every subscriber of a broker, against one bound."""

    def __init__(self, limit: int, metrics: BrokerMetrics) -> None:
        self.limit = limit
        self.used = 0
        self._metrics = metrics
        self._room = asyncio.Event()
        self._room.set()

    def fits(self, size: int) -> bool:
        return self.used + size <= self.limit

    def take(self, size: int) -> None:
        self.used += size
        self._metrics.subscriber_queued_bytes.inc(size)
        if self.used >= self.limit:
            self._room.clear()

    def give(self, size: int) -> None:
        self.used -= size
        self._metrics.subscriber_queued_bytes.dec(size)
        if self.used < self.limit:
            self._room.set()

    async def wait(self) -> None:
        await self._room.wait()


class Subscriber:
    """One subscription's bounded queue of encoded frames.

    Bounded in frames (`capacity`), in bytes (`max_bytes`; an empty queue still
    takes one frame, however large) and by the broker-wide `budget`. At a bound the
    policy applies: `drop_new` drops the frame offered, `drop_old` drops the oldest
    queued ones until it fits (both mark the subscriber lagged); `block` queues the
    frame and reports it full, and the publishing tenant waits until there is room.
    """

    def __init__(
        self,
        subscription_id: int,
        shard: Shard,
        variant: Variant,
        capacity: int,
        policy: SubscriberQueuePolicy,
        metrics: BrokerMetrics,
        *,
        max_bytes: int,
        budget: QueuedBytes,
    ) -> None:
        self.subscription_id = subscription_id
        self.shard = shard
        self.variant = variant
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self._budget = budget
        self.policy = policy
        self.dropped = 0
        self.delivered = 0
        self.closed = False
        self.created = time.monotonic()  # for the subscription's age (inspection)
        # One past the last offset taken from the queue (durable streams; None until
        # the first live batch is taken).
        self.position: int | None = None
        self._metrics = metrics
        # (frame, records, base offset of its first record); offsets exist on durable
        # streams only, where the writer uses them to join replay and live delivery.
        self._frames: deque[tuple[bytes, int, int]] = deque()
        self.lagged = False  # a frame was dropped (drop policies); durable streams end
        # Its shard moved away (or this broker stopped serving it): the frames queued
        # are delivered, then the stream ends with shard_moved naming (node_id, addr,
        # generation) for a client that offered FEATURE_SHARD_MOVED (`end_moved`).
        self.moved: tuple[str | None, str | None, int] | None = None
        self.shard_moved_capable = False
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def depth(self) -> int:
        return len(self._frames)

    def _full(self, size: int) -> bool:
        frames = self._frames
        return (
            len(frames) >= self.capacity
            or (bool(frames) and self.queued_bytes + size > self.max_bytes)
            or not self._budget.fits(size)
        )

    @property
    def ending(self) -> bool:
        """Closed, or ending after what is queued (its shard moved)."""
        return self.closed or self.moved is not None

    def end_moved(self, node_id: str | None, addr: str | None, generation: int) -> None:
        """End after the frames already queued: nothing more is offered to it."""
        if self.closed or self.moved is not None:
            return
        self.moved = (node_id, addr, generation)
        self._ready.set()
        self._room.set()

    def offer(self, frame: bytes, records: int, base: int = 0) -> bool:
        """Queue a frame; False when the queue is at a bound under policy `block`.

        Under `block` the frame is queued all the same (nothing is lost) and the
        caller must `wait_for_room()` before it offers more than the rest of its
        current flush: the queue then holds at most its bounds plus one flush's
        frames. The drop policies never exceed the bounds (see the class docs).
        """
        if self.closed or self.moved is not None:
            return True
        size = len(frame)
        if self._full(size):
            if self.policy is SubscriberQueuePolicy.BLOCK:
                self._room.clear()
                self._queue(frame, records, base)
                return False
            if self.policy is SubscriberQueuePolicy.DROP_OLD:
                while self._frames and self._full(size):
                    old, old_records, _ = self._frames.popleft()
                    self._release(len(old), 1)
                    self._drop(old_records)
                if self._full(size):
                    self._drop(records)  # the broker-wide bound: nothing of ours to drop
                    return True
            else:
                self._drop(records)
                return True
        self._queue(frame, records, base)
        return True

    def _queue(self, frame: bytes, records: int, base: int) -> None:
        self._frames.append((frame, records, base))
        self.queued_bytes += len(frame)
        self._budget.take(len(frame))
        self._metrics.subscriber_queue_depth.inc()
        self._ready.set()

    def _release(self, size: int, frames: int) -> None:
        self.queued_bytes -= size
        self._budget.give(size)
        self._metrics.subscriber_queue_depth.dec(frames)

    async def wait_for_room(self) -> None:
        while not self.ending and (
            len(self._frames) >= self.capacity
            or (self._frames and self.queued_bytes >= self.max_bytes)
        ):
            self._room.clear()
            await self._room.wait()
        while not self.ending and self._budget.used >= self._budget.limit:
            await self._budget.wait()

    def _drop(self, records: int) -> None:
        self.lagged = True
        self.dropped += records
        self._metrics.subscriber_drops.inc(records)

    async def next_frames(self) -> list[tuple[bytes, int, int]]:
        """Every queued (frame, records, base) (waiting for at least one); [] once closed."""
        while not self._frames:
            if self.closed or self.moved is not None:
                return []
            self._ready.clear()
            await self._ready.wait()
        frames = list(self._frames)
        records = sum(r for _, r, _ in frames)
        _, last_records, last_base = frames[-1]
        self.position = last_base + last_records
        self._release(self.queued_bytes, len(frames))
        self._frames.clear()
        self.delivered += records
        self._metrics.deliveries.inc(records)
        self._room.set()
        return frames

    def first_queued_base(self) -> int | None:
        return self._frames[0][2] if self._frames else None

    async def wait_queued(self) -> None:
        """Until a frame is queued or the subscriber closes."""
        while not self._frames and not self.closed:
            self._ready.clear()
            await self._ready.wait()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._release(self.queued_bytes, len(self._frames))
        self._frames.clear()
        self._ready.set()
        self._room.set()


class Shard:
    """One shard of a stream: its log (durable streams) or offset counter, its live
    subscribers and the records appended since the last flush."""

    def __init__(
        self,
        spec: StreamSpec,
        index: int,
        config: BrokerConfig,
        log: Log | None = None,
        marks: ShardMarks | None = None,
    ) -> None:
        self.spec = spec
        self.index = index
        self.log = log
        self.next_offset = log.next_offset if log is not None else 0
        # Idempotent producers and commit state, replayed from the log's marks
        # before the shard serves anything (in memory only for in-memory streams);
        # `Engine.recover` passes them in, rebuilt off the event loop.
        self.marks = marks if marks is not None else ShardMarks.rebuild(log)
        self.subscribers: list[Subscriber] = []
        # Called on each flush, once appended records are durable (per fsync mode) and
        # so readable: consumer groups wake their long polls here.
        self.listeners: list[Callable[[], None]] = []
        self._pending: list[Chunk] = []
        # Durable batches of this publish pass not handed to the OS yet
        # (`append(defer=True)`, `write_deferred`): one write per pass, not per publish.
        self._unwritten: list[tuple[Sequence[bytes], int, str | None]] = []
        self._max_events = config.event_batch_max_events
        self._max_bytes = config.event_batch_max_bytes
        # Whether a durable stream stores each batch's publisher: record_publishers on a
        # single broker; in a fleet, once publisher_principal is finalized (the engine
        # sets it on every shard: `Engine.set_record_publishers`).
        self.record_publishers = config.record_publishers

    @property
    def durable(self) -> bool:
        return self.log is not None

    @property
    def start_offset(self) -> int:
        """The oldest offset retained (0 for in-memory streams, which keep none)."""
        return self.log.start_offset if self.log is not None else 0

    def append(
        self,
        payloads: list[bytes],
        publisher: str | None,
        timestamp_us: int,
        extension: BatchExtension | None = None,
        *,
        defer: bool = False,
    ) -> int:
        """Append one publish batch; returns its base offset. A durable stream stores the
        publisher only when record_publishers is on (and reports what it stored); an
        in-memory stream reports the publishing connection's principal.

        With `defer` (the publish pass) a durable batch without an extension takes its
        offsets now but reaches the OS in `write_deferred`, together with the pass's
        other batches of this shard; the caller calls it, with no await in between, before
        anything waits on, reads or delivers those offsets. A payload the log would
        refuse is refused here (ValueError), so one bad publish fails alone."""
        if self.log is not None:
            stored = publisher if self.record_publishers else None
            if defer and extension is None:
                self.log.check_payloads(payloads)
                base = self.next_offset
                self._unwritten.append((payloads, timestamp_us, stored))
                self.next_offset = base + len(payloads)
                self._pending.append(Chunk(payloads, stored, base, [timestamp_us] * len(payloads)))
                return base
            self.write_deferred()  # disk order is offset order
            base = self.log.append(
                payloads, timestamp_us=timestamp_us, publisher=stored, extension=extension
            )
            self.next_offset = base + len(payloads)
            # Kept even with no subscriber yet: one may register before the flush, and
            # its writer then skips or keeps these by offset.
            stamps = [timestamp_us] * len(payloads)
            self._pending.append(Chunk(payloads, stored, base, stamps))
            return base
        base = self.next_offset
        self.next_offset += len(payloads)
        self._pending.append(Chunk(payloads, publisher, base, None))
        return base

    def write_deferred(self) -> None:
        """Hand the deferred batches to the OS, in one write when they fit the active
        segment (`Log.append_many`). On failure (the log fails: StorageError) their
        records are forgotten: never delivered, and their offsets not taken."""
        unwritten = self._unwritten
        if not unwritten:
            return
        assert self.log is not None
        self._unwritten = []
        first = self.log.next_offset
        try:
            bases = self.log.append_many(unwritten)
        except BaseException:
            self.next_offset = first
            self._pending = [c for c in self._pending if c.base_offset < first]
            raise
        if bases[0] != first or self.log.next_offset != self.next_offset:
            raise StorageError(f"log of {self.spec.name} shard {self.index} was appended meanwhile")

    def cut(self, chunks: list[Chunk], split_by_publisher: bool) -> list[Chunk]:
        """Records cut into event batches of at most max events and max bytes; a new
        batch starts where the publisher changes when the variant carries it.

        A published batch that is already deliverable is never re-chunked: alone,
        it goes out as it came; with others, it joins the open batch whole when
        it fits, else starts the next one. Only a batch over a bound is cut."""
        max_events, max_bytes = self._max_events, self._max_bytes
        if len(chunks) == 1:
            only = chunks[0]
            if len(only.payloads) <= max_events and sum(map(len, only.payloads)) <= max_bytes:
                if split_by_publisher or only.publisher is None:
                    return [only]
                return [Chunk(only.payloads, None, only.base_offset, only.timestamps)]
        out: list[Chunk] = []
        payloads: list[bytes] = []
        stamps: list[int] | None = None
        size = 0
        owner: str | None = None
        base = 0

        def close() -> None:
            out.append(Chunk(payloads, owner, base, stamps))

        for appended in chunks:
            publisher = appended.publisher if split_by_publisher else None
            if payloads and publisher != owner:
                close()
                payloads, size = [], 0
            owner = publisher
            count, total = len(appended.payloads), sum(map(len, appended.payloads))
            if count <= max_events and total <= max_bytes:
                if payloads and (len(payloads) + count > max_events or size + total > max_bytes):
                    close()
                    payloads, size = [], 0
                if not payloads:
                    base = appended.base_offset
                    stamps = [] if appended.timestamps is not None else None
                payloads.extend(appended.payloads)
                if stamps is not None and appended.timestamps is not None:
                    stamps.extend(appended.timestamps)
                size += total
                continue
            for i, payload in enumerate(appended.payloads):
                full = len(payloads) >= max_events or size + len(payload) > max_bytes
                if payloads and full:
                    close()
                    payloads, size = [], 0
                if not payloads:
                    base = appended.base_offset + i
                    stamps = [] if appended.timestamps is not None else None
                payloads.append(payload)
                if stamps is not None and appended.timestamps is not None:
                    stamps.append(appended.timestamps[i])
                size += len(payload)
        if payloads:
            close()
        return out

    def flush(self) -> list[Subscriber]:
        """Encode pending records once per variant and queue them; returns the
        subscribers at or past their capacity under the `block` policy (their
        frames are queued; the caller waits for their room before the next pass)."""
        for listener in self.listeners:
            listener()
        if not self._pending:
            return []
        subscribers = [s for s in self.subscribers if not s.closed]
        if not subscribers:
            self._pending = []
            return []
        blocked: list[Subscriber] = []
        if subscribers:
            by_variant: dict[Variant, list[Subscriber]] = {}
            for sub in subscribers:
                by_variant.setdefault(sub.variant, []).append(sub)
            cuts: dict[bool, list[Chunk]] = {}
            for variant, subs in by_variant.items():
                if variant.publisher not in cuts:
                    cuts[variant.publisher] = self.cut(self._pending, variant.publisher)
                for chunk in cuts[variant.publisher]:
                    count = len(chunk.payloads)
                    if variant.kind is DeliveryKind.LEGACY:
                        for sub in subs:
                            frame = encode_events(variant, self.spec, chunk, sub.subscription_id)
                            if not sub.offer(frame, count, chunk.base_offset):
                                blocked.append(sub)
                        continue
                    frame = encode_events(variant, self.spec, chunk)
                    for sub in subs:
                        if not sub.offer(frame, count, chunk.base_offset):
                            blocked.append(sub)
        self._pending = []
        return list(dict.fromkeys(blocked))


class _TenantPipeline:
    """One tenant's bounded publish queue and the worker that drains it."""

    def __init__(
        self, tenant_id: str, depth: int, max_delay_us: int, metrics: BrokerMetrics
    ) -> None:
        self.tenant_id = tenant_id
        self.queue: asyncio.Queue[PublishRequest] = asyncio.Queue(maxsize=depth)
        self._max_delay_ns = max_delay_us * 1000
        self._metrics = metrics
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"publish-{tenant_id}")

    async def _run(self) -> None:
        queue = self.queue
        while True:
            batch = [await queue.get()]
            # A pass appends what is queued until event_batch_max_delay_us has gone by
            # since its first append, then flushes: no record waits longer than that
            # (plus one append) to be batched, however deep the queue.
            started = time.monotonic_ns()
            # One time per publish batch, the leader's clock at append (S13).
            now = now_micros()
            touched: dict[int, Shard] = {}
            written: list[tuple[PublishRequest, int]] = []
            appended_records = appended_bytes = 0
            at = 0
            while at < len(batch):
                request = batch[at]
                at += 1
                if (
                    at == len(batch)
                    and not queue.empty()
                    and time.monotonic_ns() - started < self._max_delay_ns
                ):
                    batch.append(queue.get_nowait())
                shard = request.shard
                guard = request.guard
                extension = None
                if guard is not None:
                    # Checked here, in the same synchronous step as the append:
                    # nothing else can take the offset in between.
                    admission = guard.admit(shard.next_offset, shard.start_offset)
                    if isinstance(admission, Duplicate):
                        # Answered like a write, once what it duplicates is durable.
                        touched[id(shard)] = shard
                        written.append((request, admission.offset))
                        continue
                    if not isinstance(admission, Append):
                        if not request.done.done():
                            request.done.set_exception(AppendRefusedError(admission))
                        continue
                    extension = guard.extension(shard.durable)
                try:
                    base = shard.append(
                        request.payloads, request.publisher, now, extension, defer=True
                    )
                except (StorageError, ValueError) as exc:
                    _log.error(
                        "append to %s shard %d failed: %s", shard.spec.name, shard.index, exc
                    )
                    if not request.done.done():
                        request.done.set_exception(exc)
                    continue
                if guard is not None:
                    guard.appended(base)
                touched[id(shard)] = shard
                written.append((request, base))
                appended_records += len(request.payloads)
                appended_bytes += request.size
            # Counted once per pass, not per publish (each inc takes a lock).
            if appended_records:
                self._metrics.publishes.inc(appended_records)
                self._metrics.published_bytes.inc(appended_bytes)
            # Append -> durable (per fsync mode) -> fan out -> acknowledge: disk order is
            # delivery order. Waiting here holds this tenant's next pass, so everything
            # queued meanwhile shares the next fsync (group commit).
            failed: set[int] = set()
            for key, shard in touched.items():
                # The pass's batches of a shard in one write (no await since they
                # were appended, so nothing has read or delivered them yet).
                try:
                    shard.write_deferred()
                except StorageError as exc:
                    _log.error("write to %s shard %d failed: %s", shard.spec.name, shard.index, exc)
                    failed.add(key)
            for key, shard in touched.items():
                if shard.log is not None and key not in failed:
                    try:
                        await shard.log.wait_durable(shard.next_offset - 1)
                    except StorageError as exc:
                        _log.error(
                            "log of %s shard %d failed: %s", shard.spec.name, shard.index, exc
                        )
                        failed.add(key)
            for key, shard in touched.items():
                if key in failed:
                    continue
                for sub in shard.flush():
                    # `block` policy: this tenant waits for the slow subscriber.
                    await sub.wait_for_room()
            for request, base in written:
                if request.done.done():
                    continue
                if id(request.shard) in failed:
                    request.done.set_exception(StorageError("the shard's log failed"))
                else:
                    if request.guard is not None:
                        request.guard.durable(base)
                    request.done.set_result(base)
            for _ in batch:
                queue.task_done()


ReadGate = Callable[[StreamSpec, int], "tuple[ErrorCode, str | None] | None"]


class Engine:
    """Every stream shard this broker serves, and the tenants' publish pipelines."""

    def __init__(
        self,
        catalog: Catalog,
        config: BrokerConfig,
        metrics: BrokerMetrics,
        store: LogStore | None = None,
    ) -> None:
        self.catalog = catalog
        self.config = config
        self.metrics = metrics
        self.store = store
        self._shards: dict[tuple[str, str, str, int], Shard] = {}
        self._pipelines: dict[str, _TenantPipeline] = {}
        self._subscription_ids = itertools.count(1)
        self.queued_bytes = QueuedBytes(config.subscriber_queued_bytes_max, metrics)
        self._record_publishers = config.record_publishers
        # A fleet member's replication (felix_broker.replication.manager): takes the
        # publishes of replicated shards (a future), None for every other shard.
        self.replication_hook: Callable[[PublishRequest], asyncio.Future[int] | None] | None = None
        # And why readers of a replicated shard are refused on this broker (a settling
        # leader: not_ready; not the leader: not_leader), None when they are served.
        self.read_gate: ReadGate | None = None

    @property
    def record_publishers(self) -> bool:
        """Whether durable logs store publishers now (a fleet member: once the fleet
        finalized publisher_principal)."""
        return self._record_publishers

    def set_record_publishers(self, on: bool) -> None:
        """Store publishers in durable logs from the next append on (every shard, and
        every shard built later): a fleet member turns it on once the fleet finalized
        publisher_principal."""
        self._record_publishers = on
        for shard in self._shards.values():
            shard.record_publishers = on

    def read_refusal(self, spec: StreamSpec, index: int) -> tuple[ErrorCode, str | None] | None:
        """Why a read of a replicated shard is refused here (None: read on)."""
        if self.read_gate is None or not spec.replicated:
            return None
        return self.read_gate(spec, index)

    # -- lookup ------------------------------------------------------------------

    def stream(self, tenant_id: str, namespace: str, stream: str) -> StreamSpec | None:
        return self.catalog.stream(tenant_id, namespace, stream)

    async def recover(self) -> int:
        """Build the shard of every stream log the store recovered, replaying each one's
        producer marks and commits on a worker thread (one pass over the retained
        batch heads), so that neither the first request nor the event loop pays for
        it. Call once, before serving; returns how many shards were built."""
        if self.store is None:
            return 0
        built = 0
        for key in self.store.offsets():
            spec = self.catalog.stream(key.tenant, key.namespace, key.stream)
            if spec is None or not spec.durable or key.shard >= spec.shards:
                continue  # a log the catalog no longer names: left alone
            index = (key.tenant, key.namespace, key.stream, key.shard)
            if index in self._shards:
                continue
            log = self.store.open_log(key, retention=self.retention_for(spec))
            marks = await asyncio.to_thread(ShardMarks.rebuild, log)
            built_shard = Shard(spec, key.shard, self.config, log, marks)
            built_shard.record_publishers = self._record_publishers
            self._shards[index] = built_shard
            built += 1
        return built

    def shard(self, spec: StreamSpec, index: int) -> Shard:
        key = (spec.tenant_id, spec.namespace, spec.name, index)
        shard = self._shards.get(key)
        if shard is None:
            log = None
            if spec.durable and self.store is not None:
                retention = self.retention_for(spec)
                log = self.store.open_log(ShardKey(*key), retention=retention)
            shard = self._shards[key] = Shard(spec, index, self.config, log)
            shard.record_publishers = self._record_publishers
        return shard

    def retention_for(self, spec: StreamSpec) -> Retention:
        """The stream's own retention, else the broker's defaults (0 = unbounded)."""
        config = self.config
        age_ms = spec.retention_max_age_ms
        if age_ms is None:
            age_ms = config.durable_retention_max_age_ms or None
        size = spec.retention_max_bytes
        if size is None:
            size = config.durable_retention_max_bytes or None
        return Retention(max_bytes=size, max_age_us=None if age_ms is None else age_ms * 1000)

    def forget_stream(self, tenant_id: str, namespace: str, stream: str) -> None:
        """Drop a deleted stream's shards (their subscribers were ended by the caller)."""
        for key in [k for k in self._shards if k[:3] == (tenant_id, namespace, stream)]:
            shard = self._shards.pop(key)
            for sub in shard.subscribers:
                sub.close()
            shard.subscribers.clear()

    def shard_subscribers(self, tenant_id: str, namespace: str, stream: str, index: int) -> int:
        """How many subscribers of one shard are still open."""
        shard = self._shards.get((tenant_id, namespace, stream, index))
        return 0 if shard is None else sum(1 for s in shard.subscribers if not s.closed)

    def release_shard(self, tenant_id: str, namespace: str, stream: str, index: int) -> None:
        """Forget one shard and close its log (it moved to another broker, or its storage
        is about to be replaced by a move's copy); the next use opens it from disk again.
        Its subscribers were ended by the caller."""
        shard = self._shards.pop((tenant_id, namespace, stream, index), None)
        if shard is None:
            if self.store is not None:
                self.store.forget(ShardKey(tenant_id, namespace, stream, index))
            return
        for sub in shard.subscribers:
            sub.close()
        shard.subscribers.clear()
        if self.store is not None:
            self.store.forget(ShardKey(tenant_id, namespace, stream, index))

    def shard_for(self, spec: StreamSpec, key: bytes | None) -> Shard:
        return self.shard(spec, shard_for_key(key, spec.shards, spec.routing.value))

    # -- publishing --------------------------------------------------------------

    async def publish(self, request: PublishRequest, *, acked: bool) -> asyncio.Future[int]:
        """Queue a batch for its shard; the future resolves to its base offset once
        appended. Raises OverloadedError when the tenant's queue has no room."""
        if self.replication_hook is not None:
            replicated = self.replication_hook(request)
            if replicated is not None:
                return replicated
        tenant_id = request.shard.spec.tenant_id
        pipeline = self._pipelines.get(tenant_id)
        if pipeline is None:
            pipeline = self._pipelines[tenant_id] = _TenantPipeline(
                tenant_id,
                self.config.pub_queue_depth,
                self.config.event_batch_max_delay_us,
                self.metrics,
            )
        try:
            pipeline.queue.put_nowait(request)
            return request.done
        except asyncio.QueueFull:
            pass
        wait_ms = self.config.publish_queue_wait_timeout_ms
        if (acked or self.config.pub_ingress_wait) and wait_ms > 0:
            try:
                async with asyncio.timeout(wait_ms / 1000):
                    await pipeline.queue.put(request)
                return request.done
            except TimeoutError:
                pass
        self.metrics.tenant_publish_queue_full.labels(tenant=tenant_id).inc()
        raise OverloadedError(tenant_id, retry_after_ms=10)

    async def drain(self) -> None:
        """Wait until every queued publish has been appended and delivered to queues."""
        for pipeline in list(self._pipelines.values()):
            await pipeline.queue.join()

    def close(self) -> None:
        for pipeline in self._pipelines.values():
            pipeline.task.cancel()
        for shard in self._shards.values():
            for sub in shard.subscribers:
                sub.close()
            shard.subscribers.clear()

    # -- subscribing -------------------------------------------------------------

    def subscribe(
        self, shard: Shard, client: Capabilities, *, capacity: int | None = None
    ) -> Subscriber:
        sub = Subscriber(
            next(self._subscription_ids),
            shard,
            variant_for(client, durable=shard.durable),
            capacity or self.config.subscriber_queue_capacity,
            self.config.subscriber_queue_policy,
            self.metrics,
            max_bytes=self.config.subscriber_queue_max_bytes,
            budget=self.queued_bytes,
        )
        shard.subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        sub.close()
        with contextlib.suppress(ValueError):
            sub.shard.subscribers.remove(sub)

    def clamp_queue_capacity(self, asked: int) -> int:
        return max(1, min(asked, self.config.subscriber_queue_capacity_max))


def now_micros() -> int:
    return wall_us()


def publisher_of(subject: str) -> str | None:
    """The publisher a batch reports: the token's sub, unless too long to carry."""
    return subject if len(subject.encode()) <= MAX_PUBLISHER_BYTES else None
