"""Consumer groups: a handle per group (`client.group(stream, name)`) and a
high-level consumer (`client.consumer(stream, group=...)`).

Every group request goes on a stream of its own while it is in flight (an
exclusive stream, reused afterwards): the broker answers group requests as
they finish, not in order, and refuses them with an `error` that carries no
request id, so only one outstanding request per stream can be matched for
certain. A long poll therefore holds nothing else back.

`Group` is one call per protocol message, on one shard. `Consumer` polls every
shard of the stream, hands records to an async iterator, keeps the claims of
records still in work alive (`group_extend`, when the broker has claim
control), and bounds how many records are claimed and not yet settled
(`max_in_flight`; a poll asks only for free places). Closing it hands back
what it claimed and did not settle (a nack naming the delivery), so another
consumer gets those records now instead of after the claim lapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, TypedDict, TypeVar

from felix_wire.errors import BrokerError, RetryClass
from felix_wire.features import Feature
from felix_wire.messages import (
    CacheOk,
    GroupAck,
    GroupDeadLetter,
    GroupDeadLetterList,
    GroupDeadLetters,
    GroupDelete,
    GroupDeleted,
    GroupDescribe,
    GroupDiscard,
    GroupExtend,
    GroupExtended,
    GroupInfo,
    GroupNack,
    GroupPoll,
    GroupPosition,
    GroupRecords,
    GroupRedrive,
    GroupSeek,
    Message,
)

from .errors import (
    ClientError,
    ClientTimeoutError,
    ConnectionLostError,
    NotSupportedByBrokerError,
)
from .subscription import Start, start_position

if TYPE_CHECKING:
    from ._channel import Channel
    from .client import Client

__all__ = [
    "ClaimedRecord",
    "Consumer",
    "ConsumerRecord",
    "Group",
    "GroupState",
    "SeekResult",
]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


class _Scope(TypedDict):
    tenant_id: str
    namespace: str
    stream: str
    shard: int
    group: str


class _Caller(Protocol):
    tenant_id: str

    def supports(self, feature: Feature) -> bool: ...

    async def _exclusive_call(
        self, build: Callable[[int], Message], answer_type: type[M], *, timeout: float | None
    ) -> M: ...


@dataclass(frozen=True, slots=True)
class ClaimedRecord:
    """A record a poll claimed for the group. `attempts` counts deliveries
    including this one (0: the broker did not say); it names this delivery
    to `nack` and `extend`."""

    stream: str
    shard: int
    offset: int
    payload: bytes
    attempts: int
    publisher: str | None = None
    timestamp_micros: int | None = None
    skipped_before: int = 0


@dataclass(frozen=True, slots=True)
class GroupState:
    """A group's state on one shard: `committed` is the cursor (None: the group
    has none yet), `tail` the shard's next offset."""

    committed: int | None
    tail: int
    in_flight: int
    owed: int
    dead_letters: int


@dataclass(frozen=True, slots=True)
class SeekResult:
    offset: int
    moved: bool


def _ms(seconds: float | None, what: str) -> int:
    if seconds is None:
        return 0
    if seconds < 0:
        raise ValueError(f"{what} must be >= 0 seconds")
    return round(seconds * 1000)


