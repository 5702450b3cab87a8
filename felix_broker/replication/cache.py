"""Replicated (Quorum) caches and counters: a cache shard's writes as a replicated log.

A cache with `consistency: Quorum` and a replication factor above 1 runs every
write of each shard through the same replication core as a Quorum stream (one
`ReplicaDriver` per cache shard per replica, the same peer messages, fencing,
quorum mark, `quorum_timeout`, promotion only of a caught-up replica). What a
cache adds is what an entry means and how it is applied:

- **An entry is one write** (`ReplicatedCacheOp`, spec/fleet.yaml): put, delete,
  put_if, delete_if, counter_add, or the leader's TTL `expire`, with the leader's
  wall clock at admission (`now_ms`). Every replica applies committed entries in
  log order to its own `CacheShard` (`CacheApplier`), so a condition is checked
  at the op's place in the log (two racing `absent` puts: the first committed
  wins, the other is answered `applied: false`), TTL deadlines are the leader's,
  and counter sums are exact.
- **The cache shard is derived state.** Its log lives under the replica's folder
  (``state/``, fsync mode none) and is rebuilt every time the replica opens (the
  folder is emptied first) from the newest snapshot (snapshot.py) and the committed
  replication log above it, so a version (the offset of the put in that log) is the
  same number on every replica, and a crash never leaves it ahead of or behind the
  replication log. The cache service serves that shard (`CacheService.adopt`).
- **Compaction**: every replica takes a snapshot of its shard once `snapshot_every`
  entries were applied since the last one (at an offset it holds durably: its
  fsynced length), written crash-safely before its replication log may drop the
  entries below it (`SnapshotDisk`: the core's `CompactLog` floor capped at the
  newest snapshot, rewritten once `compact_every` entries can go). So the log holds
  at most about `snapshot_every + compact_every` entries below what every replica
  holds, and a restart replays only the entries above the snapshot.
- **A follower behind the compacted point** (its log lost what every replica is
  said to hold: a replaced disk) cannot be shipped those records: when a ship
  starts past its log's end and the leader's `compacted` is past it too
  (`_CacheDriver.receive`), it asks the leader for its snapshot
  (`replica_snapshot_request`, at most one at a time per shard, one a second),
  installs it crash-safely (snapshot file, then an empty replication log starting
  at the snapshot's offset: `reset_log`) and reopens its replica there; the leader's
  ships resume from its compacted point, which the snapshot covers. Bound: a
  snapshot whose keys and values pass `SNAPSHOT_SHIP_MAX_BYTES` is not shipped
  (`too_large`, logged): such a follower stays behind.
- **Acknowledgement** (`CacheReplication.write`): once a majority holds the op
  durably and this replica applied it; the answer (the version written, the
  value deleted, the counter's new sum, a condition's result) is the one its
  application gave. No majority within FELIX_PUBLISH_QUORUM_TIMEOUT_MS:
  `quorum_timeout` (outcome unknown: it may still commit).
- **Reads** (get, counter_get, watch) are served only by the open leader, under
  its lease (`read_refusal`); with FELIX_QUORUM_READS=majority and
  ``lease_free_reads`` finalized, a get or counter_get is also confirmed by a
  majority read round before it is answered (`confirm_read`, reads.py). A
  replica that is not the leader answers `not_leader`; one named leader but
  still fencing or without a mark at its generation
  `shard_unavailable/not_ready`; one whose lease lapsed
  `shard_unavailable/fenced`. What it serves is what was applied, i.e.
  committed: never past the mark. Reads do not change the shard's recency order
  (eviction by the memory bound is a function of the writes alone, the same on
  every replica).
- **TTL**: only the leader expires entries, by appending `expire` ops (at most
  `CacheLimits.ttl_deletes_per_pass` per shard per pass, once a pass interval);
  an `expire` deletes the key only while it still holds the version that expired.
  Replicas never expire on their own clock, and replicated shards are never
  compacted by the cache service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from felix_broker.cache.shard import CacheLimits, CacheShard, EntryTooLargeError, now_ms
from felix_broker.catalog import CacheSpec, Catalog
from felix_broker.config import FsyncMode
from felix_broker.fleet.peer import PeerDialer, PeerOrigin, PeerProtocolError, PeerUnavailableError
from felix_broker.fleet.routing import RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_broker.storage import LogConfig
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.fleet import (
    CacheOpKind,
    CacheSnapshot,
    PeerMessage,
    ReplicaSnapshot,
    ReplicaSnapshotRequest,
    ReplicatedCacheOp,
)

from .core import Config, Effect, Entry, Message, Phase, Ship
from .disk import ReplicaDiskError
from .driver import ReplicaDriver, ReplicationRefusedError
from .manager import follow_route
from .reads import ReadRounds
from .service import Blocked, ReplicationService, peer_sender
from .snapshot import (
    SnapshotDisk,
    capture,
    encode_snapshot,
    load_newest,
    reset_log,
    restore,
    write_snapshot,
)
from .wire import wire_shard

__all__ = [
    "COMPACT_EVERY",
    "SNAPSHOT_EVERY",
    "CacheApplier",
    "CacheOutcome",
    "CacheReplication",
    "CacheShards",
    "Snapshots",
    "decode_op",
    "encode_op",
]

_log = logging.getLogger(__name__)

_SETTLING: tuple[ErrorCode, str | None] = (ErrorCode.SHARD_UNAVAILABLE, "not_ready")
_SETTLING_ERROR = (ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY, "not_ready")
SNAPSHOT_EVERY = 1024
"""Entries applied between two snapshots of a replica's cache shard (the default)."""
COMPACT_EVERY = 1024
"""Entries the replication log file drops at once, at least (the default)."""
SNAPSHOT_SHIP_MAX_BYTES = 32 * 1024 * 1024
"""Keys and values a shipped snapshot may carry (a peer frame is at most 64 MiB of JSON)."""
_CATCH_UP_INTERVAL_S = 1.0  # between two snapshot requests of one shard
# Outcomes of applied ops kept for the writers waiting on them (leader only). A writer
# takes its outcome as soon as its ack resolves; the bound only stops a leak.
_OUTCOMES_MAX = 65536

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplicatedCacheOp)


