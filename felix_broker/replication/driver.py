"""The adapter that runs one shard's replication core in a broker.

`ReplicaDriver` feeds the sans-IO core (`core.Replica`) and carries out its
effects, in order:

- `Send`: onto the peer's outbox, drained in order by one sender task per peer
  through the broker-to-broker channel (a `Sender`, normally `peer_sender`:
  pipelined over the mTLS `PeerDialer`). The outbox is bounded in messages
  (`outbox_items`) and bytes (`outbox_bytes`, payload bytes of ships); a message
  past either bound is dropped and counted (`dropped`): the core resends
  unanswered ships and fences, so a drop costs time, never a record. A send that
  fails (peer unreachable) is dropped the same way. A `ShipOk` queued behind
  another of the same generation, with nothing between them, merges into it
  (both say how far the follower holds the log; the leader keeps the larger),
  so a slow link carries one answer per burst, not one per ship and fsync.
- `WriteRecords`: onto the replica's disk (`ReplicaDisk`), then the sync task
  fsyncs (one fsync covers every write before it: group commit) and tells the
  core `synced(length)`. A truncation during an fsync caps the length reported.
- `Truncate` / `PersistBallot`: synchronous, fsynced before the next effect.
- `Acked` / `Refused`: resolve the client write waiting in `append`. With an
  `Applier` (a stream shard's storage, `apply.StreamApplier`), every entry below
  the replica's commit mark is applied to it in log order by the apply task, on
  leader and followers alike, and an acknowledgement waits for its entry to be
  applied (it then carries the stream offset). Once applied, the core is told
  (`applied`), so what is applied, committed and durable leaves its memory.
- `ShipStored`: the records are read back from the disk (the core no longer
  holds them in memory) and sent as an ordinary ship, like `Send`.
- `CompactLog`: noted; after its next fsync the sync task rewrites the file
  from that floor (`ReplicaDisk.compact`, at most once per `compact_every`
  records), under the lock and off the event loop's thread.
- `PromotionRefused` / `Halted`: kept (`promotion_refused`, `halted`) and passed
  to `on_event` for the fleet (the shard stays unavailable).

Every input (client append, peer message, fsync completion, tick, promotion,
lease signal) runs the core and its effects under one lock, so effects are
carried out in the order the core produced them. Ticks come from a timer every
`tick_ms` (retransmissions and `quorum_timeout`). Time is the monotonic clock in
milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from felix_common.fleet import ShardId
from felix_wire.errors import ErrorCode, RetryClass

from .core import (
    Acked,
    CompactLog,
    Config,
    Effect,
    Entry,
    Halted,
    Message,
    PersistBallot,
    PromotionRefused,
    ReadResult,
    Refused,
    Replica,
    Send,
    Ship,
    ShipOk,
    ShipStored,
    Truncate,
    WriteRecords,
)
from .disk import ReplicaDisk
from .wire import WireMessage, to_wire

__all__ = ["Applier", "ReplicaDriver", "ReplicationRefusedError", "Sender", "Written"]

_log = logging.getLogger(__name__)


class Sender(Protocol):
    """Sends one peer message to a node, in order (raises when it cannot: the message
    is dropped); `more`: messages are queued behind it (worth pipelining)."""

    def __call__(
        self, node_id: str, message: WireMessage, more: bool = False
    ) -> Awaitable[None]: ...


class Applier(Protocol):
    """Where committed entries go (a stream shard's storage). `tails` (when given)
    gets, per entry, the stream tail before it: where `cut` would start."""

    def applied_entries(
        self, entries: Sequence[Entry], records_below: int, tails: list[int] | None = None
    ) -> int: ...

    def records_of(self, entry: Entry) -> int: ...

    async def apply(
        self, entries: Sequence[Entry], tails: list[int] | None = None
    ) -> list[int | None]: ...

    async def cut(self, records: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Written:
    """A committed client write: where it is in the replication log, at which
    generation, and (with an applier) the stream offset of its first record."""

    generation: int
    first_offset: int
    count: int
    stream_offset: int | None = None


class ReplicationRefusedError(Exception):
    """A write answered without an acknowledgement: `code` and `retry` as the client
    sees them (`outcome_unknown` when the record may still commit)."""

    def __init__(
        self,
        code: ErrorCode,
        retry: RetryClass,
        reason: str | None = None,
        *,
        message: str | None = None,
    ) -> None:
        super().__init__(message or code.wire + (f"/{reason}" if reason else ""))
        self.code = code
        self.retry = retry
        self.reason = reason


@dataclass(slots=True)
class _Outbox:
    """A peer's messages waiting to be sent, oldest first (core messages: the last
    `ShipOk` may still merge with a newer one)."""

    items: deque[Message]
    ready: asyncio.Event
    bytes: int = 0


def _weight(message: Message) -> int:
    return sum(len(e.payload) for e in message.entries) if isinstance(message, Ship) else 0


class ReplicaDriver:
    def __init__(
        self,
        shard: ShardId,
        replica: Replica,
        disk: ReplicaDisk,
        send: Sender,
        *,
        tick_ms: int | None = None,
        outbox_items: int = 256,
        outbox_bytes: int = 8 * 1024 * 1024,
        on_event: Callable[[ShardId, Effect], None] | None = None,
        applier: Applier | None = None,
    ) -> None:
        self.shard = shard
        self.replica = replica
        self._disk = disk
        self._send = send
        self._tick_ms = tick_ms or max(10, replica.config.retransmit_ms // 2)
        self._outbox_items = outbox_items
        self._outbox_bytes = outbox_bytes
        self._on_event = on_event
        self._lock = asyncio.Lock()
        self._want_sync = asyncio.Event()
        self._cut: int | None = None  # the shortest truncation during the running fsync
        self._outboxes: dict[str, _Outbox] = {}
        self._waiting: dict[int, asyncio.Future[Written]] = {}
        self._applier = applier
        self._acked: dict[int, Acked] = {}  # committed, waiting to be applied
        self._commit_moved = asyncio.Event()
        # (generation, its first mark seen by `refusal`): readers wait until applied.
        self._first_mark: tuple[int, int] | None = None
        self.applied = replica.base
        # The stream tail before each applied entry at or above the commit mark (by
        # replication offset): where the stream log is cut back to when a truncation
        # takes entries already applied (a former Leader-consistency leader's).
        self._tails: dict[int, int] = {}
        # Held by the apply task while it applies, and by a cut of the stream log.
        self._apply_lock = asyncio.Lock()
        if applier is not None:
            tails: list[int] = []
            self.applied += applier.applied_entries(replica.log, disk.weight, tails)
            self._tails = {replica.base + i: tail for i, tail in enumerate(tails)}
        self._compact_to = 0  # the floor CompactLog allowed, for the sync task
        self._next_request = 1
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped = 0
        self.promotion_refused: PromotionRefused | None = None
        self.halted: Halted | None = None
        self.failure: BaseException | None = None
        self._closed = False
        self._effects: dict[type, Callable[[Any], None]] = {
            Send: self._do_send,
            WriteRecords: self._do_write,
            Truncate: self._do_truncate,
            PersistBallot: self._do_ballot,
            Acked: self._do_acked,
            Refused: self._do_refused,
            PromotionRefused: self._do_promotion_refused,
            Halted: self._do_halted,
            ShipStored: self._do_ship_stored,
            CompactLog: self._do_compact,
        }
        for effect in replica.applied(self.applied):
            self._effects[type(effect)](effect)

    @classmethod
    def open(
        cls,
        shard: ShardId,
        node_id: str,
        replicas: Sequence[str],
        disk: ReplicaDisk,
        send: Sender,
        *,
        config: Config | None = None,
        **options: Any,
    ) -> ReplicaDriver:
        """A driver for the replica `disk` holds (recovered: a follower at its ballot)."""
        replica = Replica.recover(node_id, replicas, disk.recover(), config)
        return cls(shard, replica, disk, send, **options)

    # -- life

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for peer in self.replica.followers:
            box = _Outbox(deque(), asyncio.Event())
            self._outboxes[peer] = box
            self._tasks.append(loop.create_task(self._drain(peer, box)))
        self._tasks.append(loop.create_task(self._syncer()))
        if self._applier is not None:
            self._tasks.append(loop.create_task(self._apply_committed()))
        self._tasks.append(loop.create_task(self._ticker()))

    async def close(self) -> None:
        self._closed = True  # inputs from now on are refused: the disk is going
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(
                    ReplicationRefusedError(
                        ErrorCode.LEADERSHIP_LOST, RetryClass.OUTCOME_UNKNOWN, "stopping"
                    )
                )
        self._waiting.clear()
        self._disk.close()

    # -- inputs

    async def append(self, payloads: Sequence[bytes]) -> Written:
        """A client's Quorum write: returns once a majority holds it durably; raises
        ReplicationRefusedError (not_leader, fenced, quorum_timeout, leadership_lost)."""
        request_id = self._next_request
        self._next_request += 1
        future: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            await self._run(lambda now: self.replica.append(request_id, payloads, now))
            return await future
        finally:
            self._waiting.pop(request_id, None)

    async def promote(self, generation: int) -> None:
        """The fleet made this replica leader at `generation` (a new assignment)."""
        self.promotion_refused = None
        await self._run(lambda now: self.replica.promote(generation, now))

    async def receive(self, message: Message) -> None:
        await self._run(lambda now: self.replica.receive(message, now))

    async def lease_expired(self) -> None:
        await self._run(lambda _now: self.replica.lease_expired())

    async def lease_renewed(self) -> None:
        await self._run(lambda _now: self.replica.lease_renewed())

    def read(self, offset: int, limit: int) -> ReadResult:
        return self.replica.read(offset, limit)

    def refusal(self) -> tuple[ErrorCode, str | None] | None:
        """Why readers of this shard are refused here (not_leader, fenced, not_ready
        while a just-promoted leader settles, or until its stream log has caught up
        with the first mark of its generation), or None when they are served.

        Only the generation's first mark gates readers: every write acknowledged
        before it (by this leader's predecessors) lies below it, and this leader
        acknowledges a write only once its stream log holds it (`_do_acked`), so a
        stream log behind a later mark lacks only writes nobody was told of yet.
        Gating on the moving mark refused readers at random under steady writes.
        A stopped replica (a disk failure) serves nobody: its writes are refused."""
        if self.failure is not None or self._closed:
            return ErrorCode.SHARD_UNAVAILABLE, "owner_unavailable"
        result = self.replica.read(0, 0)
        if result.code is not None:
            return result.code, result.reason
        if self._applier is None:
            return None
        generation, mark = self.replica.generation, self.replica.mark or 0
        if self._first_mark is None or self._first_mark[0] != generation:
            self._first_mark = (generation, mark)
        if self.applied < self._first_mark[1]:
            return ErrorCode.SHARD_UNAVAILABLE, "not_ready"
        return None

    # -- carrying out effects

    async def _run(self, step: Callable[[int], list[Effect]]) -> None:
        if self.failure is not None or self._closed:  # nothing written: retry elsewhere
            raise ReplicationRefusedError(
                ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY, "owner_unavailable"
            )
        async with self._lock:
            effects = step(int(time.monotonic() * 1000))
            try:
                for effect in effects:
                    if isinstance(effect, Truncate) and effect.length < self.applied:
                        await self._cut_stream(effect.length)
                    self._effects[type(effect)](effect)
                if self.replica.apply_to > self.applied:
                    self._commit_moved.set()
            except Exception as exc:  # a disk failure: this replica stops, loudly
                self._stop(exc)
                raise ReplicationRefusedError(
                    ErrorCode.LEADERSHIP_LOST, RetryClass.OUTCOME_UNKNOWN
                ) from exc

    async def _cut_stream(self, length: int) -> None:
        """Before the replication log is cut to `length`: cut the stream log back to
        where entry `length` started (entries above the commit mark that a former
        Leader-consistency leader applied). The stream log first, so a crash between
        the two leaves a stream log that is a prefix of what the replication log
        gives, which the restart walk accepts."""
        applier = self._applier
        assert applier is not None
        async with self._apply_lock:
            if length >= self.applied:
                return
            tail = self._tails.get(length)
            if tail is None:  # impossible: every applied entry above the mark has its tail
                raise RuntimeError(f"no stream tail known for entry {length}")
            await applier.cut(tail)
            _log.warning(
                "%s: cut %d applied entries the new leader does not have (stream log to %d)",
                self.shard,
                self.applied - length,
                tail,
            )
            self._tails = {at: t for at, t in self._tails.items() if at < length}
            self.applied = length
            for request_id, acked in list(self._acked.items()):
                if acked.first_offset + acked.count > length:
                    del self._acked[request_id]
                    future = self._waiting.get(request_id)
                    if future is not None and not future.done():
                        future.set_exception(
                            ReplicationRefusedError(
                                ErrorCode.LEADERSHIP_LOST, RetryClass.OUTCOME_UNKNOWN
                            )
                        )

    def _stop(self, exc: BaseException) -> None:
        _log.error("replica of %s stopped: %s", self.shard, exc)
        self.failure = exc
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(
                    ReplicationRefusedError(ErrorCode.LEADERSHIP_LOST, RetryClass.OUTCOME_UNKNOWN)
                )

    def _do_send(self, effect: Send) -> None:
        box = self._outboxes.get(effect.to)
        message = effect.message
        if box is None:
            self.dropped += 1
            return
        last = box.items[-1] if box.items else None
        if (
            isinstance(message, ShipOk)
            and isinstance(last, ShipOk)
            and last.generation == message.generation
        ):
            box.items[-1] = ShipOk(
                message.generation,
                message.sender,
                max(last.durable, message.durable),
                max(last.matched, message.matched),
            )
            return
        weight = _weight(message)
        if len(box.items) >= self._outbox_items or box.bytes + weight > self._outbox_bytes:
            self.dropped += 1
            return
        box.bytes += weight
        box.items.append(message)
        box.ready.set()

    def outbox(self, peer: str) -> tuple[Message, ...]:
        """The messages waiting for `peer`, oldest first (inspection and tests)."""
        box = self._outboxes.get(peer)
        return tuple(box.items) if box is not None else ()

    def _do_write(self, effect: WriteRecords) -> None:
        self._disk.write(effect.offset, effect.entries)
        self._want_sync.set()

    def _do_truncate(self, effect: Truncate) -> None:
        self._disk.truncate(effect.length)
        self._cut = effect.length if self._cut is None else min(self._cut, effect.length)

    def _do_ballot(self, effect: PersistBallot) -> None:
        self._disk.persist_ballot(effect.generation, effect.leader)

    def _do_acked(self, effect: Acked) -> None:
        if self._applier is not None and self.applied < effect.first_offset + effect.count:
            self._acked[effect.request_id] = effect
            return
        future = self._waiting.get(effect.request_id)
        if future is not None and not future.done():
            future.set_result(Written(effect.generation, effect.first_offset, effect.count))

    def _do_refused(self, effect: Refused) -> None:
        future = self._waiting.get(effect.request_id)
        if future is not None and not future.done():
            message = None
            if effect.code is ErrorCode.QUORUM_TIMEOUT:
                seconds = self.replica.config.quorum_timeout_ms / 1000
                message = (
                    f"the batch is durable here but did not reach a majority within {seconds:g}s"
                )
            future.set_exception(
                ReplicationRefusedError(effect.code, effect.retry, effect.reason, message=message)
            )

    def _do_promotion_refused(self, effect: PromotionRefused) -> None:
        self.promotion_refused = effect
        _log.warning(
            "%s: promotion at %d refused, ahead: %s", self.shard, effect.generation, effect.ahead
        )
        if self._on_event is not None:
            self._on_event(self.shard, effect)

    def _do_ship_stored(self, effect: ShipStored) -> None:
        previous, entries = self._disk.read(effect.offset, effect.count)
        ship = Ship(
            effect.generation,
            effect.leader,
            effect.offset,
            previous,
            tuple(entries),
            effect.commit,
            effect.compacted,
        )
        self._do_send(Send(effect.to, ship))

    def _do_compact(self, effect: CompactLog) -> None:
        self._compact_to = max(self._compact_to, effect.length)
        self._want_sync.set()

    def _do_halted(self, effect: Halted) -> None:
        self.halted = effect
        _log.error("%s: replica halted at offset %d", self.shard, effect.offset)
        if self._on_event is not None:
            self._on_event(self.shard, effect)

    # -- tasks

    async def _drain(self, peer: str, box: _Outbox) -> None:
        while True:
            while not box.items:
                box.ready.clear()
                await box.ready.wait()
            message = box.items.popleft()
            box.bytes -= _weight(message)
            try:
                await self._send(peer, to_wire(self.shard, message), bool(box.items))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # unreachable or slow: the core resends
                self.dropped += 1
                _log.debug("%s: send to %s dropped: %s", self.shard, peer, exc)

    async def _syncer(self) -> None:
        while True:
            await self._want_sync.wait()
            self._want_sync.clear()
            self._cut = None
            try:
                length = await self._disk.sync()
            except Exception as exc:
                self._stop(exc)
                return
            cut, self._cut = self._cut, None
            if cut is not None:
                length = min(length, cut)
            with contextlib.suppress(ReplicationRefusedError):
                await self._run(functools.partial(self._synced, length))
            if self._compact_to - self._disk.base >= self._disk.compact_every:
                try:
                    async with self._lock:
                        await asyncio.to_thread(self._disk.compact, self._compact_to, self._weigh)
                except Exception as exc:
                    self._stop(exc)
                    return

    def _weigh(self, entry: Entry) -> int:
        return self._applier.records_of(entry) if self._applier is not None else 0

    async def _apply_committed(self) -> None:
        applier = self._applier
        assert applier is not None
        while True:
            await self._commit_moved.wait()
            self._commit_moved.clear()
            while self.replica.apply_to > self.applied:
                async with self._apply_lock:
                    low, high = self.applied, self.replica.apply_to
                    if high <= low:
                        continue  # a cut moved `applied` back meanwhile
                    tails: list[int] = []
                    try:
                        bases = await applier.apply(self.replica.entries(low, high), tails)
                    except Exception as exc:  # the stream log failed: this replica stops
                        self._stop(exc)
                        return
                    self.applied = high
                    commit = self.replica.commit
                    self._tails = {at: t for at, t in self._tails.items() if at >= commit}
                    for offset, tail in enumerate(tails, low):
                        if offset >= commit:
                            self._tails[offset] = tail
                with contextlib.suppress(ReplicationRefusedError):
                    await self._run(functools.partial(self._applied, high))
                at = dict(zip(range(low, high), bases, strict=True))
                for request_id, acked in list(self._acked.items()):
                    if acked.first_offset + acked.count <= high:
                        del self._acked[request_id]
                        future = self._waiting.get(request_id)
                        if future is not None and not future.done():
                            base = at.get(acked.first_offset)
                            future.set_result(
                                Written(acked.generation, acked.first_offset, acked.count, base)
                            )

    def _synced(self, length: int, _now: int) -> list[Effect]:
        return self.replica.synced(length)

    def _applied(self, length: int, _now: int) -> list[Effect]:
        return self.replica.applied(length)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self._tick_ms / 1000)
            try:
                await self._run(self.replica.tick)
            except ReplicationRefusedError:
                return
