"""The consumer-group service: queues over durable streams (§5.8, Q1-Q17).

Served only with durable storage and only for durable streams; a standalone
broker leads every shard it serves, so a request naming a shard the stream
does not have, or an in-memory stream, is refused and never answered with an
empty batch (Q1).

The state of one group on one shard is a `GroupState` (group_state.py, the
sans-IO core: claims, cursor, dead letters). This module admits requests,
reads payloads from the stream's log, appends the core's durable changes to
the shard's group log (group_records.py) and waits for them to be durable
before it answers, so an acknowledged settle survives a crash.

Requests are concurrent handlers (session/dispatch.py): each runs as its own
task under the connection's request bound, so a long poll holds back nothing
else on its stream. Every answer carries the request's
request_id; settles are answered with cache_ok (what the clients accept).

Two requests usually need no task (the dispatcher's `ready` path, taken while
the connection has a free request slot):

- a poll of a group already in memory that finds records to hand out at once
  and changes nothing durable (claims live in memory; only a group's first poll,
  or a poll that dead-letters, writes) is answered by the stream's reader; if
  that answer cannot be written, its claims are handed back as before;
- an ack (fsync modes `none` and `periodic`, where durable means written) joins
  the loop pass's group-log commit, and its answer is queued for the commit:
  once the pass's one append has written every change of the pass, the answers
  of all those acks go out, per stream, in one write by one writer task. An ack
  is still never answered before its change is written. Bound: at most
  `max_inflight_requests_per_conn` such answers are held per stream (owed or
  being written); past it, an ack takes the ordinary path (a task under the
  request bound). Under `on_commit` acks always take the ordinary path (each
  waits for its fsync).

Long polls wait on a per-shard signal fired by the engine once appended
records are durable (`Shard.listeners`), and by every settle, nack, redrive,
seek or delete on the shard; they also wake at the next claim deadline, since
a lapse makes a record owed.

Bounds: a poll hands out at most 1000 records and about 4 MiB of payload (one
bigger record still goes alone); waits at most FELIX_GROUP_MAX_WAIT_MS; at most
`GroupServiceLimits.max_groups_per_shard` groups are kept per shard (a poll
that would create one more is refused limit_exceeded). A group's in-memory
state is dropped after `idle_ms` (10 minutes, or twice the visibility timeout
if longer) without requests and with no standing claim; its cursor and dead
letters stay in the group log. The group log is compacted (the live state
copied to its tail, whole older segments deleted) once it is bigger than
`compact_min_bytes` and four times the live state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import Counter

from felix_broker.catalog import Catalog, StreamSpec
from felix_broker.clock import wall_us
from felix_broker.config import BrokerConfig, FsyncMode
from felix_broker.groups.records import (
    GroupChange,
    GroupDurable,
    Kind,
    apply_change,
    decode_change,
    encode_change,
    snapshot_changes,
)
from felix_broker.groups.state import (
    GroupLimits,
    GroupRefusedError,
    GroupState,
    Member,
    Offer,
    SeekTarget,
)
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.driver import ReplicationRefusedError
from felix_broker.session.context import RequestContext, StreamIO
from felix_broker.session.dispatch import DispatchTable, Handler, ReadyAnswer
from felix_broker.session.protocol import StreamProtocol
from felix_broker.storage import Log, LogConfig, Retention, StorageError
from felix_broker.storage.format import Record
from felix_broker.storage.paths import log_dir
from felix_broker.streams.engine import Engine, Shard
from felix_common.permissions import Action, group_object
from felix_transport import StreamClosedError
from felix_transport.events import ConnectionClosedError
from felix_wire.errors import ErrorCode, RetryClass
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
    GroupRecord,
    GroupRecords,
    GroupRedrive,
    GroupSeek,
    StartOffset,
)
from felix_wire.names import name_problem

if TYPE_CHECKING:
    from felix_broker.replication.groups import GroupReplication

__all__ = ["GROUP_FEATURES", "GroupService", "GroupServiceLimits"]

_log = logging.getLogger(__name__)

GroupRequest = (
    GroupPoll
    | GroupAck
    | GroupNack
    | GroupExtend
    | GroupDeadLetter
    | GroupDeadLetters
    | GroupDiscard
    | GroupRedrive
    | GroupSeek
    | GroupDescribe
    | GroupDelete
)
R = TypeVar("R", bound=GroupRequest)

# Every part of this is served wherever the service runs (it runs only with durable
# storage), so all of it is advertised together.
GROUP_FEATURES = int(
    Feature.FEATURE_CONSUMER_GROUP
    | Feature.FEATURE_GROUP_DEAD_LETTERS
    | Feature.FEATURE_GROUP_ADMIN
    | Feature.FEATURE_GROUP_CLAIM_CONTROL
    | Feature.FEATURE_GROUP_CONSUMER
    | Feature.FEATURE_GROUP_SKIPPED
    | Feature.FEATURE_GROUP_PUBLISHER
)

POLL_MAX_RECORDS = 1000  # Q3
POLL_MAX_BYTES = 4 * 1024 * 1024  # Q3
MAX_CONSUMER_BYTES = 128  # Q16
_MIB = 1024 * 1024
_READ_BATCH = 4096


@dataclass(frozen=True, slots=True)
class GroupServiceLimits:
    """The service's own bounds and upkeep knobs (the protocol's are in config)."""

    idle_ms: int = 600_000
    """Idle time before a group's in-memory state is dropped (at least 2 x visibility)."""
    max_groups_per_shard: int = 10_000
    upkeep_interval: float = 1.0
    """Seconds between passes that drop idle states and compact group logs."""
    fsync_interval: float = 0.1
    """Seconds between fsyncs of the group logs in fsync mode `periodic`."""
    segment_bytes: int = _MIB
    compact_min_bytes: int = 4 * _MIB