def encode_op(op: ReplicatedCacheOp) -> bytes:
    return _encoder.encode(op)


def decode_op(payload: bytes) -> ReplicatedCacheOp:
    return _decoder.decode(payload)


@dataclass(frozen=True, slots=True)
class CacheOutcome:
    """What applying one op gave: the answer its writer gets."""

    applied: bool = True
    version: int | None = None  # put: the version written; conditions: the current one
    value: bytes | None = None  # delete: the value removed
    total: int | None = None  # counter_add: the new sum
    error: tuple[ErrorCode, str] | None = None  # refused at its place in the log


class CacheShards:
    """What the cache service gives replication: its limits and eviction counter (so a
    replica's shard is bounded like any), and the seam to serve a replica's shard."""

    def __init__(
        self,
        limits: CacheLimits,
        evictions: Any,
        adopt: Callable[[CacheSpec, int, CacheShard], Awaitable[None]],
        release: Callable[[CacheSpec, int], Awaitable[None]],
    ) -> None:
        self.limits = limits
        self.evictions = evictions
        self.adopt = adopt
        self.release = release


@dataclass(slots=True)
class Snapshots:
    """Where and how often a replica snapshots its cache shard (see the module docs)."""

    folder: Path
    disk: SnapshotDisk
    every: int = SNAPSHOT_EVERY
    durable: Callable[[], int] = lambda: 0  # the replica's fsynced length (set at open)