class Group:
    """One consumer group of one stream; every call names the shard."""

    def __init__(self, client: _Caller, stream: str, name: str, namespace: str) -> None:
        if not name:
            raise ValueError("a group needs a name")
        self._client = client
        self.stream = stream
        self.name = name
        self.namespace = namespace

    def _scope(self, shard: int) -> _Scope:
        if shard < 0:
            raise ValueError("a shard is >= 0")
        return _Scope(
            tenant_id=self._client.tenant_id,
            namespace=self.namespace,
            stream=self.stream,
            shard=shard,
            group=self.name,
        )

    async def _call(
        self, build: Callable[[int], Message], answer: type[M], timeout: float | None = None
    ) -> M:
        return await self._client._exclusive_call(build, answer, timeout=timeout)

    async def poll(
        self,
        shard: int,
        *,
        max_records: int = 100,
        wait: float = 0.0,
        consumer: str | None = None,
        reclaim: bool = False,
        visibility: float | None = None,
        timeout: float | None = None,
    ) -> list[ClaimedRecord]:
        """Claim up to `max_records` records of `shard`, waiting up to `wait`
        seconds for some (a long poll; the broker caps the wait). `consumer`
        names the member (its claims can be `reclaim`ed after a restart);
        `visibility` is how long the claims stand (None: the broker's default)."""
        if max_records < 1:
            raise ValueError("max_records must be >= 1")
        scope = self._scope(shard)
        wait_ms = _ms(wait, "wait")
        visibility_ms = _ms(visibility, "visibility")
        answer = await self._call(
            lambda rid: GroupPoll(
                **scope,
                max_records=max_records,
                wait_ms=wait_ms,
                request_id=rid,
                consumer=consumer,
                reclaim=reclaim,
                visibility_ms=visibility_ms,
            ),
            GroupRecords,
            None if timeout is None else timeout + wait,
        )
        return [
            ClaimedRecord(
                stream=self.stream,
                shard=shard,
                offset=r.offset,
                payload=r.payload,
                attempts=r.attempts,
                publisher=r.publisher,
                timestamp_micros=r.timestamp_micros,
                skipped_before=r.skipped_before,
            )
            for r in answer.records
        ]

    async def ack(self, shard: int, offset: int, *, timeout: float | None = None) -> None:
        """Finish a claimed record (StaleClaimError: the claim no longer stands)."""
        scope = self._scope(shard)
        await self._call(
            lambda rid: GroupAck(**scope, offset=offset, request_id=rid),
            CacheOk,
            timeout,
        )

    async def nack(
        self,
        shard: int,
        offset: int,
        *,
        delay: float | None = None,
        attempts: int = 0,
        timeout: float | None = None,
    ) -> None:
        """Hand a claimed record back: owed again now, or after `delay` seconds.
        `attempts` names the delivery handed back (0: whichever claim stands)."""
        scope = self._scope(shard)
        delay_ms = _ms(delay, "delay")
        await self._call(
            lambda rid: GroupNack(
                **scope,
                offset=offset,
                request_id=rid,
                delay_ms=delay_ms,
                attempts=attempts,
            ),
            CacheOk,
            timeout,
        )

    async def extend(
        self, shard: int, offset: int, *, attempts: int, by: float, timeout: float | None = None
    ) -> float:
        """Keep the claim of delivery `attempts` of a record for `by` more seconds;
        returns how long it now stands, in seconds."""
        if by <= 0:
            raise ValueError("extend by more than 0 seconds")
        scope = self._scope(shard)
        extend_ms = max(1, _ms(by, "by"))
        answer = await self._call(
            lambda rid: GroupExtend(
                **scope,
                offset=offset,
                attempts=attempts,
                extend_ms=extend_ms,
                request_id=rid,
            ),
            GroupExtended,
            timeout,
        )
        return answer.visible_ms / 1000

    async def dead_letter(self, shard: int, offset: int, *, timeout: float | None = None) -> None:
        """Dead-letter a record by hand."""
        scope = self._scope(shard)
        await self._call(
            lambda rid: GroupDeadLetter(**scope, offset=offset, request_id=rid),
            CacheOk,
            timeout,
        )

    async def dead_letters(self, shard: int, *, timeout: float | None = None) -> list[int]:
        """The shard's dead-lettered offsets, ascending."""
        scope = self._scope(shard)
        answer = await self._call(
            lambda rid: GroupDeadLetters(**scope, request_id=rid),
            GroupDeadLetterList,
            timeout,
        )
        return list(answer.offsets)

    async def discard(self, shard: int, offset: int, *, timeout: float | None = None) -> None:
        """Drop a dead letter for good."""
        scope = self._scope(shard)
        await self._call(
            lambda rid: GroupDiscard(**scope, offset=offset, request_id=rid),
            CacheOk,
            timeout,
        )

    async def redrive(self, shard: int, offset: int, *, timeout: float | None = None) -> None:
        """Put a dead letter back in play (owed again)."""
        scope = self._scope(shard)
        await self._call(
            lambda rid: GroupRedrive(**scope, offset=offset, request_id=rid),
            CacheOk,
            timeout,
        )

    async def seek(
        self, shard: int, start: Start, *, if_new: bool = False, timeout: float | None = None
    ) -> SeekResult:
        """Move the group's cursor on `shard` to `start` ("earliest", "latest" or an
        offset); with `if_new`, only when the group has no cursor there yet."""
        scope = self._scope(shard)
        position = start_position(start)
        answer = await self._call(
            lambda rid: GroupSeek(
                **scope,
                start=position,
                if_new=if_new,
                request_id=rid,
            ),
            GroupPosition,
            timeout,
        )
        return SeekResult(answer.offset, answer.moved)

    async def describe(self, shard: int, *, timeout: float | None = None) -> GroupState:
        """The group's cursor, the shard's tail and the group's counts there."""
        scope = self._scope(shard)
        answer = await self._call(
            lambda rid: GroupDescribe(**scope, request_id=rid),
            GroupInfo,
            timeout,
        )
        return GroupState(
            answer.committed, answer.tail, answer.in_flight, answer.owed, answer.dead_letters
        )

    async def delete(self, shard: int, *, timeout: float | None = None) -> bool:
        """Remove the group's state on `shard`; whether it existed."""
        scope = self._scope(shard)
        answer = await self._call(
            lambda rid: GroupDelete(**scope, request_id=rid),
            GroupDeleted,
            timeout,
        )
        return answer.existed


