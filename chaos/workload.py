"""The chaos workload: concurrent felix_client clients whose every operation is recorded.

Each worker is one client (its own connections) looping until the run's stop event:
plain producers (ack after the write, so an ack carries its offset), idempotent
producers (`Client.producer`), stream readers (`stream_read` from a random offset
to the tail), subscribers (one subscription per shard, from offset 0, resumed
after it ends), cache writers and cache readers on a few keys. Every operation
becomes a `felix_broker.chaos.history.Operation` stamped on the run's one clock
(the event loop's monotonic time): invocation, completion and outcome.

Outcomes: an answer is `ok`; a broker's refusal is `refused` with its retry class
and code (the checker counts only `retry`, `retry_after` and `redirect` as
"nothing applied"); a refusal of class `outcome_unknown` (`quorum_timeout`, a
storage error after the write), a timeout, a lost connection or a failed producer
is `unknown`. Offsets are positions here: RF1 logs carry no generation-start
records, and a Quorum log's generation-start entries take no stream offset
(`felix_broker.replication.apply`).

The checked logs are `Layout.logs`: plain producers, idempotent producers,
committers, readers and subscribers use every one; conditional writers
(`publish_if` and commits with `expected_offset`, following the tail the last
answer named) and the consumer group's members write and consume the Quorum log.
An idempotent producer that ends on a batch of unknown outcome is continued as a
correct client does: a new producer with the same id and that batch's sequence
resends the same payload to the shard's owner then (`duplicate` checks it lands
once). Each group member polls (short visibility), then acks every record it got;
after the heal the group's cursor and dead letters are read (`group_cursor`).

Log keys in the history are ``stream/shard``; the checked log stream and the
cache go to one history, the in-memory stream to its own (judged by fewer rules).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal, TypeVar

from felix_broker.chaos.history import Kind, Operation, Outcome, Write
from felix_client import Client, ClientConfig, OffsetMismatchError, Producer, connect
from felix_client.errors import BrokerError, ClientError, RetryClass
from felix_client.groups import ClaimedRecord

from .fleet import NAMESPACE, TENANT, ChaosFleet

__all__ = ["GROUP", "Recorder", "Workers", "Workload", "final_logs", "log_key"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

_REQUEST_TIMEOUT = 5.0
_READ_PAGE = 200
_READ_PAGES = 5  # a read is at most this many pages (else it is not a tail read)
_PAUSE = (0.005, 0.05)  # seconds between one worker's operations
_RESENDS = 20  # producers that try one batch in doubt before it is left unknown
GROUP = "chaos-group"  # the Quorum log's consumer group
_GROUP_VISIBILITY = 3.0  # seconds a poll's claims stand
# What an operation may raise that is an outcome, not a bug of the workload.
_OUTCOMES: tuple[type[BaseException], ...] = (BrokerError, ClientError, TimeoutError, OSError)


def log_key(stream: str, shard: int) -> str:
    return f"{stream}/{shard}"


@dataclass(frozen=True, slots=True)
class Workers:
    """How many clients of each kind (per stream where it applies)."""

    producers: int = 2
    idempotent: int = 1  # per checked log
    guarded: int = 1  # conditional writers of the Quorum log
    group_members: int = 2  # members of the Quorum log's consumer group
    readers: int = 1
    subscribers: int = 1
    cache_writers: int = 2
    cache_readers: int = 2
    memory_producers: int = 1
    committers: int = 1
    # Cache keys written and read: few keys make overwrites race; the checker's
    # register rule costs gets x puts per key, so a long run wants more keys.
    cache_keys: int = 4


class Recorder:
    """The run's operations, in completion order, and the clock they share."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.operations: list[Operation] = []
        self.memory: list[Operation] = []
        self.tails: dict[str, int] = defaultdict(int)  # highest acked offset + 1 per log

    def now(self) -> float:
        return self._loop.time()

    def add(self, op: Operation, *, memory: bool = False) -> None:
        (self.memory if memory else self.operations).append(op)
        if op.kind is Kind.APPEND and op.outcome is Outcome.OK and op.offset is not None:
            self.tails[op.key] = max(self.tails[op.key], op.offset + 1)

    async def call(
        self,
        work: Callable[[], Awaitable[T]],
        make: Callable[[Outcome, float, float | None, T | None, BaseException | None], Operation],
        *,
        memory: bool = False,
    ) -> T | None:
        """Run one operation, record it, return its value (None unless ok)."""
        invoke = self.now()
        try:
            value = await work()
        except asyncio.CancelledError:
            self.add(make(Outcome.UNKNOWN, invoke, None, None, None), memory=memory)
            raise
        except _OUTCOMES as exc:
            # A refusal whose class is outcome_unknown (quorum_timeout: the write may
            # still commit; a storage error after the write) is an unknown outcome.
            refused = (
                isinstance(exc, BrokerError) and exc.retry is not RetryClass.OUTCOME_UNKNOWN
            ) or isinstance(exc, OffsetMismatchError)
            outcome = Outcome.REFUSED if refused else Outcome.UNKNOWN
            self.add(make(outcome, invoke, self.now(), None, exc), memory=memory)
            return None
        self.add(make(Outcome.OK, invoke, self.now(), value, None), memory=memory)
        return value