class _Refused(Exception):
    def __init__(self, code: ErrorCode, text: str, retry: RetryClass | None = None) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.retry = retry


class _StreamAnswers:
    """Answers owed on one client stream by acks taken without a task: frames
    waiting for their writer, and how many are owed or being written (the bound)."""

    __slots__ = ("frames", "held", "owed", "writing")

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.held = 0
        self.writing = False
        # One future per owed answer, settled once it is written (or dropped): the
        # stream's end waits for them (StreamIO.owe).
        self.owed: list[asyncio.Future[None]] = []

    def settle(self, count: int) -> None:
        """`count` more owed answers went out or were dropped (which futures settle does
        not matter: the stream's end waits for all of them)."""
        done, self.owed = self.owed[:count], self.owed[count:]
        for answer in done:
            if not answer.done():
                answer.set_result(None)


@dataclass(frozen=True, slots=True)
class _Owed:
    """One ack taken without a task: whom to answer once the commit is written."""

    ctx: RequestContext
    answers: _StreamAnswers
    request_id: int
    handed: float | None
    started: float


class _Signal:
    """Wakes every waiter at once; each wait sees only fires after it started."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._event.wait()


@dataclass(slots=True)
class _ShardGroups:
    """Every group of one stream shard: durable state, live states, the group log."""

    stream: Shard
    log: Log
    durable: dict[str, GroupDurable]
    live: dict[str, GroupState] = field(default_factory=dict)
    last_used: dict[str, int] = field(default_factory=dict)
    signal: _Signal = field(default_factory=_Signal)
    last_stamp_us: int = 0
    compacting: bool = False
    # The shard moved away (release_shard): a poll waiting on it answers empty.
    released: bool = False
    # Changes made this loop pass, appended together by one commit (group commit),
    # and their writers' futures: each gets the last offset, or the append's error.
    pending: list[GroupChange] = field(default_factory=list)
    committers: list[asyncio.Future[int]] = field(default_factory=list)
    # Acks taken without a task, answered once this pass's commit is written.
    settled: list[_Owed] = field(default_factory=list)
    # A Quorum shard's committed state: what its group log holds (the changes its
    # replication applied), never the leader's in-memory settles ahead of the mark
    # (`durable` may hold those). Compaction copies this one. None: not replicated.
    committed: dict[str, GroupDurable] | None = None
    # A Quorum shard's replicated writes in flight, and whether one of them failed:
    # its settle is in the in-memory states already but may never commit, so they
    # are stale until rebuilt from `committed` (GroupService._durable).
    replicating: int = 0
    stale: bool = False

    @property
    def tail(self) -> int:
        log = self.stream.log
        assert log is not None
        return log.readable_offset

    @property
    def log_start(self) -> int:
        log = self.stream.log
        assert log is not None
        return log.start_offset


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class GroupService:
    """Every consumer group this broker serves. `start()` replays the group logs;
    `close()` stops upkeep and closes them."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        catalog: Catalog,
        engine: Engine,
        metrics: BrokerMetrics | None = None,
        limits: GroupServiceLimits | None = None,
    ) -> None:
        assert config.durable_enabled, "consumer groups need durable storage"
        self._config = config
        self._metrics = metrics
        self._fsync = os.fsync if metrics is None else metrics.timed_fsync()
        # (request type, outcome) -> its counter child; outcomes are ok or error codes.
        self._request_counts: dict[tuple[type[Any], str], Counter] = {}
        self._catalog = catalog
        self._engine = engine
        self.limits = limits or GroupServiceLimits()
        self.group_limits = GroupLimits(
            visibility_ms=config.group_visibility_timeout_ms,
            max_visibility_ms=config.effective_group_max_visibility_ms,
            max_attempts=config.group_max_attempts,
            max_in_flight=config.group_max_in_flight,
            window=max(100_000, 10 * config.group_max_in_flight),
        )
        self._shards: dict[tuple[str, str, str, int], _ShardGroups] = {}
        self._connections: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self._next_connection = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # A fleet member's Quorum streams: their group changes go through the shard's
        # replication log, applied to the group log by replication/groups.py.
        self.replication: GroupReplication | None = None
        self._answers: weakref.WeakKeyDictionary[StreamIO, _StreamAnswers] = (
            weakref.WeakKeyDictionary()
        )
        self._ack_timer = None if metrics is None else metrics.request_timer("group_ack")
        self._owed_bound = max(1, config.max_inflight_requests_per_conn)
        self._acks_deferred = config.durable_fsync_mode is not FsyncMode.ON_COMMIT

    @property
    def features(self) -> int:
        return GROUP_FEATURES

    @property
    def idle_ms(self) -> int:
        return max(self.limits.idle_ms, 2 * self._config.group_visibility_timeout_ms)

    def committed_offsets(self) -> dict[tuple[str, str, str, int], int]:
        """Per stream shard with a group log: one past the last change a reader may see.

        The group log holds both cursor and dead-letter changes (one log per
        shard), so ``/backup/offsets`` names it ``group_cursors``.
        """
        return {key: groups.log.readable_offset for key, groups in self._shards.items()}

    # -- life cycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Replay every group log on disk, then start upkeep. A shard without one is
        opened on its first group request (so no stream log is opened just for this)."""
        for spec in self._catalog.streams():
            if spec.durable:
                for index in range(spec.shards):
                    if self._directory(spec, index).exists():
                        await asyncio.to_thread(self._shard_groups, spec, index)
        self._run(self._every(self.limits.upkeep_interval, self._upkeep), "group-upkeep")
        if self._config.durable_fsync_mode is FsyncMode.PERIODIC:
            self._run(self._every(self.limits.fsync_interval, self._sync_pass), "group-fsync")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for groups in self._shards.values():
            self._commit(groups)  # what a settle of this pass changed is not lost
            with contextlib.suppress(ValueError):
                groups.stream.listeners.remove(groups.signal.fire)
            try:
                await groups.log.aclose()
            except StorageError as exc:
                _log.error("closing a group log failed: %s", exc)
        self._shards.clear()

    async def release_shard(self, tenant_id: str, namespace: str, stream: str, index: int) -> None:
        """Forget one stream shard's groups and close its group log (the shard moved,
        or a move's copy is about to replace its files); the next group request opens
        it from disk again. Waiting polls of that shard answer empty (as at close)."""
        groups = self._shards.pop((tenant_id, namespace, stream, index), None)
        if groups is None:
            return
        self._commit(groups)
        groups.released = True
        groups.signal.fire()
        with contextlib.suppress(ValueError):
            groups.stream.listeners.remove(groups.signal.fire)
        try:
            await groups.log.aclose()
        except StorageError as exc:
            _log.error("closing a moved group log failed: %s", exc)

    def failed_logs(self) -> int:
        """Open group logs in the failed state (they take no writes until restart)."""
        return sum(1 for groups in self._shards.values() if groups.log.failed)

    def _run(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _every(self, interval: float, action: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await action()
            except Exception:
                _log.exception("consumer group upkeep failed")

    async def _upkeep(self) -> None:
        self.evict_idle(_now_ms())
        for groups in list(self._shards.values()):
            if self._wants_compaction(groups):
                await self.compact(groups)

    async def _sync_pass(self) -> None:
        logs = [g.log for g in self._shards.values() if g.log.needs_sync]
        await asyncio.gather(*(log.sync() for log in logs), return_exceptions=True)

    def evict_idle(self, now: int) -> int:
        """Drop in-memory states idle for `idle_ms` with nothing standing (Q9)."""
        dropped = 0
        for groups in self._shards.values():
            for name, state in list(groups.live.items()):
                if not state.busy and now - groups.last_used.get(name, now) >= self.idle_ms:
                    del groups.live[name]
                    groups.last_used.pop(name, None)
                    dropped += 1
        return dropped

    # -- shards ---------------------------------------------------------------------

    def _directory(self, spec: StreamSpec, index: int) -> Path:
        root = self._config.durable_storage_dir
        assert root is not None
        return log_dir(root, "groups", spec.tenant_id, spec.namespace, spec.name, index)

    def _shard_groups(self, spec: StreamSpec, index: int) -> _ShardGroups:
        """The shard's groups, its group log opened and replayed on first use."""
        key = (spec.tenant_id, spec.namespace, spec.name, index)
        found = self._shards.get(key)
        if found is not None:
            return found
        # The stream's shard first: if it cannot be had, no group log was opened
        # (nothing to close on that path).
        stream = self._engine.shard(spec, index)
        log = Log.open(
            self._directory(spec, index),
            LogConfig(
                segment_bytes=self.limits.segment_bytes,
                fsync_mode=self._config.durable_fsync_mode,
                fsync_interval=self.limits.fsync_interval,
            ),
            fsync=self._fsync,
        )
        durable: dict[str, GroupDurable] = {}
        last_stamp = 0
        offset = log.start_offset
        try:
            while offset < log.readable_offset:
                records = log.read(offset, max_records=_READ_BATCH, max_bytes=16 * _MIB)
                if not records:
                    break
                for record in records:
                    apply_change(durable, decode_change(record.payload))
                    last_stamp = max(last_stamp, record.timestamp_us)
                offset = records[-1].offset + 1
        except BaseException:
            log.close()
            raise
        groups = _ShardGroups(stream, log, durable, last_stamp_us=last_stamp)
        if self.replication is not None and spec.replicated:
            groups.committed = _copied(durable)
        stream.listeners.append(groups.signal.fire)
        self._shards[key] = groups
        return groups

    def _state(self, groups: _ShardGroups, name: str, *, create: bool = True) -> GroupState | None:
        state = groups.live.get(name)
        if state is None:
            durable = groups.durable.get(name)
            if durable is None:
                if not create:
                    return None
                if len(groups.durable) >= self.limits.max_groups_per_shard:
                    raise _Refused(
                        ErrorCode.LIMIT_EXCEEDED,
                        f"this shard has {len(groups.durable)} consumer groups, the most it keeps",
                    )
                durable = groups.durable[name] = GroupDurable()
            state = GroupState.build(name, durable, self.group_limits, groups.tail)
            groups.live[name] = state
        groups.last_used[name] = _now_ms()
        return state

    def _append(self, groups: _ShardGroups, changes: list[GroupChange]) -> int | None:
        """Append changes to the group log now, after those still waiting for this
        pass's commit (so the log keeps state order); returns the last offset."""
        if groups.pending:
            self._commit(groups)
        if not changes:
            return None
        stamp = max(wall_us(), groups.last_stamp_us)
        groups.last_stamp_us = stamp
        base = groups.log.append([encode_change(c) for c in changes], timestamp_us=stamp)
        return base + len(changes) - 1

    def _commit(self, groups: _ShardGroups) -> None:
        """Append every change made since the last commit as one batch: one write for
        all the settles of a loop pass instead of one per settle."""
        changes, groups.pending = groups.pending, []
        committers, groups.committers = groups.committers, []
        settled, groups.settled = groups.settled, []
        if not changes:
            return
        try:
            last = self._append(groups, changes)
        except BaseException as exc:
            for waiter in committers:
                if not waiter.done():
                    waiter.set_exception(exc)
            self._answer_settled(settled, exc)
            return
        assert last is not None
        for waiter in committers:
            if not waiter.done():
                waiter.set_result(last)
        self._answer_settled(settled, None)

    def _answer_settled(self, settled: list[_Owed], failure: BaseException | None) -> None:
        """Queue the answers of the acks this commit wrote (or failed to write) on
        their streams, and start each stream's writer if it is not running."""
        if not settled:
            return
        now = time.perf_counter()
        metrics = self._metrics
        for owed in settled:
            proto = owed.ctx.proto
            if failure is None:
                outcome = "ok"
                frame = proto.message(CacheOk(request_id=owed.request_id))
                if owed.handed is not None and metrics is not None:
                    metrics.group_poll_ack_seconds.observe(now - owed.handed)
            else:
                outcome = "storage"
                _log.error("group request failed in storage: %s", failure)
                frame = proto.error(ErrorCode.STORAGE, f"group storage failed: {failure}")
            owed.answers.frames.append(frame)
            self._count(GroupAck, outcome)
            if self._ack_timer is not None:
                self._ack_timer.observe(now - owed.started)
            if not owed.answers.writing:
                owed.answers.writing = True
                owed.ctx.spawn(self._write_answers(owed.ctx.io, owed.answers), "group-answers")

    async def _write_answers(self, io: StreamIO, answers: _StreamAnswers) -> None:
        """Write a stream's queued ack answers, all that are queued in one write."""
        try:
            while answers.frames:
                frames, answers.frames = answers.frames, []
                try:
                    await io.write(frames[0] if len(frames) == 1 else b"".join(frames))
                finally:
                    answers.held -= len(frames)
                    answers.settle(len(frames))
        except (StreamClosedError, ConnectionClosedError):
            answers.held -= len(answers.frames)  # the client went: nobody to answer
            answers.settle(len(answers.frames))
            answers.frames.clear()
        finally:
            answers.writing = False

    async def _persist(self, groups: _ShardGroups, state: GroupState) -> None:
        """Write what the state changed, and wait until it is durable.

        The changes join this loop pass's commit: the first writer of a pass
        schedules it, everyone of the pass waits for it, then for durability per
        fsync mode (which the log shares between waiters in turn). So no settle is
        answered before its change is written (and, under on_commit, synced). Each
        writer has its own future, so a cancelled one cancels only itself."""
        changes = state.take_writes()
        groups.signal.fire()
        if not changes:
            return
        if self._replicated(groups):
            await self._durable(groups, changes)
            return
        loop = asyncio.get_running_loop()
        if not groups.pending:
            loop.call_soon(self._commit, groups)
        groups.pending.extend(changes)
        waiter = loop.create_future()
        groups.committers.append(waiter)
        last = await waiter
        await groups.log.wait_durable(last)

    def _replicated(self, groups: _ShardGroups) -> bool:
        return self.replication is not None and groups.stream.spec.replicated

    async def _durable(self, groups: _ShardGroups, changes: list[GroupChange]) -> None:
        """Make changes durable now: on a Quorum shard once a majority holds them (the
        applier writes the group log), else in the group log."""
        if self._replicated(groups):
            assert self.replication is not None
            stream = groups.stream
            groups.replicating += 1
            written = False
            try:
                await self.replication.write(stream.spec, stream.index, changes)
                written = True
            except ReplicationRefusedError as exc:
                raise _Refused(exc.code, str(exc), exc.retry) from None
            finally:
                groups.replicating -= 1
                if not written:
                    # The settle is in the in-memory states already (a claim taken,
                    # an ack recorded), yet may never commit: answering a repeat of
                    # it from them would acknowledge what no replica holds.
                    groups.stale = True
                if groups.stale and not groups.replicating:
                    self._rebuild(groups)
            return
        last = self._append(groups, changes)
        assert last is not None
        await groups.log.wait_durable(last)

    def _rebuild(self, groups: _ShardGroups) -> None:
        """Drop a Quorum shard's in-memory group states for its committed state (what
        its group log holds), once no replicated write of the shard is in flight: every
        write answered ok was applied here before it returned, so nothing acknowledged
        is forgotten; claims are not durable (their records are handed out again)."""
        assert groups.committed is not None
        groups.durable = _copied(groups.committed)
        groups.live.clear()
        groups.last_used.clear()
        groups.stale = False
        groups.signal.fire()

    def append_replicated(
        self, spec: StreamSpec, index: int, changes: list[GroupChange]
    ) -> tuple[Log, int]:
        """Append committed changes of a Quorum shard to its group log (the applier of
        replication/groups.py, its only writer); the log and the last offset written."""
        groups = self._shard_groups(spec, index)
        last = self._append(groups, changes)
        assert last is not None
        if groups.committed is not None:
            for change in changes:
                apply_change(groups.committed, change)
        return groups.log, last

    def _wants_compaction(self, groups: _ShardGroups) -> bool:
        if groups.compacting:
            return False
        size = groups.log.size_bytes
        state = groups.durable if groups.committed is None else groups.committed
        live = sum(1 + len(d.dead) + len(d.redriven) for d in state.values())
        return size > self.limits.compact_min_bytes and size > 4 * 64 * live

    async def compact(self, groups: _ShardGroups) -> int:
        """Copy the live state to the tail, then delete the segments wholly before it.
        A Quorum shard's copy is its committed state (`committed`), taken with no await
        between it and its append, so it is the state at that place in the group log."""
        groups.compacting = True
        try:
            log = groups.log
            self._commit(groups)  # this pass's changes go before the copy, as made
            # Every record before the copy has a time below `stamp`, the copy and
            # everything after it one at or above it: retention by age at `stamp`
            # removes exactly the segments wholly before the copy.
            stamp = max(wall_us(), groups.last_stamp_us + 1)
            groups.last_stamp_us = stamp
            state = groups.durable if groups.committed is None else groups.committed
            changes = snapshot_changes(state.items())
            if changes:
                log.append([encode_change(c) for c in changes], timestamp_us=stamp)
            else:
                # Nothing live: an empty-state marker keeps the tail's time at `stamp`.
                log.append([encode_change(GroupChange(Kind.DELETE, ""))], timestamp_us=stamp)
            if log.needs_sync:
                await log.sync()
            return log.apply_retention(Retention(max_age_us=0), now_us=stamp)
        finally:
            groups.compacting = False

    # -- requests -------------------------------------------------------------------

    def register(self, table: DispatchTable) -> None:
        """Every group request runs as its own task (concurrent), so a long poll holds
        back nothing else on its stream."""
        consume, manage = Action.GROUP_CONSUME, Action.GROUP_MANAGE
        table.register(
            GroupPoll,
            self._handler(self._poll, consume),
            concurrent=True,
            ready=self._poll_now,
        )
        table.register(
            GroupAck,
            self._handler(self._ack, consume),
            concurrent=True,
            ready=self._ack_now if self._acks_deferred else None,
        )
        table.register(GroupNack, self._handler(self._nack, consume), concurrent=True)
        table.register(GroupExtend, self._handler(self._extend, consume), concurrent=True)
        table.register(GroupDeadLetter, self._handler(self._dead_letter, consume), concurrent=True)
        table.register(
            GroupDeadLetters, self._handler(self._dead_letters, consume), concurrent=True
        )
        table.register(
            GroupDescribe, self._handler(self._describe_request, consume), concurrent=True
        )
        # Seek, delete, redrive and discard change what the group owes: group.manage (Q17).
        table.register(GroupSeek, self._handler(self._seek, manage), concurrent=True)
        table.register(GroupDelete, self._handler(self._delete_request, manage), concurrent=True)
        table.register(GroupRedrive, self._handler(self._redrive, manage), concurrent=True)
        table.register(GroupDiscard, self._handler(self._discard, manage), concurrent=True)

    def _handler(
        self,
        op: Callable[[_ShardGroups, R, RequestContext], Awaitable[bytes | None]],
        action: Action,
    ) -> Handler[R]:
        """The request handler around `op`: admission, refusals and storage errors
        answered as error frames, the outcome counted; `op` returns its answer
        (None: it answered itself, as polls do)."""

        async def handle(request: R, ctx: RequestContext) -> None:
            proto = ctx.proto
            outcome = "ok"
            try:
                try:
                    groups = self._admit(ctx, request, action)
                    answer = await op(groups, request, ctx)
                except _Refused as refused:
                    outcome = refused.code.wire
                    answer = proto.error(refused.code, refused.text, retry=refused.retry)
                except GroupRefusedError as refused:
                    outcome = "stale_claim" if refused.stale else "invalid_request"
                    answer = _refusal(proto, refused)
                except StorageError as exc:
                    outcome = "storage"
                    _log.error("group request failed in storage: %s", exc)
                    answer = proto.error(ErrorCode.STORAGE, f"group storage failed: {exc}")
                if answer is not None:
                    await ctx.write(answer)
            except (StreamClosedError, ConnectionClosedError):
                return
            finally:
                self._count(type(request), outcome)

        return handle

    def _ready_groups(self, ctx: RequestContext, request: GroupRequest) -> _ShardGroups | None:
        """The shard's groups for a request the ready path may take, None when the
        handler should run instead (every refusal is answered there, once)."""
        try:
            return self._admit(ctx, request, Action.GROUP_CONSUME)
        except (_Refused, StorageError):
            return None

    def _poll_now(self, request: GroupPoll, ctx: RequestContext) -> ReadyAnswer | None:
        """A poll's answer if it has records to hand out now and writes nothing
        durable (the ready path; None: the handler runs, as for every other poll)."""
        if request.reclaim or request.consumer is not None or request.max_records <= 0:
            return None  # members, reclaims and empty polls: the handler's path
        groups = self._ready_groups(ctx, request)
        if groups is None:
            return None
        state = groups.live.get(request.group)
        if state is None or state.durable.cursor is None or state.writes:
            return None  # a group's first poll writes its cursor: the handler persists it
        now = _now_ms()
        limit = min(request.max_records, POLL_MAX_RECORDS)
        conn = self._connection_seq(ctx.connection.connection)
        offers = state.offer(now, limit, conn, groups.log_start, groups.tail)
        if not offers or state.writes:
            return None  # nothing now (the handler waits), or expiry wrote: it persists
        taken = _read(groups, offers)
        if not taken:
            return None
        state.claim(
            now,
            [offer for offer, _ in taken],
            conn,
            None,
            request.visibility_ms,
            time.perf_counter(),
        )
        assert not state.writes  # the cursor exists: a claim changes nothing durable
        groups.last_used[request.group] = now
        records = [
            GroupRecord(
                offset=record.offset,
                payload=record.payload,
                attempts=offer.attempts,
                publisher=record.publisher,
                timestamp_micros=record.timestamp_us,
            )
            for offer, record in taken
        ]
        answer = ctx.proto.message(GroupRecords(records=records, request_id=request.request_id))
        self._count(GroupPoll, "ok")
        if self._metrics is not None:
            self._metrics.group_records.inc(len(records))

        def unsent() -> None:
            # The client never got these: hand them back rather than wait out the claim.
            state.release([offer.offset for offer, _ in taken])
            groups.signal.fire()

        return ReadyAnswer(answer, unsent)

    def _ack_now(self, request: GroupAck, ctx: RequestContext) -> bytes | ReadyAnswer | None:
        """An ack taken without a task (the ready path, fsync modes none and periodic):
        applied now, its change joined to this pass's commit, answered by the commit
        once written. None: the handler runs (refusals, a failed log, the bound)."""
        groups = self._ready_groups(ctx, request)
        if groups is None or groups.log.failed or self._replicated(groups):
            return None  # a Quorum shard's ack waits for its majority in the handler
        state = groups.live.get(request.group)
        if state is None or state.writes:
            return None
        answers = self._answers.get(ctx.io)
        if answers is None:
            answers = self._answers[ctx.io] = _StreamAnswers()
        if answers.held >= self._owed_bound:
            return None  # a client not reading its answers: the request bound holds it
        now = _now_ms()
        try:
            handed = state.ack(now, request.offset, groups.tail)
        except GroupRefusedError:
            return None  # refused before it changed anything: the handler answers it
        groups.last_used[request.group] = now
        changes = state.take_writes()
        groups.signal.fire()
        if not changes:
            # Nothing to write (a repeated ack): answered now, as the handler would.
            self._count(GroupAck, "ok")
            return ctx.proto.message(CacheOk(request_id=request.request_id))
        if not groups.pending:
            asyncio.get_running_loop().call_soon(self._commit, groups)
        groups.pending.extend(changes)
        answers.held += 1
        answered = asyncio.get_running_loop().create_future()
        answers.owed.append(answered)
        ctx.io.owe(answered)
        groups.settled.append(_Owed(ctx, answers, request.request_id, handed, time.perf_counter()))
        return ReadyAnswer(None)

    def _admit(self, ctx: RequestContext, request: GroupRequest, action: Action) -> _ShardGroups:
        """The shard's groups, if this principal may do `action` on the group."""
        if self._closed:
            raise _Refused(ErrorCode.DRAINING, "the broker is shutting down")
        principal = ctx.principal
        tenant, namespace, stream = request.tenant_id, request.namespace, request.stream
        if tenant != principal.tenant_id:
            raise _Refused(ErrorCode.FORBIDDEN, "forbidden: the token is for another tenant")
        problem = name_problem(request.group)
        if problem is not None:
            # The catalogue's one name rule (group names go into permission objects).
            raise _Refused(ErrorCode.INVALID_REQUEST, f"invalid group name: {problem}")
        obj = group_object(tenant, namespace, stream, request.group)
        if not principal.permissions.allows(action, obj):
            raise _Refused(ErrorCode.FORBIDDEN, f"forbidden: {action.value} on {obj}")
        spec = self._catalog.stream(tenant, namespace, stream)
        if spec is None:
            raise _Refused(
                ErrorCode.NOT_FOUND,
                f"stream not found: tenant={tenant} namespace={namespace} stream={stream}",
            )
        if not spec.durable:
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                f"stream {stream} is in memory: consumer groups need a durable stream",
            )
        if request.shard >= spec.shards:
            # Not a shard this broker leads (it has no such shard): refused, never served.
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                f"stream {stream} has {spec.shards} shard(s), not {request.shard + 1}",
            )
        refused = self._engine.read_refusal(spec, request.shard)
        if refused is not None:  # a Quorum shard: only its open, caught-up leader serves
            code, reason = refused
            raise _Refused(code, f"{code.wire}: {reason}" if reason else code.wire)
        groups = self._shard_groups(spec, request.shard)
        if groups.stale:  # until its in-flight writes settle and it is rebuilt
            code = ErrorCode.SHARD_UNAVAILABLE
            raise _Refused(code, f"{code.wire}: not_ready", RetryClass.RETRY)
        return groups

    def _live(self, groups: _ShardGroups, name: str) -> GroupState:
        state = self._state(groups, name)
        assert state is not None
        return state

    async def _settled(
        self, ctx: RequestContext, groups: _ShardGroups, state: GroupState, rid: int
    ) -> bytes:
        """Persist what a settle changed; answered with cache_ok once it is durable."""
        await self._persist(groups, state)
        return ctx.proto.message(CacheOk(request_id=rid))

    async def _ack(self, groups: _ShardGroups, request: GroupAck, ctx: RequestContext) -> bytes:
        state = self._live(groups, request.group)
        handed = state.ack(_now_ms(), request.offset, groups.tail)
        answer = await self._settled(ctx, groups, state, request.request_id)
        if handed is not None and self._metrics is not None:
            # Handed out -> acknowledged and durable (answered right after this).
            self._metrics.group_poll_ack_seconds.observe(time.perf_counter() - handed)
        return answer

    async def _nack(self, groups: _ShardGroups, request: GroupNack, ctx: RequestContext) -> bytes:
        state = self._live(groups, request.group)
        state.nack(_now_ms(), request.offset, groups.tail, request.delay_ms, request.attempts)
        return await self._settled(ctx, groups, state, request.request_id)

    async def _dead_letter(
        self, groups: _ShardGroups, request: GroupDeadLetter, ctx: RequestContext
    ) -> bytes:
        state = self._live(groups, request.group)
        state.dead_letter(_now_ms(), request.offset, groups.tail)
        return await self._settled(ctx, groups, state, request.request_id)

    async def _redrive(
        self, groups: _ShardGroups, request: GroupRedrive, ctx: RequestContext
    ) -> bytes:
        state = self._live(groups, request.group)
        state.redrive(request.offset)
        return await self._settled(ctx, groups, state, request.request_id)

    async def _discard(
        self, groups: _ShardGroups, request: GroupDiscard, ctx: RequestContext
    ) -> bytes:
        state = self._live(groups, request.group)
        state.discard(request.offset)
        return await self._settled(ctx, groups, state, request.request_id)

    async def _extend(
        self, groups: _ShardGroups, request: GroupExtend, ctx: RequestContext
    ) -> bytes:
        state = self._live(groups, request.group)
        granted = state.extend(_now_ms(), request.offset, request.attempts, request.extend_ms)
        return ctx.proto.message(GroupExtended(visible_ms=granted, request_id=request.request_id))

    async def _seek(self, groups: _ShardGroups, request: GroupSeek, ctx: RequestContext) -> bytes:
        state = self._live(groups, request.group)
        start = request.start
        target = SeekTarget(
            earliest=start == "earliest",
            latest=start == "latest",
            offset=start.offset if isinstance(start, StartOffset) else None,
        )
        position, moved = state.seek(target, request.if_new, groups.log_start, groups.tail)
        await self._persist(groups, state)
        answer = GroupPosition(offset=position, moved=moved, request_id=request.request_id)
        return ctx.proto.message(answer)

    async def _dead_letters(
        self, groups: _ShardGroups, request: GroupDeadLetters, ctx: RequestContext
    ) -> bytes:
        durable = groups.durable.get(request.group)
        offsets = sorted(durable.dead) if durable is not None else []
        return ctx.proto.message(
            GroupDeadLetterList(offsets=offsets, request_id=request.request_id)
        )

    async def _describe_request(
        self, groups: _ShardGroups, request: GroupDescribe, ctx: RequestContext
    ) -> bytes:
        return ctx.proto.message(self._describe(groups, request.group, request.request_id))

    async def _delete_request(
        self, groups: _ShardGroups, request: GroupDelete, ctx: RequestContext
    ) -> bytes:
        return ctx.proto.message(await self._delete(groups, request.group, request.request_id))

    def _describe(self, groups: _ShardGroups, name: str, rid: int) -> GroupInfo:
        durable = groups.durable.get(name)
        state = groups.live.get(name)
        return GroupInfo(
            committed=durable.cursor if durable is not None else None,
            tail=groups.tail,
            in_flight=state.in_flight if state is not None else 0,
            owed=len(state.owed) if state is not None else 0,
            dead_letters=len(durable.dead) if durable is not None else 0,
            request_id=rid,
        )

    async def _delete(self, groups: _ShardGroups, name: str, rid: int) -> GroupDeleted:
        """Remove the cursor, dead letters and in-memory state (Q15)."""
        durable = groups.durable.pop(name, None)
        state = groups.live.pop(name, None)
        groups.last_used.pop(name, None)
        existed = (durable is not None and durable.exists) or (
            state is not None and (state.busy or bool(state.owed))
        )
        groups.signal.fire()
        await self._durable(groups, [GroupChange(Kind.DELETE, name)])
        return GroupDeleted(existed=existed, request_id=rid)

    # -- polls ----------------------------------------------------------------------

    def _count(self, kind: type[Any], outcome: str) -> None:
        """Count one answered request; label children are looked up once per pair."""
        if self._metrics is None:
            return
        child = self._request_counts.get((kind, outcome))
        if child is None:
            name = str(kind.__struct_config__.tag)
            child = self._metrics.group_requests.labels(type=name, outcome=outcome)
            self._request_counts[(kind, outcome)] = child
        child.inc()

    def _connection_seq(self, connection: object) -> int:
        seq = self._connections.get(connection)
        if seq is None:
            self._next_connection += 1
            seq = self._connections[connection] = self._next_connection
        return seq

    async def _poll(self, groups: _ShardGroups, request: GroupPoll, ctx: RequestContext) -> None:
        """Answer one poll with the records it claimed (possibly none, after its wait)."""
        proto = ctx.proto
        principal = ctx.principal
        member: Member | None = None
        if request.consumer is not None:
            if not 1 <= len(request.consumer.encode()) <= MAX_CONSUMER_BYTES:
                raise _Refused(
                    ErrorCode.INVALID_REQUEST,
                    f"a consumer name is 1 to {MAX_CONSUMER_BYTES} bytes",
                )
            member = (request.consumer, principal.subject)
        conn = self._connection_seq(ctx.connection.connection)
        limit = min(request.max_records, POLL_MAX_RECORDS)
        loop = asyncio.get_running_loop()
        wait_s = min(request.wait_ms, self._config.group_max_wait_ms) / 1000
        deadline = loop.time() + wait_s
        reclaim = request.reclaim and member is not None
        while True:
            state = self._live(groups, request.group)
            now = _now_ms()
            if reclaim:
                assert member is not None
                state.reclaim(now, conn, member, request.visibility_ms)
                reclaim = False
            taken = self._take(groups, state, now, limit, conn, member, request.visibility_ms)
            await self._persist(groups, state)
            remaining = deadline - loop.time()
            if taken or limit == 0 or remaining <= 0:
                break
            next_deadline = state.next_deadline()
            if next_deadline is not None:
                remaining = min(remaining, max(0.0, (next_deadline - now) / 1000) + 0.001)
            await groups.signal.wait(remaining)
            if groups.released or groups.stale:
                break  # its shard moved away, or its states are stale: none taken
        records = [
            GroupRecord(
                offset=record.offset,
                payload=record.payload,
                attempts=offer.attempts,
                publisher=record.publisher,
                timestamp_micros=record.timestamp_us,
            )
            for offer, record in taken
        ]
        answer = proto.message(GroupRecords(records=records, request_id=request.request_id))
        try:
            await ctx.write(answer)
        except BaseException:
            # The client never got these: hand them back rather than wait out the claim.
            state.release([offer.offset for offer, _ in taken])
            groups.signal.fire()
            raise
        if self._metrics is not None:
            self._metrics.group_records.inc(len(records))

    def _take(
        self,
        groups: _ShardGroups,
        state: GroupState,
        now: int,
        limit: int,
        conn: int,
        member: Member | None,
        visibility_ms: int,
    ) -> list[tuple[Offer, Record]]:
        """Offer, read and claim in one synchronous step (no await: nobody else can
        take the same records meanwhile)."""
        if limit <= 0:
            return []
        offers = state.offer(now, limit, conn, groups.log_start, groups.tail)
        if not offers:
            return []
        taken = _read(groups, offers)
        offers_taken = [offer for offer, _ in taken]
        state.claim(now, offers_taken, conn, member, visibility_ms, time.perf_counter())
        return taken