# -- the high-level consumer -----------------------------------------------------------


@dataclass(eq=False)
class ConsumerRecord:
    """A record handed out by a `Consumer`; settle it with `ack()` or `nack()`
    (each at most once: a second settle raises ClientError)."""

    record: ClaimedRecord
    _consumer: Consumer = field(repr=False)
    _deadline: float = field(default=0.0, repr=False)
    _settled: bool = field(default=False, repr=False)

    @property
    def payload(self) -> bytes:
        return self.record.payload

    @property
    def offset(self) -> int:
        return self.record.offset

    @property
    def shard(self) -> int:
        return self.record.shard

    @property
    def attempts(self) -> int:
        return self.record.attempts

    @property
    def settled(self) -> bool:
        return self._settled

    async def ack(self) -> None:
        """Done with it: the group never hands this record out again."""
        await self._consumer._settle(self, nack=False, delay=None)

    async def nack(self, *, delay: float | None = None) -> None:
        """Hand it back: owed again now, or after `delay` seconds."""
        await self._consumer._settle(self, nack=True, delay=delay)


class Consumer:
    """Every shard of `stream` for group `group`: `async with client.consumer(...)
    as consumer: async for record in consumer: ...; await record.ack()`.

    At most `max_in_flight` records are claimed and unsettled at once (a poll
    asks for free places only, up to `batch`); each shard long-polls for
    `wait` seconds. With claim control, claims stand for `visibility` seconds
    and those of records still in work are extended before they lapse.
    `consumer` names this member (its earlier claims are reclaimed on start).
    A shard whose polls fail for good (a refusal that resending cannot fix, or
    eight transient failures in a row) raises its error once from the iterator;
    the other shards go on.
    """

    def __init__(
        self,
        client: Client,
        group: Group,
        *,
        consumer: str | None,
        max_in_flight: int,
        batch: int,
        wait: float,
        visibility: float | None,
        shards: list[int] | None,
    ) -> None:
        if max_in_flight < 1 or batch < 1:
            raise ValueError("max_in_flight and batch must be >= 1")
        if wait < 0:
            raise ValueError("wait must be >= 0 seconds")
        self._client = client
        self.group = group
        self.member = consumer
        self.max_in_flight = max_in_flight
        self.batch = batch
        self.wait = wait
        self._claim_control = client.supports(Feature.FEATURE_GROUP_CLAIM_CONTROL)
        if visibility is not None and visibility <= 0:
            raise ValueError("visibility must be > 0 seconds")
        self.visibility = visibility if self._claim_control else None
        if consumer is not None and not client.supports(Feature.FEATURE_GROUP_CONSUMER):
            raise NotSupportedByBrokerError("group_poll.consumer", ("FEATURE_GROUP_CONSUMER",))
        self._shards = shards
        self.shards: list[int] = []
        self._places = _Places(max_in_flight)
        # Records claimed and not settled: handed out, or waiting to be.
        self._in_work: dict[tuple[int, int], ConsumerRecord] = {}
        # Bounded without a maxsize: it holds claimed records only (at most
        # max_in_flight) and at most one error per shard.
        self._ready: asyncio.Queue[ConsumerRecord | BaseException] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._polls: dict[int, asyncio.Task[None]] = {}
        self._in_poll: set[int] = set()  # shards with a poll on the wire
        self._acks = _AckPipe(client, group)
        self._started = False
        self._closed = False
        self.delivered = 0

    # -- life cycle ----------------------------------------------------------------

    async def start(self) -> Self:
        if self._started:
            return self
        self._started = True
        if self._shards is not None:
            self.shards = list(self._shards)
        else:
            count = await self._client._shard_count(self.group.namespace, self.group.stream)
            self.shards = list(range(count))
        loop = asyncio.get_running_loop()
        label = f"felix-consumer-{self.group.stream}/{self.group.name}"
        for shard in self.shards:
            task = loop.create_task(self._poll_loop(shard), name=f"{label}/{shard}")
            self._polls[shard] = task
            self._tasks.append(task)
        if self.visibility is not None:
            self._tasks.append(loop.create_task(self._extend_loop(), name=f"{label}/extend"))
        return self

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop polling and hand back every record claimed and not settled.

        A poll already on the wire is let finish (within `wait` plus the request
        timeout) rather than cancelled: its answer may claim records, and a claim
        whose answer was dropped would keep them from everyone until it lapses."""
        if self._closed:
            return
        self._closed = True
        finishing = [self._polls[s] for s in self._in_poll if s in self._polls]
        for task in self._tasks:
            if task not in finishing:
                task.cancel()
        if finishing:
            limit = self.wait + self._client.config.request_timeout
            _done, late = await asyncio.wait(finishing, timeout=limit)
            for task in late:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        unsettled = [r for r in self._in_work.values() if not r._settled]
        self._in_work.clear()

        async def hand_back(item: ConsumerRecord) -> None:
            item._settled = True
            attempts = item.attempts if self._claim_control else 0
            with contextlib.suppress(BrokerError, ClientError):
                await self.group.nack(item.shard, item.offset, attempts=attempts)

        await asyncio.gather(*(hand_back(r) for r in unsettled))
        await self._acks.aclose()
        self._ready.put_nowait(StopAsyncIteration())  # wakes a reader waiting for more

    @property
    def in_flight(self) -> int:
        """Records claimed and not settled yet (places a poll in flight holds for
        records it may claim do not count)."""
        return len(self._in_work)

    # -- iteration -----------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ConsumerRecord:
        if not self._started:
            await self.start()
        while True:
            if self._closed and self._ready.empty():
                raise StopAsyncIteration
            item = await self._ready.get()
            if isinstance(item, BaseException):
                raise item
            if item._settled:
                continue
            self.delivered += 1
            return item

    async def next(self, timeout: float | None = None) -> ConsumerRecord:
        """The next record; ClientTimeoutError when none came within `timeout` s."""
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except TimeoutError as exc:
            if isinstance(exc, ClientTimeoutError):
                raise
            raise ClientTimeoutError(f"consumer: no record within {timeout} s") from None

    # -- settling ------------------------------------------------------------------

    async def _settle(self, item: ConsumerRecord, *, nack: bool, delay: float | None) -> None:
        if item._settled:
            raise ClientError(f"record {item.shard}/{item.offset} was already settled")
        item._settled = True
        try:
            if nack:
                attempts = item.attempts if self._claim_control else 0
                await self.group.nack(item.shard, item.offset, delay=delay, attempts=attempts)
            elif not await self._acks.ack(item.shard, item.offset):
                # Not answered ok on the shared stream: once more on a stream of its
                # own, where a refusal is this ack's (a repeated ack is answered ok).
                await self.group.ack(item.shard, item.offset)
        finally:
            self._in_work.pop((item.shard, item.offset), None)
            self._places.release(1)

    async def _poll_loop(self, shard: int) -> None:
        reclaim = self.member is not None
        failures = 0
        loop = asyncio.get_running_loop()
        while not self._closed:
            want = await self._places.take(self.batch)
            if self._closed:
                self._places.release(want)
                return
            self._in_poll.add(shard)
            try:
                records = await self.group.poll(
                    shard,
                    max_records=want,
                    wait=self.wait,
                    consumer=self.member,
                    reclaim=reclaim,
                    visibility=self.visibility,
                )
            except asyncio.CancelledError:
                self._places.release(want)
                raise
            except BaseException as exc:
                self._places.release(want)
                if not _transient(exc) or failures >= 8:
                    self._ready.put_nowait(exc)
                    return
                failures += 1
                pause = random.uniform(0, min(2.0, 0.05 * 2**failures))
                logger.info("consumer %d: poll failed (%s); again in %.2f s", shard, exc, pause)
                await asyncio.sleep(pause)
                continue
            finally:
                self._in_poll.discard(shard)
            failures = 0
            reclaim = False
            if len(records) < want:
                self._places.release(want - len(records))
            deadline = loop.time() + (self.visibility or 0)
            for record in records:
                item = ConsumerRecord(record, self, deadline)
                self._in_work[(shard, record.offset)] = item
                self._ready.put_nowait(item)

    async def _extend_loop(self) -> None:
        visibility = self.visibility
        assert visibility is not None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(visibility / 4)
            now = loop.time()
            due = [
                r
                for r in self._in_work.values()
                if not r._settled and r._deadline - now < visibility / 2
            ]
            for item in due:
                try:
                    granted = await self.group.extend(
                        item.shard, item.offset, attempts=item.attempts, by=visibility
                    )
                except (BrokerError, ClientError) as exc:
                    # The claim is gone (lapsed or settled elsewhere): its settle will say so.
                    logger.info(
                        "consumer: could not extend %d/%d: %s", item.shard, item.offset, exc
                    )
                    continue
                item._deadline = loop.time() + granted


class _AckPipe:
    """A consumer's acks, pipelined on one stream per broker (the shard's owner,
    else the entry broker) instead of a stream each: many acks then share a
    datagram and cost no stream set-up, as their answers do on the way back.

    An ack counts as done only when the broker answers it with `cache_ok` under
    its own request id, which the broker sends once the ack is durable (as on a
    stream of its own). A refusal names no request, so on a shared stream it
    cannot be told whose it is: the stream is retired at the first refusal (or
    loss, or timeout), every ack pending on it fails over, and `ack` returns
    False for each; the caller then sends that ack on a stream of its own
    (`Group.ack`), where the refusal, if any, is its own. Resending is safe: a
    repeated ack is answered ok and changes nothing. The acks in flight here
    are bounded by the consumer's `max_in_flight` (each settles one claim)."""

    def __init__(self, client: Client, group: Group) -> None:
        self._client = client
        self._group = group
        self._channels: dict[str | None, Channel] = {}
        self._opening = asyncio.Lock()
        self._checked = False
        self._closed = False

    async def _channel(self, target: str | None) -> Channel:
        channel = self._channels.get(target)
        if channel is not None and not channel.closed:
            return channel
        async with self._opening:
            channel = self._channels.get(target)
            if channel is None or channel.closed:
                channel = await self._client._side_channel(target, "acks")
                self._channels[target] = channel
            return channel

    async def ack(self, shard: int, offset: int) -> bool:
        """True once the broker answered this ack ok; False: send it again apart."""
        if self._closed:
            return False
        group = self._group
        scope = group._scope(shard)

        def build(rid: int) -> Message:
            return GroupAck(**scope, offset=offset, request_id=rid)

        if not self._checked:
            self._client._require(build(0))  # the same gates for every ack
            self._checked = True
        target = self._client._owner_target(("stream", group.namespace, group.stream, shard))
        channel: Channel | None = None
        try:
            channel = await self._channel(target)
            answer = await channel.call(build, self._client.config.request_timeout)
        except (BrokerError, ClientError, OSError) as exc:
            if channel is not None and self._channels.get(target) is channel:
                del self._channels[target]
                channel.abandon(ConnectionLostError(f"{channel.label}: retired ({exc})"))
            return False
        return isinstance(answer, CacheOk)

    async def aclose(self) -> None:
        """Close the streams; acks still pending on them fail over (see above)."""
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            with contextlib.suppress(ClientError, OSError):
                await channel.aclose()