def _retry(exc: BaseException | None) -> str | None:
    """A refusal's retry class (what the checker reads as definite or not)."""
    return exc.retry.wire if isinstance(exc, BrokerError) else None


def _code(exc: BaseException | None) -> str | None:
    if isinstance(exc, OffsetMismatchError):
        return "offset_mismatch"  # the condition was judged: nothing written
    return exc.code_name if isinstance(exc, BrokerError) else None


class Workload:
    """The workers of one run; `run(stop)` returns once every worker has ended."""

    def __init__(
        self, fleet: ChaosFleet, recorder: Recorder, rng: random.Random, workers: Workers
    ) -> None:
        self.fleet = fleet
        self.rec = recorder
        self.layout = fleet.layout
        self.workers = workers
        self._seeds = [rng.getrandbits(32) for _ in range(64)]
        self._values = itertools.count()
        self.counts: Counter[str] = Counter()

    def value(self, client: str) -> str:
        return f"{client}-{next(self._values)}"

    async def _client(self, index: int) -> Client:
        # Every third client enters through the link interposer (the nemesis's link
        # faults reach it); the others may start at any broker.
        addrs = list(self.fleet.addrs)
        random.Random(index).shuffle(addrs)
        if index % 3 == 0:
            addrs.insert(0, self.fleet.link_addr)
        client = await self._connect(addrs)
        if client is None:
            raise RuntimeError(f"client {index} never connected")
        return client

    async def _connect(self, addrs: list[str], attempts: int = 100) -> Client | None:
        config = ClientConfig(ack_on_commit=True, request_timeout=_REQUEST_TIMEOUT)
        for _ in range(attempts):
            try:
                return await connect(
                    addrs,
                    tenant_id=TENANT,
                    token=self.fleet.token,
                    namespace=NAMESPACE,
                    ca_file=self.fleet.ca_file,
                    config=config,
                )
            except _OUTCOMES as exc:
                _log.info("cannot connect to %s yet: %s", addrs, exc)
                await asyncio.sleep(0.2)
        return None

    async def run(self, stop: asyncio.Event) -> None:
        w, layout = self.workers, self.layout
        jobs: list[Callable[[Client, str, random.Random, asyncio.Event], Awaitable[None]]] = []
        jobs += [self._producer] * w.producers
        for stream, shards in layout.logs:
            jobs += [partial(self._idempotent, log=(stream, shards))] * w.idempotent
        if layout.quorum_stream is not None:
            jobs += [self._guarded] * w.guarded
            jobs += [self._group_member] * w.group_members
        jobs += [self._reader] * w.readers
        jobs += [self._cache_writer] * w.cache_writers
        jobs += [self._cache_reader] * w.cache_readers
        jobs += [self._memory_producer] * w.memory_producers
        jobs += [self._committer] * w.committers
        subscriptions = [
            (stream, shard, False) for stream, shards in layout.logs for shard in range(shards)
        ] * w.subscribers + [(layout.memory_stream, 0, True)] * min(1, w.subscribers)

        async def worker(index: int, job: Callable[..., Awaitable[None]], *args: object) -> None:
            client = await self._client(index)
            try:
                await job(client, f"c{index}", random.Random(self._seeds[index % 64]), *args)
            finally:
                with contextlib.suppress(*_OUTCOMES):
                    await client.aclose()

        tasks = [asyncio.create_task(worker(i, job, stop)) for i, job in enumerate(jobs, start=1)]
        base = len(tasks) + 1
        tasks += [
            asyncio.create_task(worker(base + i, self._subscriber, stop, stream, shard, memory))
            for i, (stream, shard, memory) in enumerate(subscriptions)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pause(self, rng: random.Random) -> None:
        await asyncio.sleep(rng.uniform(*_PAUSE))

    # -- producers

    async def _shard_keys(self, client: Client, stream: str, shards: int) -> list[bytes]:
        """One routing key per shard of `stream`."""
        keys: dict[int, bytes] = {}
        for n in range(1000):
            key = f"k{n}".encode()
            keys.setdefault(await client.shard_for_key(stream, key), key)
            if len(keys) == shards:
                break
        return [keys[s] for s in sorted(keys)]

    async def _producer(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        await self._publish_loop(client, name, rng, stop, memory=False)

    async def _memory_producer(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        await self._publish_loop(client, name, rng, stop, memory=True)

    async def _publish_loop(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event, *, memory: bool
    ) -> None:
        logs = [(self.layout.memory_stream, 1)] if memory else self.layout.logs
        routing = {s: await self._shard_keys(client, s, n) for s, n in logs}
        while not stop.is_set():
            stream, shards = rng.choice(logs)
            keys = routing[stream]
            shard = rng.randrange(shards)
            value = self.value(name)

            def make(
                outcome: Outcome,
                invoke: float,
                complete: float | None,
                offset: int | None,
                exc: BaseException | None,
                key: str = log_key(stream, shard),
                value: str = value,
            ) -> Operation:
                return Operation(
                    client=name,
                    kind=Kind.APPEND,
                    key=key,
                    value=value,
                    offset=offset,
                    invoke=invoke,
                    complete=complete,
                    outcome=outcome,
                    retry=_retry(exc),
                    code=_code(exc),
                )

            await self.rec.call(
                partial(client.publish, stream, value.encode(), key=keys[shard]),
                make,
                memory=memory,
            )
            self.counts["append"] += 1
            await self._pause(rng)

    async def _idempotent(
        self,
        client: Client,
        name: str,
        rng: random.Random,
        stop: asyncio.Event,
        *,
        log: tuple[str, int],
    ) -> None:
        """Idempotent producers of one log, each on one shard and connected to its
        owner (a producer does not follow `not_leader`: it ends, and the next one is
        made for the owner the fleet names then). A batch whose outcome stayed
        unknown when its producer ended is resent first, by a producer continuing the
        same id from that batch's sequence, with the same payload, until it is
        answered (or `_RESENDS` producers tried)."""
        stream, shards = log
        keys = await self._shard_keys(client, stream, shards)
        producer_id: int | None = None
        sequences: dict[int, int] = {}
        doubt: tuple[int, str, int] | None = None  # (shard, value, sequence) in doubt
        tries = 0
        while not stop.is_set():
            shard = doubt[0] if doubt is not None else rng.randrange(len(keys))
            try:
                owners = await client.shard_owners(stream)
            except _OUTCOMES as exc:
                _log.info("%s: no owners: %s", name, exc)
                await asyncio.sleep(0.2)
                continue
            addr = next((o.addr for o in owners if o.shard == shard and o.addr), None)
            direct = await self._connect([addr], attempts=5) if addr else None
            if direct is None:
                await asyncio.sleep(0.2)
                continue
            try:
                producer = direct.producer(
                    stream,
                    producer_id=producer_id,
                    next_sequences=sequences if producer_id is not None else None,
                    timeout=_REQUEST_TIMEOUT,
                    resend_timeout=10.0,
                )
                doubt = await self._produce(producer, name, rng, stop, stream, shard, keys, doubt)
            finally:
                with contextlib.suppress(*_OUTCOMES):
                    await direct.aclose()
            with contextlib.suppress(RuntimeError):  # None: it never started
                producer_id, sequences = producer.producer_id, producer.next_sequences
            if doubt is None:
                tries = 0
                continue
            tries += 1
            if tries > _RESENDS or producer_id is None:
                # Given up (recorded unknown): a new producer id from here on.
                doubt, producer_id, sequences, tries = None, None, {}, 0
                continue
            sequences[doubt[0]] = doubt[2]  # the batch in doubt goes again
            await asyncio.sleep(0.2)

    async def _produce(
        self,
        producer: Producer,
        name: str,
        rng: random.Random,
        stop: asyncio.Event,
        stream: str,
        shard: int,
        keys: list[bytes],
        doubt: tuple[int, str, int] | None,
    ) -> tuple[int, str, int] | None:
        """One producer's life: the batch in doubt first (if any), then new batches,
        until the first one not acknowledged; returns it (shard, value, sequence), or
        None when the run stopped with nothing in doubt."""
        try:
            await producer.start()
        except _OUTCOMES as exc:
            _log.info("%s: producer did not start: %s", name, exc)
            await asyncio.sleep(0.2)
            return doubt
        try:
            while not stop.is_set():
                value = doubt[1] if doubt is not None else self.value(name)
                sequence = producer.next_sequences.get(shard, 0)
                failed: list[bool] = []

                def make(
                    outcome: Outcome,
                    invoke: float,
                    complete: float | None,
                    offset: int | None,
                    exc: BaseException | None,
                    value: str = value,
                    failed: list[bool] = failed,
                ) -> Operation:
                    failed.append(outcome is not Outcome.OK)
                    return Operation(
                        client=name,
                        kind=Kind.APPEND,
                        key=log_key(stream, shard),
                        value=value,
                        offset=offset,
                        invoke=invoke,
                        complete=complete,
                        outcome=outcome,
                        retry=_retry(exc),
                        code=_code(exc),
                    )

                await self.rec.call(
                    partial(producer.publish, value.encode(), key=keys[shard]), make
                )
                self.counts[f"idempotent {stream}"] += 1
                if not failed[0]:
                    self.counts[f"idempotent {stream} acknowledged"] += 1
                    if doubt is not None:
                        self.counts[f"idempotent {stream} resent, acknowledged"] += 1
                if failed[0]:
                    return (shard, value, sequence)
                doubt = None
                await self._pause(rng)
            return doubt
        finally:
            with contextlib.suppress(*_OUTCOMES, ClientError):
                await producer.aclose()

    async def _committer(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        """Atomic commits on every checked log: each appends its event and puts the
        entity's state key "last" (the entity is the shard's routing key). The
        history holds the event as the commit's one log write; the state half is
        judged by `chaos.run.commit_states` against the final logs."""
        routing = {s: await self._shard_keys(client, s, n) for s, n in self.layout.logs}
        while not stop.is_set():
            stream, shards = rng.choice(self.layout.logs)
            shard = rng.randrange(shards)
            await self._commit(client, name, stream, shard, routing[stream][shard], None)
            await self._pause(rng)

    async def _commit(
        self,
        client: Client,
        name: str,
        stream: str,
        shard: int,
        entity: bytes,
        expected: int | None,
    ) -> int | None:
        """One commit (conditional when `expected` is given); returns its offset."""
        value = self.value(name)
        tail: list[int] = []

        def make(
            outcome: Outcome,
            invoke: float,
            complete: float | None,
            offset: int | None,
            exc: BaseException | None,
            key: str = log_key(stream, shard),
            value: str = value,
        ) -> Operation:
            if isinstance(exc, OffsetMismatchError):
                tail.append(exc.tail)
            return Operation(
                client=name,
                kind=Kind.COMMIT,
                writes=[Write(key=key, value=value)],
                offset=offset,
                expected=expected,
                invoke=invoke,
                complete=complete,
                outcome=outcome,
                retry=_retry(exc),
                code=_code(exc),
            )

        offset = await self.rec.call(
            partial(
                client.commit,
                stream,
                entity,
                value.encode(),
                changes={"last": value.encode()},
                expected_offset=expected,
                timeout=_REQUEST_TIMEOUT,
            ),
            make,
        )
        self.counts["commit"] += 1
        return offset if offset is not None else (-1 - tail[0] if tail else None)

    async def _guarded(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        """Conditional writes on the Quorum log: `publish_if` or a commit with
        `expected_offset`, each at the tail this writer last learnt (an ack's offset
        + 1, or the tail an `offset_mismatch` named; unknown outcomes keep it)."""
        stream = self.layout.quorum_stream
        assert stream is not None
        shards = self.layout.quorum_shards
        keys = await self._shard_keys(client, stream, shards)
        expected = [0] * shards
        while not stop.is_set():
            shard = rng.randrange(shards)
            at = expected[shard]
            if rng.random() < 0.5:
                answer = await self._commit(client, name, stream, shard, keys[shard], at)
            else:
                answer = await self._publish_if(client, name, stream, shard, keys[shard], at)
            if answer is not None:
                expected[shard] = answer + 1 if answer >= 0 else -1 - answer
                self.counts["conditional " + ("acknowledged" if answer >= 0 else "mismatch")] += 1
            await self._pause(rng)

    async def _publish_if(
        self, client: Client, name: str, stream: str, shard: int, key: bytes, expected: int
    ) -> int | None:
        """One `publish_if`; returns its offset, -1 - tail on `offset_mismatch`, or
        None when the outcome is unknown."""
        value = self.value(name)
        tail: list[int] = []

        def make(
            outcome: Outcome,
            invoke: float,
            complete: float | None,
            offset: int | None,
            exc: BaseException | None,
            value: str = value,
        ) -> Operation:
            if isinstance(exc, OffsetMismatchError):
                tail.append(exc.tail)
            return Operation(
                client=name,
                kind=Kind.APPEND,
                key=log_key(stream, shard),
                value=value,
                offset=offset,
                expected=expected,
                invoke=invoke,
                complete=complete,
                outcome=outcome,
                retry=_retry(exc),
                code=_code(exc),
            )

        offset = await self.rec.call(
            partial(
                client.publish_if,
                stream,
                value.encode(),
                expected_offset=expected,
                key=key,
                timeout=_REQUEST_TIMEOUT,
            ),
            make,
        )
        self.counts["publish_if"] += 1
        return offset if offset is not None else (-1 - tail[0] if tail else None)

    # -- consumer groups

    async def _group_member(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        """A member of the Quorum log's consumer group: polls a shard, then acks each
        record it got, in order (a poll or ack that fails is recorded and the loop
        goes on: an unacked claim comes back once its visibility lapses)."""
        stream = self.layout.quorum_stream
        assert stream is not None
        group = client.group(stream, GROUP)
        while not stop.is_set():
            shard = rng.randrange(self.layout.quorum_shards)
            key = log_key(stream, shard)

            def polled(
                outcome: Outcome,
                invoke: float,
                complete: float | None,
                got: list[ClaimedRecord] | None,
                exc: BaseException | None,
                key: str = key,
            ) -> Operation:
                records = got or []
                return Operation(
                    client=name,
                    kind=Kind.GROUP_POLL,
                    key=key,
                    group=GROUP,
                    values=[r.payload.decode() for r in records],
                    offsets=[r.offset for r in records],
                    attempts=[r.attempts for r in records],
                    invoke=invoke,
                    complete=complete,
                    outcome=outcome,
                    retry=_retry(exc),
                    code=_code(exc),
                )

            records = await self.rec.call(
                partial(
                    group.poll,
                    shard,
                    max_records=20,
                    wait=0.5,
                    consumer=name,
                    visibility=_GROUP_VISIBILITY,
                    timeout=_REQUEST_TIMEOUT,
                ),
                polled,
            )
            self.counts["group_poll"] += 1
            self.counts["group_delivered"] += len(records or [])
            for record in records or []:
                if stop.is_set():
                    break

                def acked(
                    outcome: Outcome,
                    invoke: float,
                    complete: float | None,
                    _: None,
                    exc: BaseException | None,
                    key: str = key,
                    offset: int = record.offset,
                ) -> Operation:
                    return Operation(
                        client=name,
                        kind=Kind.GROUP_ACK,
                        key=key,
                        group=GROUP,
                        offset=offset,
                        invoke=invoke,
                        complete=complete,
                        outcome=outcome,
                        retry=_retry(exc),
                        code=_code(exc),
                    )

                await self.rec.call(
                    partial(group.ack, shard, record.offset, timeout=_REQUEST_TIMEOUT), acked
                )
                self.counts["group_ack"] += 1
            if not records:
                await self._pause(rng)

    # -- readers

    async def _reader(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            stream, shards = rng.choice(self.layout.logs)
            shard = rng.randrange(shards)
            key = log_key(stream, shard)
            start = rng.randint(0, self.rec.tails[key])

            async def read(
                stream: str = stream, shard: int = shard, start: int = start
            ) -> tuple[list[str], bool]:
                values: list[str] = []
                pages = client.stream_read(stream, start=start, shard=shard, max_records=_READ_PAGE)
                count = 0
                async for page in pages:
                    values.extend(r.payload.decode() for r in page.records)
                    count += 1
                    if count == _READ_PAGES:
                        with contextlib.suppress(*_OUTCOMES):
                            await pages.aclose()  # type: ignore[attr-defined]
                        return values, False
                return values, True

            def make(
                outcome: Outcome,
                invoke: float,
                complete: float | None,
                got: tuple[list[str], bool] | None,
                exc: BaseException | None,
                key: str = key,
                start: int = start,
            ) -> Operation:
                values, tail = got if got is not None else ([], False)
                return Operation(
                    client=name,
                    kind=Kind.READ,
                    key=key,
                    offset=start,
                    values=values,
                    tail=tail,
                    invoke=invoke,
                    complete=complete,
                    outcome=outcome,
                    retry=_retry(exc),
                    code=_code(exc),
                )

            await self.rec.call(read, make)
            self.counts["read"] += 1
            await self._pause(rng)

    async def _subscriber(
        self,
        client: Client,
        name: str,
        rng: random.Random,
        stop: asyncio.Event,
        stream: str,
        shard: int,
        memory: bool,
    ) -> None:
        """Subscriptions to one shard from offset 0, each resumed where the last
        one's deliveries ended; each subscription's life is one operation."""
        start = 0
        while not stop.is_set():
            invoke = self.rec.now()
            values: list[str] = []
            # An in-memory stream keeps a ring of recent events, not a log: its
            # subscriptions start at the live end (and offsets do not survive a
            # re-placement, so they resume there too).
            first: int | Literal["latest"] = "latest" if memory else start
            subscription = client.subscribe(stream, shard=shard, start=first)
            try:
                while not stop.is_set():
                    try:
                        event = await subscription.next(timeout=0.5)
                    except TimeoutError:
                        continue
                    values.append(event.payload.decode())
                    if event.offset is not None:
                        start = event.offset + 1
            except StopAsyncIteration:
                pass
            except _OUTCOMES as exc:
                _log.info("%s: subscription ended: %s", name, exc)
            finally:
                with contextlib.suppress(*_OUTCOMES):
                    await subscription.aclose()
            op = Operation(
                client=name,
                kind=Kind.SUBSCRIBE,
                key=log_key(stream, shard),
                offset=None if memory else (start - len(values) if values else start),
                values=values,
                invoke=invoke,
                complete=self.rec.now(),
                outcome=Outcome.OK,
            )
            self.rec.add(op, memory=memory)
            self.counts["subscription"] += 1
            self.counts["delivered"] += len(values)
            if not stop.is_set():
                await asyncio.sleep(0.2)

    # -- caches

    async def _cache_writer(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        cache = client.cache(self.layout.cache)
        while not stop.is_set():
            key = f"key-{rng.randrange(self.workers.cache_keys)}"
            value = self.value(name)

            def make(
                outcome: Outcome,
                invoke: float,
                complete: float | None,
                _: None,
                exc: BaseException | None,
                key: str = key,
                value: str = value,
            ) -> Operation:
                return Operation(
                    client=name,
                    kind=Kind.CACHE_PUT,
                    key=key,
                    value=value,
                    invoke=invoke,
                    complete=complete,
                    outcome=outcome,
                    retry=_retry(exc),
                    code=_code(exc),
                )

            await self.rec.call(
                partial(cache.put, key, value.encode(), timeout=_REQUEST_TIMEOUT),
                make,
            )
            self.counts["cache_put"] += 1
            await self._pause(rng)

    async def _cache_reader(
        self, client: Client, name: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        cache = client.cache(self.layout.cache)
        while not stop.is_set():
            key = f"key-{rng.randrange(self.workers.cache_keys)}"

            def make(
                outcome: Outcome,
                invoke: float,
                complete: float | None,
                got: bytes | None,
                exc: BaseException | None,
                key: str = key,
            ) -> Operation:
                return Operation(
                    client=name,
                    kind=Kind.CACHE_GET,
                    key=key,
                    value=got.decode() if got is not None else None,
                    invoke=invoke,
                    complete=complete,
                    outcome=outcome,
                    retry=_retry(exc),
                    code=_code(exc),
                )

            await self.rec.call(partial(cache.get, key, timeout=_REQUEST_TIMEOUT), make)
            self.counts["cache_get"] += 1
            await self._pause(rng)


async def final_logs(
    fleet: ChaosFleet, rec: Recorder, *, attempts: int = 20
) -> dict[str, str | None]:
    """After the heal: every shard's whole log, read by a fresh client (`final` ops),
    and the consumer group's cursor and dead letters on each Quorum log shard
    (`group_cursor` ops). Returns, per log shard, the committed state the
    committers wrote there (the entity key "last" of that shard's routing key)."""
    layout = fleet.layout
    workload = Workload(fleet, rec, random.Random(0), Workers())
    client = await workload._client(1)
    states: dict[str, str | None] = {}

    async def retrying(what: str, work: Callable[[], Awaitable[T]]) -> T:
        for attempt in range(attempts):
            try:
                return await work()
            except _OUTCOMES as exc:
                if attempt == attempts - 1:
                    raise RuntimeError(f"{what}: {exc}") from exc
                await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    try:
        routing = {s: await workload._shard_keys(client, s, n) for s, n in layout.logs}
        for stream, shard in [(s, i) for s, n in layout.logs for i in range(n)]:
            for attempt in range(attempts):
                invoke = rec.now()
                try:
                    values: list[str] = []
                    times: list[int] = []
                    async for page in client.stream_read(
                        stream, start=0, shard=shard, max_records=1000
                    ):
                        values.extend(r.payload.decode() for r in page.records)
                        times.extend(r.timestamp_micros for r in page.records)
                    break
                except _OUTCOMES as exc:
                    if attempt == attempts - 1:
                        raise RuntimeError(f"final read of {stream}/{shard}: {exc}") from exc
                    await asyncio.sleep(0.5)
            op = Operation(
                client="final",
                kind=Kind.FINAL,
                key=log_key(stream, shard),
                values=values,
                times=times,
                invoke=invoke,
                complete=rec.now(),
                outcome=Outcome.OK,
            )
            rec.add(op)
            entry = await retrying(
                f"state of {stream}/{shard}",
                partial(client.state_get, stream, routing[stream][shard], "last"),
            )
            states[log_key(stream, shard)] = (
                entry.value.decode() if entry.value is not None else None
            )
            if stream != layout.quorum_stream:
                continue  # the consumer group reads the Quorum log only
            group = client.group(stream, GROUP)
            invoke = rec.now()
            state = await retrying(
                f"group cursor of {stream}/{shard}",
                partial(group.describe, shard, timeout=_REQUEST_TIMEOUT),
            )
            dead = await retrying(
                f"dead letters of {stream}/{shard}",
                partial(group.dead_letters, shard, timeout=_REQUEST_TIMEOUT),
            )
            op = Operation(
                client="final",
                kind=Kind.GROUP_CURSOR,
                key=log_key(stream, shard),
                group=GROUP,
                offset=state.committed,
                offsets=sorted(dead),
                invoke=invoke,
                complete=rec.now(),
                outcome=Outcome.OK,
            )
            rec.add(op)
        # The in-memory stream has no log to read (stream_read refuses it): its final
        # is recorded empty, and none of the rules judged on it reads the final.
        op = Operation(
            client="final",
            kind=Kind.FINAL,
            key=log_key(layout.memory_stream, 0),
            invoke=rec.now(),
            complete=rec.now(),
            outcome=Outcome.OK,
        )
        rec.add(op, memory=True)
    finally:
        with contextlib.suppress(*_OUTCOMES):
            await client.aclose()
    return states