class CacheApplier:
    """Applies committed ops to one replica's cache shard (the driver's `Applier`).

    The shard starts at every open as the snapshot `start` left it (empty without
    one) and receives every committed op from the snapshot's offset: see the module
    docs. Each applied op's outcome is kept (leader only, bounded) under the number
    `apply` returns for it, which the driver hands back to the writer
    (`Written.stream_offset`)."""

    def __init__(
        self,
        shard: CacheShard,
        leading: Callable[[], bool],
        *,
        snapshots: Snapshots | None = None,
        start: CacheSnapshot | None = None,
    ) -> None:
        if shard.log is None:
            raise ValueError("a replicated cache shard needs its log (durable storage)")
        shard.replicated = True
        self.shard = shard
        self._leading = leading
        self._applied = 0
        self._outcomes: OrderedDict[int, CacheOutcome] = OrderedDict()
        self._snapshots = snapshots
        # The replication log offset of the next entry to apply, and the generation
        # of the one before it.
        self.position = start.offset if start is not None else 0
        self._generation = start.generation if start is not None else 0
        self.snapshot_at = self.position  # the newest snapshot's offset (0: none)
        if snapshots is not None:
            snapshots.disk.floor = self.snapshot_at

    def applied_entries(
        self, entries: Sequence[Entry], records_below: int, tails: list[int] | None = None
    ) -> int:
        """The entries from the disk's base the start snapshot already holds."""
        base = self._snapshots.disk.base if self._snapshots is not None else 0
        if self.position < base:
            raise ReplicaDiskError(
                f"{self.shard.name}: the replication log is compacted to {base}, "
                f"past its snapshot at {self.position}"
            )
        return self.position - base

    async def cut(self, records: int) -> None:
        # A replicated cache applies committed ops only (never above the commit mark),
        # and the commit mark is never truncated.
        raise ValueError("a replicated cache shard never applies what a truncation cuts")

    def records_of(self, entry: Entry) -> int:
        return 0  # a cache shard's log offsets are its own: nothing to weigh

    def snapshot(self) -> CacheSnapshot:
        """The shard as applied now, at `position` (for a follower behind)."""
        return capture(self.shard, self.position, self._generation)

    def take(self, number: int | None) -> CacheOutcome | None:
        return None if number is None else self._outcomes.pop(number, None)

    async def apply(
        self, entries: Sequence[Entry], tails: list[int] | None = None
    ) -> list[int | None]:
        numbers: list[int | None] = []
        keep = self._leading()
        for entry in entries:
            if tails is not None:
                tails.append(self._applied)
            if entry.start:
                numbers.append(None)
                continue
            outcome = self._apply(decode_op(entry.payload))
            self._applied += 1
            numbers.append(self._applied)
            if keep:
                self._outcomes[self._applied] = outcome
                while len(self._outcomes) > _OUTCOMES_MAX:
                    self._outcomes.popitem(last=False)
        if entries:
            self.position += len(entries)
            self._generation = entries[-1].generation
            await self._maybe_snapshot()
        return numbers

    async def _maybe_snapshot(self) -> None:
        """Snapshot the shard once `every` entries were applied since the last one, at
        an offset this replica holds durably (else a later apply tries again)."""
        policy = self._snapshots
        if policy is None or self.position - self.snapshot_at < policy.every:
            return
        if self.position > policy.durable():
            return
        at = self.position
        data = encode_snapshot(capture(self.shard, at, self._generation))
        await asyncio.to_thread(write_snapshot, policy.folder, at, data)
        self.snapshot_at = at
        policy.disk.floor = at  # the replication log may drop what is below

    def _apply(self, op: ReplicatedCacheOp) -> CacheOutcome:
        """One op on the shard: deterministic given the shard and the op (every
        replica computes the same outcome). A storage error raises (the replica stops)."""
        shard, key, now = self.shard, op.key, op.now_ms
        kind = op.op
        try:
            if kind is CacheOpKind.PUT:
                entry = shard.put(key, op.value or b"", op.ttl_ms, now)
                return CacheOutcome(version=entry.version)
            if kind is CacheOpKind.DELETE:
                removed, _offset = shard.delete(key, now)
                return CacheOutcome(value=removed.value if removed is not None else None)
            if kind is CacheOpKind.PUT_IF:
                applied, version, _offset = shard.put_if(
                    key, op.value or b"", op.ttl_ms, op.version, now
                )
                return CacheOutcome(applied=applied, version=version)
            if kind is CacheOpKind.DELETE_IF:
                applied, version, _offset = shard.delete_if(key, op.version or 0, now)
                return CacheOutcome(applied=applied, version=version)
            if kind is CacheOpKind.COUNTER_ADD:
                total, _offset = shard.counter_add(key, op.delta or 0)
                return CacheOutcome(total=total)
            # expire: the leader's TTL delete, only of the version that expired
            current = shard.entries.get(key)
            if current is None or current.version != op.version:
                return CacheOutcome(applied=False)
            shard.delete(key, now)
            return CacheOutcome()
        except EntryTooLargeError as exc:
            return CacheOutcome(applied=False, error=(ErrorCode.LIMIT_EXCEEDED, str(exc)))
        except OverflowError as exc:
            return CacheOutcome(applied=False, error=(ErrorCode.INVALID_REQUEST, str(exc)))


class _CacheDriver(ReplicaDriver):
    """A cache replica's driver: notices a ship it cannot take because its log ends
    below what the leader says every replica holds (see the module docs)."""

    behind: Callable[[Ship], None] | None = None

    async def receive(self, message: Message) -> None:
        if (
            isinstance(message, Ship)
            and self.behind is not None
            and message.offset > self.replica.length
            and message.compacted > self.replica.length
        ):
            self.behind(message)
        await super().receive(message)