class _Places:
    """Places for claimed, unsettled records, granted first come, first served:
    a shard whose poll came back empty queues behind the shards waiting, so
    shards without records cannot starve one that has some."""

    def __init__(self, total: int) -> None:
        self.free = total
        self._waiting: deque[tuple[int, asyncio.Future[int]]] = deque()

    async def take(self, most: int) -> int:
        """Wait for at least one free place; take up to `most`."""
        if self.free > 0 and not self._waiting:
            granted = min(self.free, most)
            self.free -= granted
            return granted
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (most, future)
        self._waiting.append(entry)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            elif entry in self._waiting:
                self._waiting.remove(entry)
            raise

    def release(self, count: int) -> None:
        self.free += count
        while self.free > 0 and self._waiting:
            most, future = self._waiting.popleft()
            if future.done():
                continue
            granted = min(self.free, most)
            self.free -= granted
            future.set_result(granted)


def _transient(error: BaseException) -> bool:
    """Worth polling again: lost connections, local timeouts and what the broker
    says may succeed when sent again. A poll is safe to resend even when its
    outcome is unknown: records it may have claimed come back when the claim
    lapses (at least once), and no record is ever acked by a poll."""
    if isinstance(error, ConnectionLostError | ClientTimeoutError):
        return True
    return isinstance(error, BrokerError) and error.retry in (
        RetryClass.RETRY,
        RetryClass.RETRY_AFTER,
        RetryClass.OUTCOME_UNKNOWN,
    )
