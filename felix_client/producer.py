"""The idempotent producer: `async with client.producer("orders") as producer:`.

A producer asks the broker for an id (`producer_init`) and numbers its batches
per shard from 0 (a key routes to its shard exactly as the broker routes it,
`felix_wire.routing`). Its batches travel on one stream of a connection of its
own, at most `max_in_flight` (64) unanswered at once; `send` waits for room.

Answers are handed back in the order the batches were sent. When a batch's
outcome is unknown (the connection was lost, no answer came in time, or the
broker answered with a `retry`, `retry_after` or `outcome_unknown` class), every
unanswered batch is resent, in order, under the same sequences, on a new
connection, until `resend_timeout` runs out: the broker appends a batch it has
not seen and answers one it has with the original offsets, so each batch lands
exactly once.

What cannot be repaired ends the producer: every batch not yet answered and
every later call raise the error. `UnknownProducerError` (the broker forgot the
id, e.g. an in-memory stream after a restart: the producer never silently takes
a new id, which could duplicate what was in doubt), the `SequenceError`s, and
any other refusal (a batch refused for good leaves its shard's later sequences
unusable). Make a new producer to go on.

To continue a producer in a new process, pass the `producer_id` and the
`next_sequences` it reached (`Producer.next_sequences`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Self

from felix_transport import Connection
from felix_wire.errors import BrokerError, RetryClass
from felix_wire.features import Feature
from felix_wire.frame import MAX_FRAME_BYTES
from felix_wire.messages import ProducerInit, ProducerInitOk, PublishOk, PublishRefused
from felix_wire.routing import RoutingMode, shard_for_key

from ._channel import Answer, Channel
from .errors import (
    ClientError,
    ClientTimeoutError,
    ConnectionLostError,
    PayloadTooLargeError,
    ProtocolViolationError,
)

if TYPE_CHECKING:
    from .client import Client

__all__ = [
    "MAX_IN_FLIGHT",
    "Producer",
    "ProducerClosedError",
    "ProducerError",
    "SequenceError",
    "SequenceExpiredError",
    "SequenceGapError",
    "SequenceReusedError",
    "UnknownProducerError",
]

logger = logging.getLogger(__name__)

# The protocol's convention (PL6): a shard remembers a producer's last 64
# batches, so at most 64 can be in doubt and still be answered as duplicates.
MAX_IN_FLIGHT = 64
_RESEND = frozenset({RetryClass.RETRY, RetryClass.RETRY_AFTER, RetryClass.OUTCOME_UNKNOWN})


# -- errors ----------------------------------------------------------------------------


class ProducerError(ClientError):
    """An idempotent producer cannot go on; `producer_id` names it."""

    def __init__(self, message: str, producer_id: int | None) -> None:
        super().__init__(message)
        self.producer_id = producer_id


class UnknownProducerError(ProducerError):
    """The broker does not know the producer id (it forgot it, or restarted
    without durable state). The producer ended rather than take a new id."""


class SequenceError(ProducerError):
    """The broker refused batch `sequence` of `shard` for its number."""

    def __init__(self, message: str, producer_id: int, shard: int, sequence: int) -> None:
        super().__init__(message, producer_id)
        self.shard = shard
        self.sequence = sequence


class SequenceGapError(SequenceError):
    """The batch is ahead of what the broker expects (`expected`)."""

    def __init__(self, producer_id: int, shard: int, sequence: int, expected: int) -> None:
        super().__init__(
            f"producer {producer_id:#x} shard {shard}: sequence {sequence} is ahead of the"
            f" broker's expected {expected}",
            producer_id,
            shard,
            sequence,
        )
        self.expected = expected


class SequenceExpiredError(SequenceError):
    """The batch is older than anything the broker remembers of the producer."""


class SequenceReusedError(SequenceError):
    """The broker holds this sequence with other payloads."""


class ProducerClosedError(ProducerError):
    """The producer was closed, or ended by the error it names as `__cause__`."""


# -- batches ---------------------------------------------------------------------------


@dataclass(eq=False)
class _Batch:
    shard: int
    sequence: int
    payloads: list[bytes]
    key: bytes | None
    future: asyncio.Future[int | None]
    offset: int | None = None
    answered: bool = False
    error: BaseException | None = None
    epoch: int = -1  # the connection epoch it was last written in

    @property
    def final(self) -> bool:
        return self.answered or self.error is not None


def _retrieve(future: asyncio.Future[int | None]) -> None:
    # The error also ends the producer and is raised by flush/aclose, so an
    # unawaited `send` future never makes asyncio complain.
    if not future.cancelled():
        future.exception()


@dataclass
class _Link:
    connection: Connection
    channel: Channel
    epoch: int
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class Producer:
    """An idempotent producer of one stream; create with `client.producer(stream)`."""

    def __init__(
        self,
        client: Client,
        stream: str,
        namespace: str,
        *,
        producer_id: int | None = None,
        next_sequences: Mapping[int, int] | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        resend_timeout: float = 30.0,
        timeout: float | None = None,
    ) -> None:
        if not 1 <= max_in_flight <= MAX_IN_FLIGHT:
            raise ValueError(f"max_in_flight must be within 1..{MAX_IN_FLIGHT}")
        if resend_timeout <= 0:
            raise ValueError("resend_timeout must be positive")
        if next_sequences and producer_id is None:
            raise ValueError("next_sequences continue a producer: give its producer_id too")
        if any(s < 0 or v < 0 for s, v in (next_sequences or {}).items()):
            raise ValueError("shards and sequences are never negative")
        self._client = client
        self.stream = stream
        self.namespace = namespace
        self._producer_id = producer_id
        self._next: dict[int, int] = dict(next_sequences or {})
        self._max_in_flight = max_in_flight
        self._resend_timeout = resend_timeout
        self._timeout = timeout or client.config.request_timeout
        self._room = asyncio.Semaphore(max_in_flight)
        self._write_lock = asyncio.Lock()
        self._pending: deque[_Batch] = deque()
        self._drained = asyncio.Event()
        self._drained.set()
        self._layout: tuple[int, RoutingMode] = (1, "modulo")
        self._link: _Link | None = None
        # The broker a `not_leader` refusal named (dialed first from then on): in a
        # fleet only a shard's leader takes idempotent batches.
        self._owner: str | None = None
        self._epoch = 0
        self._recovery: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        # When batches first became in doubt without an answer since (resends give
        # up resend_timeout after it).
        self._doubt_since: float | None = None
        self._started = False
        self._closed = False
        self.resent = 0  # batches written again after an outcome was unknown

    # -- state ---------------------------------------------------------------------------

    @property
    def producer_id(self) -> int:
        if self._producer_id is None:
            raise RuntimeError("the producer has not started (use `async with`)")
        return self._producer_id

    @property
    def next_sequences(self) -> dict[int, int]:
        """The next sequence of every shard written to (to continue the producer)."""
        return dict(self._next)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Take an id (unless continuing one), learn the stream's routing and connect."""
        if self._started:
            return
        self._started = True
        client = self._client
        if self._producer_id is None:
            answer = await client._call(lambda rid: ProducerInit(request_id=rid), ProducerInitOk)
            self._producer_id = answer.producer_id
        elif not client.supports(Feature.FEATURE_IDEMPOTENT_PRODUCER):
            client._require(ProducerInit(request_id=0))
        if client.supports(Feature.FEATURE_STREAM_SHARDS):
            shards, mode = await client._stream_layout(self.namespace, self.stream)
            if shards == 0:
                raise ProducerError(
                    f"the broker knows no stream {self.namespace}/{self.stream}", None
                )
            self._layout = (shards, mode)
        self._link = await self._open()
        logger.debug("producer %#x of %s started", self._producer_id, self.stream)

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.aclose()
        else:
            # Leaving on an error: what is in flight still gets its answers first,
            # without raising over the error already on its way out.
            with contextlib.suppress(Exception):
                await self.aclose()

    async def flush(self) -> None:
        """Wait until every batch sent so far is answered; raise what ended the producer."""
        await self._drained.wait()
        self._raise_if_failed()

    async def aclose(self) -> None:
        """Flush, then close the producer's connection. Raises what ended the producer."""
        if self._closed:
            return
        try:
            if self._started:
                await self.flush()
        finally:
            self._closed = True
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._closed = True
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(BaseException):
                await self._recovery
        self._fail_pending(ProducerClosedError("the producer was closed", self._producer_id))
        await self._drop_link()

    # -- sending -------------------------------------------------------------------------

    async def send(
        self, payloads: bytes | Sequence[bytes], *, key: bytes | None = None
    ) -> asyncio.Future[int | None]:
        """Queue one batch (one payload or several, one key) and return the future of
        its first offset (record i is at offset + i; None when the broker reports
        no offset). Waits while `max_in_flight`
        batches are unanswered; raises at once if the producer has ended."""
        batch_payloads = [payloads] if isinstance(payloads, bytes) else list(payloads)
        if not batch_payloads:
            raise ValueError("a batch has at least one payload")
        size = sum(len(p) for p in batch_payloads)
        if size > MAX_FRAME_BYTES:
            raise PayloadTooLargeError("an idempotent batch", size, MAX_FRAME_BYTES)
        if not self._started or self._closed:
            raise ProducerClosedError(
                "the producer is not open (use `async with client.producer(...)`)",
                self._producer_id,
            )
        self._raise_if_failed()
        await self._room.acquire()
        # Numbered and written outside the caller's cancellation: once numbered, a
        # batch must reach the broker (or end the producer), or later sequences
        # of its shard would gap. A cancelled send may so still land (once).
        try:
            return await asyncio.shield(self._enqueue(batch_payloads, key))
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._room.release()
            raise

    async def _enqueue(
        self, payloads: list[bytes], key: bytes | None
    ) -> asyncio.Future[int | None]:
        async with self._write_lock:
            self._raise_if_failed()
            shards, mode = self._layout
            shard = shard_for_key(key, shards, mode)
            sequence = self._next.get(shard, 0)
            self._next[shard] = sequence + 1
            future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
            batch = _Batch(shard, sequence, payloads, key, future)
            self._pending.append(batch)
            self._drained.clear()
            link = self._link
            if self._recovery is None and link is not None:
                await self._write(link, batch)
            # else: the recovery writes it, in order, once it has a connection
            return future

    async def publish(self, payload: bytes, *, key: bytes | None = None) -> int | None:
        """Publish one record exactly once; returns its offset (None: the stream
        keeps no offsets to report, as an in-memory stream may)."""
        return await (await self.send(payload, key=key))

    async def publish_batch(
        self, payloads: Sequence[bytes], *, key: bytes | None = None
    ) -> int | None:
        """Publish a batch exactly once; returns its first offset."""
        return await (await self.send(payloads, key=key))

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise ProducerClosedError(
                f"the producer ended: {self._failed}", self._producer_id
            ) from self._failed

    async def _write(self, link: _Link, batch: _Batch) -> None:
        """Write `batch` on `link` (under the write lock) and watch for its answer."""
        if batch.epoch == link.epoch:
            return  # already written on this connection
        if batch.epoch >= 0:
            self.resent += 1
        batch.epoch = link.epoch
        try:
            future = await link.channel.send_idempotent(
                namespace=self.namespace,
                stream=self.stream,
                payloads=batch.payloads,
                key=batch.key,
                producer_id=self.producer_id,
                sequence=batch.sequence,
            )
        except ConnectionLostError as exc:
            self._in_doubt(link.epoch, exc)
            return
        except ClientError as exc:  # refused before sending (e.g. not supported)
            self._fail(exc)
            return
        task = asyncio.get_running_loop().create_task(self._watch(link, batch, future))
        link.tasks.add(task)
        task.add_done_callback(link.tasks.discard)

    # -- answers -------------------------------------------------------------------------

    async def _watch(self, link: _Link, batch: _Batch, future: asyncio.Future[Answer]) -> None:
        try:
            await self._answered(link, batch, future)
        except Exception as exc:  # a bug here must end the producer, never hang flush()
            self._fail(exc)

    async def _answered(self, link: _Link, batch: _Batch, future: asyncio.Future[Answer]) -> None:
        try:
            answer = await link.channel.answer(future, self._timeout)
        except (ClientTimeoutError, ConnectionLostError) as exc:
            self._in_doubt(link.epoch, exc)
            return
        except BrokerError as exc:
            if exc.retry in _RESEND:
                wait = exc.detail.get("retry_after_ms")
                self._in_doubt(link.epoch, exc, wait / 1000 if isinstance(wait, int) else None)
            elif link.epoch == self._epoch:
                self._fail(exc)
            return
        if isinstance(answer, PublishOk):
            if batch.answered and batch.offset != answer.offset:
                self._fail(
                    ProtocolViolationError(
                        f"a resent batch was answered at {answer.offset}, first at {batch.offset}"
                    )
                )
                return
            batch.offset = answer.offset
            batch.answered = True
            self._doubt_since = None  # the broker answers again
            self._deliver()
        elif isinstance(answer, PublishRefused):
            self._refused(link, batch, answer)
        else:
            self._fail(ProtocolViolationError(f"idempotent publish answered with {answer!r}"))

    def _refused(self, link: _Link, batch: _Batch, answer: PublishRefused) -> None:
        reason = answer.reason
        pid = self.producer_id
        if not isinstance(reason, str) and reason.not_leader is not None:
            addr = reason.not_leader.addr
            if addr and link.epoch == self._epoch:
                # Nothing was appended: resend it (and every batch after it) under the
                # same sequences to the leader named, within resend_timeout.
                self._owner = addr
                self._in_doubt(link.epoch, ConnectionLostError(f"not the leader; {addr} is"))
                return
            if link.epoch != self._epoch:
                return  # that connection's batches are already being resent
        if not isinstance(reason, str) and reason.sequence_gap is not None:
            expected = reason.sequence_gap.expected
            earlier = any(
                b.shard == batch.shard and b.sequence == expected and not b.final
                for b in self._pending
            )
            if link.epoch != self._epoch or earlier:
                # A batch before it was not appended (yet) and is being resent:
                # this one is in doubt too, not a gap of ours.
                self._in_doubt(link.epoch, ConnectionLostError("an earlier batch is resent"))
                return
            self._fail(SequenceGapError(pid, batch.shard, batch.sequence, expected))
            return
        what = f"producer {pid:#x} shard {batch.shard} sequence {batch.sequence}"
        error: ClientError
        if reason == "unknown_producer":
            error = UnknownProducerError(
                f"the broker does not know producer {pid:#x} ({answer.message}); the producer"
                " ended rather than take a new id",
                pid,
            )
        elif reason == "sequence_expired":
            error = SequenceExpiredError(
                f"{what} is older than the broker remembers", pid, batch.shard, batch.sequence
            )
        elif reason == "sequence_reused":
            error = SequenceReusedError(
                f"{what} was used for other payloads", pid, batch.shard, batch.sequence
            )
        else:
            error = ProtocolViolationError(f"idempotent publish refused: {answer.message}")
        self._fail(error)

    def _deliver(self) -> None:
        """Resolve answered batches from the oldest, so answers come in send order."""
        pending = self._pending
        while pending and pending[0].final:
            batch = pending.popleft()
            self._room.release()
            if not batch.future.done():
                if batch.error is not None:
                    batch.future.set_exception(batch.error)
                else:
                    batch.future.set_result(batch.offset)
        if not pending:
            self._drained.set()

    def _fail(self, error: BaseException) -> None:
        """End the producer: `error` for every batch not yet answered and every later call."""
        if self._failed is not None:
            return
        self._failed = error
        logger.warning("producer %s of %s ended: %s", self._producer_id, self.stream, error)
        self._fail_pending(error)
        if self._recovery is not None:
            self._recovery.cancel()
        link, self._link = self._link, None
        if link is not None:
            self._close_link(link)

    def _fail_pending(self, error: BaseException) -> None:
        for batch in self._pending:
            if not batch.final:
                batch.error = error
        self._deliver()

    # -- recovery ------------------------------------------------------------------------

    def _in_doubt(self, epoch: int, cause: BaseException, delay: float | None = None) -> None:
        """The batches of `epoch` may or may not have landed: resend them all."""
        if epoch != self._epoch or self._failed is not None or self._closed:
            return  # that connection's batches are already being resent
        now = asyncio.get_running_loop().time()
        if self._doubt_since is None:
            self._doubt_since = now
        elif now - self._doubt_since > self._resend_timeout:
            self._fail(cause)  # resent for resend_timeout without an answer: give up
            return
        self._epoch += 1
        link, self._link = self._link, None
        if link is not None:
            self._close_link(link)
        logger.info(
            "producer %s: resending %d batch(es) (%s)",
            self._producer_id,
            sum(not b.final for b in self._pending),
            cause,
        )
        self._recovery = asyncio.get_running_loop().create_task(self._recover(cause, delay))

    async def _recover(self, cause: BaseException, delay: float | None) -> None:
        try:
            await self._resend(cause, delay)
        except Exception as exc:  # never leave the producer waiting on a dead recovery
            self._recovery = None
            self._fail(exc)

    async def _resend(self, cause: BaseException, delay: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = (self._doubt_since or loop.time()) + self._resend_timeout
        attempt = 0
        while True:
            wait = delay if delay is not None and attempt == 0 else min(1.0, 0.05 * 2**attempt)
            await asyncio.sleep(random.uniform(wait / 2, wait) if delay is None else wait)
            attempt += 1
            try:
                link = await self._open()
            except (ClientTimeoutError, ConnectionLostError) as exc:
                cause = exc
                if loop.time() > deadline:
                    self._recovery = None
                    self._fail(cause)
                    return
                continue
            async with self._write_lock:
                self._link = link
                self._recovery = None
                for batch in list(self._pending):
                    if not batch.final and self._link is link:
                        await self._write(link, batch)
            return

    async def _open(self) -> _Link:
        dialer = self._client._dialer
        owner, self._owner = self._owner, None  # unreachable: rotate over the fleet next
        connection, label, addr = await dialer.connect(owner)
        if owner is not None:
            self._owner = addr
        try:
            channel = await dialer.channel(connection, f"{label}/producer")
        except BaseException:
            connection.close()
            raise
        return _Link(connection, channel, self._epoch)

    def _close_link(self, link: _Link) -> None:
        # Its watchers then see ConnectionLostError for an old epoch, and stop.
        link.channel.abandon()
        link.connection.close()

    async def _drop_link(self) -> None:
        link, self._link = self._link, None
        if link is None:
            return
        tasks = list(link.tasks)
        self._close_link(link)
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