@dataclass(slots=True)
class _Replica:
    spec: CacheSpec
    index: int
    driver: ReplicaDriver
    applier: CacheApplier
    folder: Path


class CacheReplication:
    """A fleet member's replicas of Quorum cache shards: follows the routing view like
    `ReplicationManager` does for streams, sharing its `ReplicationService` (peer
    handlers: drivers are keyed by shard id, kind included) and its refusal reports."""

    def __init__(
        self,
        view: FleetView,
        catalog: Callable[[], Catalog],
        caches: CacheShards,
        dialer: PeerDialer,
        root: Path,
        config: Config,
        service: ReplicationService,
        *,
        blocked: Blocked | None = None,
        on_event: Callable[[ShardId, Effect], None] | None = None,
        snapshot_every: int | None = None,
        compact_every: int | None = None,
    ) -> None:
        self._snapshot_every = snapshot_every or SNAPSHOT_EVERY
        self._compact_every = compact_every or COMPACT_EVERY
        self._view = view
        self._catalog = catalog
        self._caches = caches
        self._dialer = dialer
        self._root = root
        self._config = config
        self._service = service
        self._blocked = blocked
        self._on_event = on_event
        self._replicas: dict[ShardId, _Replica] = {}
        self.reads: ReadRounds | None = None  # majority read rounds (set by the broker)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()  # opening, dropping and reinstalling replicas
        self._catching_up: dict[ShardId, float] = {}  # shard -> when the last ask left
        self._catch_ups: set[asyncio.Task[None]] = set()
        service.handlers[ReplicaSnapshotRequest] = self.serve_snapshot
        self.snapshots_shipped = 0
        self.snapshots_installed = 0

    @property
    def node_id(self) -> str:
        return self._view.snapshot.node_id

    def start(self) -> None:
        self._view.add_listener(lambda _old, _new: self._wake.set())
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._follow(), name="cache-replication"))
        self._tasks.append(loop.create_task(self._expiry(), name="cache-replication-ttl"))
        self._wake.set()

    async def close(self) -> None:
        tasks = [*self._tasks, *self._catch_ups]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        for shard in list(self._replicas):
            await self._drop(shard)

    def driver(self, shard: ShardId) -> ReplicaDriver | None:
        held = self._replicas.get(shard)
        return held.driver if held is not None else None

    # -- the cache service's hooks

    def read_refusal(self, spec: CacheSpec, index: int) -> tuple[ErrorCode, str | None] | None:
        """Why reads of a replicated cache shard are refused here (None: served)."""
        shard = _shard_id(spec, index)
        driver = self.driver(shard)
        refused = (ErrorCode.NOT_LEADER, None) if driver is None else driver.refusal()
        if refused is not None and refused[0] is ErrorCode.NOT_LEADER and self._named(shard):
            return _SETTLING
        return refused

    def reads_need_round(self) -> bool:
        """Whether gets and counter_gets wait for a majority read round now."""
        return self.reads is not None and self.reads.active

    async def confirm_read(self, spec: CacheSpec, index: int) -> None:
        """After a read's value was taken (`read_refusal` passed): returns once a
        majority read round confirmed this leader, when rounds are on; raises
        ReplicationRefusedError (leadership_lost) when the round failed."""
        driver = self.driver(_shard_id(spec, index))
        if self.reads is None or driver is None or not self.reads.active:
            return
        await self.reads.confirm(driver)

    async def write(self, spec: CacheSpec, index: int, op: ReplicatedCacheOp) -> CacheOutcome:
        """One write, acknowledged at the quorum mark once applied here; raises
        ReplicationRefusedError (not_leader, fenced, not_ready, quorum_timeout,
        leadership_lost)."""
        shard = _shard_id(spec, index)
        held = self._replicas.get(shard)
        if held is None:
            if self._named(shard):
                raise ReplicationRefusedError(
                    ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY, "not_ready"
                )
            raise ReplicationRefusedError(ErrorCode.NOT_LEADER, RetryClass.REDIRECT)
        try:
            written = await held.driver.append([encode_op(op)])
        except ReplicationRefusedError as exc:
            if exc.code is ErrorCode.NOT_LEADER and self._named(shard):
                raise ReplicationRefusedError(*_SETTLING_ERROR) from None
            raise
        outcome = held.applier.take(written.stream_offset)
        if outcome is None:  # applied while this replica was not leading (cannot be lost)
            raise ReplicationRefusedError(
                ErrorCode.LEADERSHIP_LOST, RetryClass.OUTCOME_UNKNOWN, "outcome_dropped"
            )
        return outcome

    # -- following the view

    def _named(self, shard: ShardId) -> bool:
        snapshot = self._view.snapshot
        route = snapshot.route(shard)
        return route is not None and route.leader == snapshot.node_id

    async def _follow(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                async with self._lock:
                    await self._reconcile(self._view.snapshot)
            except Exception:
                _log.exception("cache replication: reconciling with the routing view failed")

    async def _reconcile(self, snapshot: RoutingSnapshot) -> None:
        me = snapshot.node_id
        catalog = self._catalog()
        wanted: set[ShardId] = set()
        for shard, route in snapshot.routes.items():
            if shard.kind is not ShardKind.CACHE or me not in route.replicas:
                continue
            spec = catalog.cache(shard.tenant, shard.namespace, shard.name)
            if spec is None or not spec.replicated or shard.shard >= spec.shards:
                continue
            wanted.add(shard)
            held = self._replicas.get(shard) or await self._open(shard, spec, route.replicas)
            await follow_route(held.driver, route, me)
        for shard in set(self._replicas) - wanted:
            await self._drop(shard)

    async def _open(self, shard: ShardId, spec: CacheSpec, replicas: tuple[str, ...]) -> _Replica:
        folder = self._root / "@cache" / shard.tenant / shard.namespace / shard.name
        folder = folder / str(shard.shard)
        state = folder / "state"
        limits = self._caches.limits
        start = await asyncio.to_thread(load_newest, folder)

        def rebuild() -> CacheShard:
            # Derived: rebuilt from the snapshot and the replication log above it.
            config = LogConfig(
                segment_bytes=limits.segment_bytes,
                fsync_mode=FsyncMode.NONE,
                fsync_interval=limits.fsync_interval,
            )
            restore(state, start, config)
            return CacheShard.open(
                f"{spec.tenant_id}/{spec.namespace}/{spec.name}/{shard.shard}",
                state,
                limits=limits,
                evictions=self._caches.evictions,
                fsync_mode=FsyncMode.NONE,
            )

        cache_shard = await asyncio.to_thread(rebuild)
        members = self._view.snapshot.members

        def address_of(node: str) -> str | None:
            member = self._view.snapshot.members.get(node) or members.get(node)
            return member.peer_addr if member is not None else None

        holder: list[_CacheDriver] = []

        def leading() -> bool:
            return bool(holder) and holder[0].replica.accepts_writes

        disk = SnapshotDisk(folder, compact_every=self._compact_every)
        snapshots = Snapshots(folder, disk, self._snapshot_every)
        applier = CacheApplier(cache_shard, leading, snapshots=snapshots, start=start)
        driver = _CacheDriver.open(
            shard,
            self.node_id,
            replicas,
            disk,
            peer_sender(self._dialer, address_of, self._blocked),
            config=self._config,
            applier=applier,
            on_event=self._on_event,
        )
        assert isinstance(driver, _CacheDriver)
        holder.append(driver)
        snapshots.durable = lambda: driver.replica.synced_length
        driver.behind = lambda ship: self._behind(shard, ship)
        held = _Replica(spec, shard.shard, driver, applier, folder)
        self._replicas[shard] = held
        self._service.add(driver)
        driver.start()
        await self._caches.adopt(spec, shard.shard, cache_shard)
        return held

    # -- a follower behind the compacted point

    async def serve_snapshot(self, message: PeerMessage, origin: PeerOrigin) -> PeerMessage:
        """The peer handler of `replica_snapshot_request`: this leader's shard as
        applied now, for a follower whose log lost what every replica is said to hold."""
        assert isinstance(message, ReplicaSnapshotRequest)
        if message.sender != origin.node_id or (
            self._blocked is not None and self._blocked(origin.node_id)
        ):
            return ReplicaSnapshot(held=False)
        s = message.shard
        shard = ShardId(ShardKind(s.kind.value), s.tenant, s.namespace, s.name, s.shard)
        held = self._replicas.get(shard)
        if held is None or held.driver.replica.phase is not Phase.LEADER:
            return ReplicaSnapshot(held=False, refused="not_leader")
        generation = held.driver.replica.generation
        snapshot = held.applier.snapshot()
        size = sum(len(e.key) + len(e.value) for e in snapshot.entries)
        size += sum(len(c.key) + 8 for c in snapshot.counters)
        if size > SNAPSHOT_SHIP_MAX_BYTES:
            _log.warning(
                "%s: snapshot of %d bytes not shipped to %s (the bound is %d)",
                shard,
                size,
                origin.node_id,
                SNAPSHOT_SHIP_MAX_BYTES,
            )
            return ReplicaSnapshot(held=False, generation=generation, refused="too_large")
        self.snapshots_shipped += 1
        return ReplicaSnapshot(held=True, generation=generation, snapshot=snapshot)

    def _behind(self, shard: ShardId, ship: Ship) -> None:
        loop = asyncio.get_running_loop()
        last = self._catching_up.get(shard)
        if last is not None and (last < 0 or loop.time() - last < _CATCH_UP_INTERVAL_S):
            return  # one ask at a time (-1: running), one a second
        self._catching_up[shard] = -1.0
        task = loop.create_task(self._catch_up(shard, ship.leader), name=f"catch-up {shard}")
        self._catch_ups.add(task)
        task.add_done_callback(self._catch_ups.discard)

    async def _catch_up(self, shard: ShardId, leader: str) -> None:
        try:
            answer = await self._ask_snapshot(shard, leader)
            if answer is not None:
                async with self._lock:
                    await self._install(shard, answer)
        except Exception:
            _log.exception("cache replication: %s: catching up from a snapshot failed", shard)
        finally:
            self._catching_up[shard] = asyncio.get_running_loop().time()

    async def _ask_snapshot(self, shard: ShardId, leader: str) -> CacheSnapshot | None:
        member = self._view.snapshot.members.get(leader)
        if member is None or (self._blocked is not None and self._blocked(leader)):
            return None
        ask = ReplicaSnapshotRequest(shard=wire_shard(shard), sender=self.node_id)
        try:
            answer = await self._dialer.request(leader, member.peer_addr, ask)
        except (PeerUnavailableError, PeerProtocolError) as exc:
            _log.debug("%s: no snapshot from %s: %s", shard, leader, exc)
            return None
        if type(answer) is not ReplicaSnapshot or not answer.held or answer.snapshot is None:
            _log.info("%s: %s shipped no snapshot (%s)", shard, leader, answer)
            return None
        return answer.snapshot

    async def _install(self, shard: ShardId, snapshot: CacheSnapshot) -> None:
        """Rebuild this replica from the leader's snapshot (see the module docs)."""
        held = self._replicas.get(shard)
        if held is None or snapshot.offset <= held.driver.replica.length:
            return  # gone, or it caught up meanwhile
        replicas = held.driver.replica.replicas
        folder = held.folder
        await self._drop(shard)
        data = encode_snapshot(snapshot)

        def write() -> None:
            write_snapshot(folder, snapshot.offset, data)  # first: the log then starts there
            reset_log(folder, snapshot.offset, snapshot.generation)

        await asyncio.to_thread(write)
        self.snapshots_installed += 1
        _log.info("%s: rebuilt from the leader's snapshot at %d", shard, snapshot.offset)
        await self._open(shard, held.spec, replicas)
        self._wake.set()  # follow the route again (lease, promotion)

    async def _drop(self, shard: ShardId) -> None:
        held = self._replicas.pop(shard, None)
        if held is None:
            return
        self._service.remove(shard)
        await held.driver.close()
        await self._caches.release(held.spec, held.index)

    # -- TTL: the leader writes expiry as ops

    async def _expiry(self) -> None:
        interval = self._caches.limits.ttl_pass_interval
        while True:
            await asyncio.sleep(interval)
            for shard, held in list(self._replicas.items()):
                if held.driver.refusal() is not None:
                    continue  # only the open leader expires
                due = held.applier.shard.expired(now_ms(), self._caches.limits.ttl_deletes_per_pass)
                if not due:
                    continue
                now = now_ms()
                ops = [
                    encode_op(
                        ReplicatedCacheOp(
                            op=CacheOpKind.EXPIRE, key=key, now_ms=now, version=version
                        )
                    )
                    for key, version in due
                ]
                with contextlib.suppress(ReplicationRefusedError):
                    await held.driver.append(ops)  # refused: the next pass asks again
                _log.debug("cache replication: %s: %d expiry deletes", shard, len(ops))


def _shard_id(spec: CacheSpec, index: int) -> ShardId:
    return ShardId(ShardKind.CACHE, spec.tenant_id, spec.namespace, spec.name, index)