def _copied(state: dict[str, GroupDurable]) -> dict[str, GroupDurable]:
    return {
        name: GroupDurable(d.cursor, set(d.dead), set(d.redriven), set(d.acked))
        for name, d in state.items()
    }


def _read(groups: _ShardGroups, offers: list[Offer]) -> list[tuple[Offer, Record]]:
    """The offers' records, in order, as many as fit the poll's byte budget (a first
    record bigger than the budget still goes alone)."""
    log = groups.stream.log
    assert log is not None
    taken: list[tuple[Offer, Record]] = []
    used = 0
    i = 0
    while i < len(offers):
        j = i + 1
        while j < len(offers) and offers[j].offset == offers[j - 1].offset + 1:
            j += 1
        run = offers[i:j]
        try:
            records = log.read(
                run[0].offset,
                max_records=len(run),
                max_bytes=max(POLL_MAX_BYTES - used, 0),
                end=run[-1].offset + 1,
            )
        except StorageError:
            return taken  # retention removed it meanwhile: the rest waits for the next poll
        for offer, record in zip(run, records, strict=False):
            if record.offset != offer.offset:
                return taken
            if taken and used + len(record.payload) > POLL_MAX_BYTES:
                return taken
            taken.append((offer, record))
            used += len(record.payload)
        if len(records) < len(run):
            return taken
        i = j
    return taken


def _refusal(proto: StreamProtocol, refused: GroupRefusedError) -> bytes:
    if refused.stale:
        retry = RetryClass.FATAL if refused.fatal else RetryClass.RETRY
        return proto.error(ErrorCode.STALE_CLAIM, refused.text, retry=retry)
    return proto.error(ErrorCode.INVALID_REQUEST, refused.text)
